//! Removals that outlive the leader that made them (`docs/ha.md`, "removals the owners have
//! not heard of").
//!
//! A remove made through the store is buried in the owners' catalogs by the remover, so a
//! later leader rebuilding its index from the owners' re-reports does not bring the key back.
//! Two kinds of removal have nobody to bury them: `RemoveByRegex`/`RemoveAll` (the master
//! frees the ranges alone, and the owners hear of it at their next ping), and a remove whose
//! remover could not reach an owner. Under HA the leader writes those to etcd as a
//! [`Removal`] record before acknowledging them; a new leader loads the records at its
//! election and refuses re-reported entries that a record covers, telling their owners the
//! ranges are free, as it does for a tombstone.
//!
//! A record says "every entry of a matching key older than `at` is gone", where `at` is a
//! version handed out at the removal: every entry the removal saw is older, every later write
//! is newer. Keys a non-forced removal had to skip (a read lease, a put in flight) are listed
//! in `kept`. A `Keys` record is a batch of plain tombstones.
//!
//! Invariants:
//! - a record is acknowledged only after etcd stored it under the leader's lease (a deposed
//!   leader's write fails), so an acknowledged removal is known to every later leader;
//! - at most [`REMOVALS_KEPT`] records are kept, in etcd and in memory (the oldest go first:
//!   the owners have long since heard of those through their pings);
//! - a record is at most [`RECORD_BYTES_MAX`] bytes (etcd refuses larger values); a removal
//!   whose record would be larger is still made, and logged as not durable.

use std::collections::HashSet;

use protocol::Version;
use regex::Regex;
use serde::{Deserialize, Serialize};

use super::tenant::in_tenant;
use super::tombstones::Tombstones;

/// Records kept in etcd and in memory.
pub const REMOVALS_KEPT: usize = 64;
/// Largest record written (etcd's default request limit is 1.5 MiB).
pub const RECORD_BYTES_MAX: usize = 1 << 20;
/// Largest pattern accepted from a record (the wire's pattern limit is larger; a record
/// holding more was not written by us).
const PATTERN_BYTES_MAX: usize = 64 << 10;

/// One removal, as stored in etcd (JSON).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Removal {
    /// The removal's version: the entries it removed are older.
    pub term: u64,
    pub seq: u64,
    pub pick: Pick,
}

/// Which keys a [`Removal`] removed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Pick {
    /// Every key of `tenant` (absent: the default one) but `kept` (`RemoveAll`).
    All {
        kept: Vec<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        tenant: Option<String>,
    },
    /// Every key of `tenant` the pattern matches but `kept` (`RemoveByRegex`); the pattern is
    /// matched against the plain key, `kept` holds held (scoped) keys.
    Regex {
        pattern: String,
        kept: Vec<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        tenant: Option<String>,
    },
    /// These keys, each at the version it was removed at (a remove its remover could not
    /// bury).
    Keys { keys: Vec<(String, u64, u64)> },
}

impl Removal {
    pub fn at(&self) -> Version {
        Version {
            term: self.term,
            seq: self.seq,
        }
    }

    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("a removal always serializes")
    }

    /// Decodes a record read from etcd; anything malformed (or a pattern that does not
    /// compile) is an error, never a panic.
    pub fn decode(bytes: &[u8]) -> Result<Removal, String> {
        if bytes.len() > RECORD_BYTES_MAX {
            return Err(format!("record of {} bytes", bytes.len()));
        }
        let r: Removal = serde_json::from_slice(bytes).map_err(|e| e.to_string())?;
        if let Pick::Regex { pattern, .. } = &r.pick {
            if pattern.len() > PATTERN_BYTES_MAX {
                return Err(format!("pattern of {} bytes", pattern.len()));
            }
            Regex::new(pattern).map_err(|e| format!("pattern: {e}"))?;
        }
        Ok(r)
    }

    /// The record's etcd key under `prefix`: zero-padded, so keys sort as versions do.
    pub fn etcd_key(&self, prefix: &str) -> String {
        format!("{prefix}{:020}-{:020}", self.term, self.seq)
    }
}

struct Compiled {
    at: Version,
    tenant: Option<String>,
    /// `None`: every key.
    re: Option<Regex>,
    kept: HashSet<String>,
}

/// The pattern removals a master knows (loaded at its election, plus its own), checked on
/// every re-reported entry.
#[derive(Default)]
pub(crate) struct Removals {
    list: Vec<Compiled>,
}

impl Removals {
    /// Learns `r`: a pattern removal joins the list (the oldest beyond [`REMOVALS_KEPT`]
    /// goes), a `Keys` removal becomes tombstones. A pattern that does not compile is
    /// skipped (`decode` refuses such records; our own patterns compiled already).
    pub fn learn(&mut self, r: &Removal, tombstones: &mut Tombstones) {
        let (re, kept, tenant) = match &r.pick {
            Pick::Keys { keys } => {
                for (k, term, seq) in keys {
                    tombstones.add(
                        k,
                        Version {
                            term: *term,
                            seq: *seq,
                        },
                    );
                }
                return;
            }
            Pick::All { kept, tenant } => (None, kept, tenant),
            Pick::Regex {
                pattern,
                kept,
                tenant,
            } => match Regex::new(pattern) {
                Ok(re) => (Some(re), kept, tenant),
                Err(_) => return,
            },
        };
        let at = r.at();
        let pos = self.list.partition_point(|c| c.at <= at);
        self.list.insert(
            pos,
            Compiled {
                at,
                tenant: tenant.clone(),
                re,
                kept: kept.iter().cloned().collect(),
            },
        );
        if self.list.len() > REMOVALS_KEPT {
            self.list.remove(0);
        }
    }

