//! The catalog of a served memory table: which committed object sits at which address.
//!
//! The data plane never interprets keys on the byte path, yet after a master restart the
//! master's index is empty and only the processes that own the bytes can say what they hold.
//! So every served table ([`ServedMemory`](crate::transport::server::ServedMemory)) keeps a
//! catalog, `start address -> (key, length, hard_pin)`, that the writer of an object fills
//! as part of its put (the `CATALOG_PUT` request, after the replica's WRITE on the same
//! connection) and the owner reports back with `ReMountSegment` when the master asks for a
//! re-mount. `docs/recovery.md` tells the whole story.
//!
//! A record on the wire (the payload of `CATALOG_PUT`, little-endian):
//!
//! ```text
//!  0                               8               12              16
//!  +-------------------------------+---------------+---------------+------------------+
//!  | object_len (u64)              | flags (u32)   | reserved = 0  | key (UTF-8, rest)|
//!  +-------------------------------+---------------+---------------+------------------+
//!  flags: bit 0 = hard pin; every other bit 0.   key: 1 ..= KEY_MAX_BYTES bytes
//! ```
//!
//! Invariants:
//! - entries never overlap: an insert first removes every entry overlapping its range, so a
//!   reused range replaces what was there and the catalog holds at most one entry per byte
//!   of served memory (its size is bounded by the segment, not by a separate limit);
//! - every entry lies inside memory that was registered when it was inserted; unregistering
//!   a buffer drops the entries inside it;
//! - each entry carries the catalog's insertion sequence number, so a removal notice that
//!   was decided before the entry existed (see [`Catalog::forget`]) cannot drop it.
//!
//! Locking: one small mutex. It is not on the byte path: a put touches it once (one insert),
//! not per byte, and the owner touches it once per ping (freed ranges) and once per re-mount
//! (snapshot). "Nothing on the data path takes a lock" is about READ and WRITE payloads, which
//! never look at the catalog.

use std::collections::BTreeMap;
use std::sync::Mutex;

use crate::limits::{CATALOG_RECORD_HEADER_BYTES, CATALOG_RECORD_MAX_BYTES};
use crate::TeError;

/// `flags` bit of a record: the object is hard-pinned (never evicted).
pub const CATALOG_FLAG_HARD_PIN: u32 = 1;

/// One committed object of the catalog.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CatalogEntry {
    pub addr: u64,
    pub len: u64,
    pub key: String,
    pub hard_pin: bool,
}

/// A decoded `CATALOG_PUT` payload.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CatalogRecord<'a> {
    pub len: u64,
    pub hard_pin: bool,
    pub key: &'a str,
}

impl CatalogRecord<'_> {
    /// The wire form (see the module docs).
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(CATALOG_RECORD_HEADER_BYTES + self.key.len());
        out.extend_from_slice(&self.len.to_le_bytes());
        let flags = if self.hard_pin {
            CATALOG_FLAG_HARD_PIN
        } else {
            0
        };
        out.extend_from_slice(&flags.to_le_bytes());
        out.extend_from_slice(&0u32.to_le_bytes());
        out.extend_from_slice(self.key.as_bytes());
        out
    }

    /// Decodes a payload. Errors (`InvalidArgument`): shorter than the fixed part, longer
    /// than [`CATALOG_RECORD_MAX_BYTES`], unknown flags, a reserved field not 0, an empty key,
    /// a key that is not UTF-8, or an object length of 0.
    pub fn decode(b: &[u8]) -> Result<CatalogRecord<'_>, TeError> {
        if b.len() <= CATALOG_RECORD_HEADER_BYTES || b.len() as u64 > CATALOG_RECORD_MAX_BYTES {
            return Err(TeError::InvalidArgument);
        }
        let (fixed, key) = b.split_at(CATALOG_RECORD_HEADER_BYTES);
        let mut len = [0u8; 8];
        len.copy_from_slice(&fixed[0..8]);
        let mut flags = [0u8; 4];
        flags.copy_from_slice(&fixed[8..12]);
        let flags = u32::from_le_bytes(flags);
        let reserved = &fixed[12..16];
        if flags & !CATALOG_FLAG_HARD_PIN != 0 || reserved != [0; 4] {
            return Err(TeError::InvalidArgument);
        }
        let len = u64::from_le_bytes(len);
        let key = std::str::from_utf8(key).map_err(|_| TeError::InvalidArgument)?;
        if len == 0 {
            return Err(TeError::InvalidArgument);
        }
        Ok(CatalogRecord {
            len,
            hard_pin: flags & CATALOG_FLAG_HARD_PIN != 0,
            key,
        })
    }
}

#[derive(Debug)]
struct Entry {
    len: u64,
    key: Box<str>,
    hard_pin: bool,
    /// Insertion sequence number (see [`Catalog::mark`]).
    seq: u64,
}

#[derive(Debug, Default)]
struct Inner {
    by_addr: BTreeMap<u64, Entry>,
    /// Sequence number of the last insert.
    seq: u64,
}

impl Inner {
    /// Removes the entries overlapping `[addr, addr + len)` whose sequence number is at most
    /// `upto`; returns how many.
    fn remove_overlapping(&mut self, addr: u64, len: u64, upto: u64) -> usize {
        let end = addr.saturating_add(len);
        let mut doomed: Vec<u64> = Vec::new();
        // Entries never overlap, so only the last one starting before `addr` can reach into
        // the range; every entry starting inside it overlaps it.
        if let Some((&a, e)) = self.by_addr.range(..addr).next_back() {
            if a.saturating_add(e.len) > addr && e.seq <= upto {
                doomed.push(a);
            }
        }
        doomed.extend(
            self.by_addr
                .range(addr..end)
                .filter(|(_, e)| e.seq <= upto)
                .map(|(&a, _)| a),
        );
        for a in &doomed {
            self.by_addr.remove(a);
        }
        doomed.len()
    }
}

