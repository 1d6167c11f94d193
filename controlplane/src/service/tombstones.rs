//! Versions of writes and the master's tombstones of removed keys (`docs/ha.md`, "versions
//! and tombstones").
//!
//! Every put or upsert the master starts gets a [`Version`] `(term, seq)`: `term` is the HA
//! election's etcd revision (or, without HA, the master's start time in ms), `seq` counts
//! within the term. Writers record the version in the owners' catalogs; owners re-report it.
//! When a key leaves the index (removed, evicted, revoked, discarded), the master keeps a
//! tombstone `key -> version` so that an owner re-reporting that version, or an older one,
//! later in the term (its re-mount came after the removal) does not bring it back.
//!
//! Invariants:
//! - versions handed out by one master only grow, and a new term's are above every earlier
//!   term's (etcd revisions grow; a restarted master's clock is assumed to);
//! - at most [`TOMBSTONES_MAX`] tombstones; beyond that the oldest version is forgotten.

use std::collections::BTreeSet;

use protocol::Version;

use super::FastMap;

/// Tombstones the master keeps. The owners keep their own (`CATALOG_TOMBSTONES_MAX` each),
/// which are what carries a removal across a failover; these only cover owners re-mounting
/// late within a term, so recent history is enough. Each costs the key twice plus about 100
/// bytes: with 64-byte keys, about 15 MiB at most.
pub const TOMBSTONES_MAX: usize = 1 << 16;

#[derive(Default)]
pub(crate) struct Tombstones {
    by_key: FastMap<String, Version>,
    by_version: BTreeSet<(Version, String)>,
}

impl Tombstones {
    /// The version `key` was last removed at, if remembered.
    pub fn get(&self, key: &str) -> Option<Version> {
        self.by_key.get(key).copied()
    }

    /// Remembers that `key` left the index at `version` (a newer tombstone wins).
    pub fn add(&mut self, key: &str, version: Version) {
        match self.by_key.get_mut(key) {
            Some(v) if *v >= version => return,
            Some(v) => {
                self.by_version.remove(&(*v, key.to_string()));
                *v = version;
            }
            None => {
                self.by_key.insert(key.to_string(), version);
            }
        }
        self.by_version.insert((version, key.to_string()));
        while self.by_key.len() > TOMBSTONES_MAX {
            let Some((_, k)) = self.by_version.pop_first() else {
                break;
            };
            self.by_key.remove(&k);
        }
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.by_key.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_newest_removal_is_kept() {
        let v = |seq| Version { term: 3, seq };
        let mut t = Tombstones::default();
        t.add("k", v(5));
        t.add("k", v(2));
        assert_eq!(t.get("k"), Some(v(5)));
        t.add("k", v(9));
        assert_eq!(t.get("k"), Some(v(9)));
        assert_eq!(t.len(), 1);
        assert_eq!(t.by_version.len(), 1);
        assert_eq!(t.get("other"), None);
    }
}