    /// Whether an entry of held (scoped) `key` at `version` was removed by a pattern removal
    /// of its tenant.
    pub fn covers(&self, key: &str, version: Version) -> bool {
        // Sorted by `at`: only the records newer than the entry can cover it.
        let from = self.list.partition_point(|c| c.at <= version);
        self.list[from..].iter().any(|c| {
            in_tenant(key, c.tenant.as_deref())
                .is_some_and(|plain| c.re.as_ref().is_none_or(|re| re.is_match(plain)))
                && !c.kept.contains(key)
        })
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.list.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(seq: u64) -> Version {
        Version { term: 7, seq }
    }

    #[test]
    fn a_pattern_removal_covers_older_matching_entries_only() {
        let mut rs = Removals::default();
        let mut ts = Tombstones::default();
        rs.learn(
            &Removal {
                term: 7,
                seq: 10,
                pick: Pick::Regex {
                    pattern: "^a-".into(),
                    kept: vec!["a-leased".into()],
                    tenant: None,
                },
            },
            &mut ts,
        );
        assert!(rs.covers("a-1", v(9)));
        assert!(!rs.covers("a-1", v(10)), "written at the removal's version");
        assert!(!rs.covers("a-1", v(11)), "written after the removal");
        assert!(!rs.covers("b-1", v(9)), "does not match");
        assert!(!rs.covers("a-leased", v(9)), "skipped by the removal");
        rs.learn(
            &Removal {
                term: 7,
                seq: 20,
                pick: Pick::All {
                    kept: vec![],
                    tenant: None,
                },
            },
            &mut ts,
        );
        assert!(rs.covers("b-1", v(19)));
        assert!(rs.covers("a-leased", v(9)), "the later removal took it");
        assert!(!rs.covers("b-1", v(21)));
    }

    #[test]
    fn a_pattern_removal_covers_its_own_tenant_only() {
        let mut rs = Removals::default();
        let mut ts = Tombstones::default();
        rs.learn(
            &Removal {
                term: 7,
                seq: 10,
                pick: Pick::Regex {
                    pattern: "^a".into(),
                    kept: vec![],
                    tenant: Some("ta".into()),
                },
            },
            &mut ts,
        );
        let scoped = protocol::tenant::scoped_key("ta", "a-1");
        assert!(
            rs.covers(&scoped, v(9)),
            "the plain key matches in its tenant"
        );
        assert!(
            !rs.covers("a-1", v(9)),
            "the default tenant's key is not its"
        );
        assert!(!rs.covers(&protocol::tenant::scoped_key("tb", "a-1"), v(9)));
        rs.learn(
            &Removal {
                term: 7,
                seq: 20,
                pick: Pick::All {
                    kept: vec![],
                    tenant: None,
                },
            },
            &mut ts,
        );
        assert!(rs.covers("b", v(19)));
        assert!(!rs.covers(&protocol::tenant::scoped_key("tb", "b"), v(19)));
        // A record of a master before tenants (no `tenant` field) is the default tenant's.
        let old = Removal::decode(br#"{"term":1,"seq":2,"pick":{"kind":"all","kept":[]}}"#);
        assert!(matches!(old.unwrap().pick, Pick::All { tenant: None, .. }));
    }

    #[test]
    fn key_removals_become_tombstones() {
        let mut rs = Removals::default();
        let mut ts = Tombstones::default();
        rs.learn(
            &Removal {
                term: 7,
                seq: 30,
                pick: Pick::Keys {
                    keys: vec![("k".into(), 7, 12)],
                },
            },
            &mut ts,
        );
        assert_eq!(rs.len(), 0);
        assert_eq!(ts.get("k"), Some(v(12)));
    }

    #[test]
    fn the_list_is_bounded_and_stays_sorted() {
        let mut rs = Removals::default();
        let mut ts = Tombstones::default();
        for seq in (1..=(REMOVALS_KEPT as u64 + 10)).rev() {
            rs.learn(
                &Removal {
                    term: 7,
                    seq: seq * 10,
                    pick: Pick::All {
                        kept: vec![],
                        tenant: None,
                    },
                },
                &mut ts,
            );
        }
        assert_eq!(rs.len(), REMOVALS_KEPT);
        assert!(rs.list.windows(2).all(|w| w[0].at <= w[1].at));
    }

    #[test]
    fn records_round_trip_and_bad_ones_are_refused() {
        let r = Removal {
            term: 3,
            seq: 4,
            pick: Pick::Regex {
                pattern: "x.*".into(),
                kept: vec!["xa".into()],
                tenant: None,
            },
        };
        assert_eq!(Removal::decode(&r.encode()).unwrap(), r);
        assert_eq!(
            r.etcd_key("p/"),
            "p/00000000000000000003-00000000000000000004"
        );
        assert!(Removal::decode(b"{").is_err());
        assert!(Removal::decode(
            br#"{"term":1,"seq":1,"pick":{"kind":"regex","pattern":"(","kept":[]}}"#
        )
        .is_err());
        assert!(Removal::decode(&vec![b' '; RECORD_BYTES_MAX + 1]).is_err());
    }
}