/// See the module docs.
#[derive(Debug, Default)]
pub struct Catalog {
    inner: Mutex<Inner>,
}

impl Catalog {
    pub fn new() -> Catalog {
        Catalog::default()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // Every update leaves the map consistent before it can panic (no user code runs
        // under the lock), so a poisoned lock is still usable.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Records that `key` (`len` bytes) is committed at `addr`, replacing every entry that
    /// overlaps `[addr, addr + len)`. The caller has checked the range against registered
    /// memory.
    pub fn insert(&self, addr: u64, len: u64, key: &str, hard_pin: bool) {
        let mut inner = self.lock();
        inner.remove_overlapping(addr, len, u64::MAX);
        inner.seq += 1;
        let seq = inner.seq;
        inner.by_addr.insert(
            addr,
            Entry {
                len,
                key: key.into(),
                hard_pin,
                seq,
            },
        );
    }

    /// The sequence number of the last insert so far. Take it before asking the master which
    /// ranges it freed; then [`Catalog::forget`] with it drops only entries that existed
    /// before the question was asked (a later insert into a freed range is a new object).
    pub fn mark(&self) -> u64 {
        self.lock().seq
    }

    /// Drops the entries overlapping `[addr, addr + len)` inserted no later than `mark`
    /// (`u64::MAX`: whatever their age); returns how many.
    pub fn forget(&self, addr: u64, len: u64, mark: u64) -> usize {
        self.lock().remove_overlapping(addr, len, mark)
    }

    /// The entries starting inside `[base, base + len)`, in address order.
    pub fn entries_in(&self, base: u64, len: u64) -> Vec<CatalogEntry> {
        let end = base.saturating_add(len);
        self.lock()
            .by_addr
            .range(base..end)
            .map(|(&addr, e)| CatalogEntry {
                addr,
                len: e.len,
                key: e.key.to_string(),
                hard_pin: e.hard_pin,
            })
            .collect()
    }

    /// Every entry, in address order.
    pub fn entries(&self) -> Vec<CatalogEntry> {
        self.entries_in(0, u64::MAX)
    }

    pub fn len(&self) -> usize {
        self.lock().by_addr.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(c: &Catalog) -> Vec<(u64, String)> {
        c.entries().into_iter().map(|e| (e.addr, e.key)).collect()
    }

    #[test]
    fn records_round_trip_and_bad_ones_are_refused() {
        let r = CatalogRecord {
            len: 4096,
            hard_pin: true,
            key: "k/1",
        };
        let b = r.encode();
        assert_eq!(b.len(), 16 + 3);
        assert_eq!(&b[0..8], &4096u64.to_le_bytes());
        assert_eq!(&b[8..12], &1u32.to_le_bytes());
        assert_eq!(CatalogRecord::decode(&b), Ok(r));
        let bad = |f: &dyn Fn(&mut Vec<u8>)| {
            let mut x = b.clone();
            f(&mut x);
            CatalogRecord::decode(&x).is_err()
        };
        assert!(bad(&|x| x.truncate(16)), "empty key");
        assert!(bad(&|x| x[8] = 2), "unknown flag");
        assert!(bad(&|x| x[13] = 1), "reserved");
        assert!(bad(&|x| x[0..8].fill(0)), "zero length");
        assert!(bad(&|x| x.push(0xff)), "not UTF-8");
        let huge = "k".repeat(protocol::limits::KEY_MAX_BYTES + 1);
        let long = CatalogRecord {
            len: 1,
            hard_pin: false,
            key: &huge,
        };
        assert!(CatalogRecord::decode(&long.encode()).is_err());
        let max = "k".repeat(protocol::limits::KEY_MAX_BYTES);
        let ok = CatalogRecord {
            len: 1,
            hard_pin: false,
            key: &max,
        };
        assert_eq!(CatalogRecord::decode(&ok.encode()), Ok(ok));
    }

    #[test]
    fn inserts_replace_what_they_overlap() {
        let c = Catalog::new();
        c.insert(100, 50, "a", false);
        c.insert(200, 50, "b", false);
        c.insert(300, 50, "c", true);
        // Overlaps the tail of a and the head of b.
        c.insert(140, 70, "d", false);
        assert_eq!(
            keys(&c),
            vec![(140, "d".into()), (300, "c".into())],
            "a and b replaced"
        );
        // Same start, same range: replaced.
        c.insert(300, 50, "e", false);
        assert_eq!(c.entries()[1].key, "e");
        assert!(!c.entries()[1].hard_pin);
        // Adjacent ranges do not overlap.
        c.insert(350, 10, "f", false);
        c.insert(130, 10, "g", false);
        assert_eq!(c.len(), 4);
        assert_eq!(c.entries_in(135, 200).len(), 2, "starts inside [135, 335)");
    }

    #[test]
    fn forget_respects_the_mark() {
        let c = Catalog::new();
        c.insert(0, 10, "old", false);
        let mark = c.mark();
        // The range was freed and reused by a new put after the mark was taken.
        c.insert(20, 10, "new", false);
        assert_eq!(c.forget(0, 30, mark), 1);
        assert_eq!(keys(&c), vec![(20, "new".into())]);
        assert_eq!(c.forget(25, 1, u64::MAX), 1);
        assert!(c.is_empty());
    }
}
