//! A map from string keys to values built for tens of millions of entries: the storage of
//! the object index (`objects.rs`).
//!
//! Three arrays, no allocation per entry:
//!
//! ```text
//!   table  hashbrown::HashTable<u32>   slot numbers, found by the key's hash (4 bytes + 1
//!                                      control byte a bucket, 1.15-2.3 buckets an entry)
//!   slots  Vec<Option<Slot<V>>>        the value and where its key is (KeyRef, 8 bytes);
//!                                      a removed entry's slot goes on `free` for the next
//!   keys   Vec<u8>                     every key's bytes once, back to back, no terminator
//! ```
//!
//! A [`KeyRef`] packs a key's offset in `keys` (40 bits: 1 TiB of keys) and its length (24
//! bits; keys are at most `protocol::limits::KEY_MAX_BYTES`). A removed key's bytes become a
//! hole, kept in a list per length: the next key of that length takes it (keys of one
//! workload mostly share a length: page hashes, `prefix-NNNN`). When holes hold more bytes
//! than live keys (and over [`KEY_GARBAGE_MIN_BYTES`]), the live keys are copied into a new
//! array in slot order and the holes forgotten: amortised, each byte copied is one a removal
//! freed.
//!
//! Hashes are foldhash's, seeded per process (keys from the network cannot be chosen to
//! collide); the table keeps no hash, so a lookup compares the key bytes of the slot the
//! control byte's 7 hash bits matched, and growing the table rehashes every key (as a
//! `HashMap<String, _>` does).
//!
//! Invariants: every occupied slot's number is in `table` exactly once, under the hash of
//! its key; every vacant slot's number is in `free` exactly once; the key ranges of occupied
//! slots and the holes never overlap and lie inside `keys`.

use std::hash::BuildHasher;

use hashbrown::hash_table::{Entry, HashTable};

use super::FastMap;

use crate::limits::KEY_GARBAGE_MIN_BYTES;

const OFF_BITS: u32 = 40;
const LEN_TOP: u64 = (1 << (64 - OFF_BITS)) - 1;
const _: () = assert!(protocol::limits::KEY_MAX_BYTES as u64 <= LEN_TOP);

/// Where a key's bytes are in the key array: offset and length in one word.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
struct KeyRef(u64);

impl KeyRef {
    fn new(off: u64, len: usize) -> KeyRef {
        assert!(off < 1 << OFF_BITS, "key array over 1 TiB");
        KeyRef(off | (len as u64) << OFF_BITS)
    }

    fn off(self) -> usize {
        (self.0 & ((1 << OFF_BITS) - 1)) as usize
    }

    fn len(self) -> usize {
        (self.0 >> OFF_BITS) as usize
    }
}

/// Every key's bytes, back to back (module docs).
#[derive(Default)]
struct Keys {
    bytes: Vec<u8>,
    /// Freed ranges by length, each an offset.
    holes: FastMap<u32, Vec<u64>>,
    /// Bytes in `holes`.
    garbage: u64,
}

impl Keys {
    fn get(&self, k: KeyRef) -> &str {
        let b = &self.bytes[k.off()..k.off() + k.len()];
        debug_assert!(std::str::from_utf8(b).is_ok());
        // SAFETY: every range a `KeyRef` names was copied from a `&str` by `Keys::add` (or
        // moved whole by `compact`), and nothing writes inside it while the ref lives.
        unsafe { std::str::from_utf8_unchecked(b) }
    }

    fn add(&mut self, key: &str) -> KeyRef {
        let len = key.len();
        let hole = match self.garbage {
            0 => None,
            _ => self.holes.get_mut(&(len as u32)).and_then(Vec::pop),
        };
        if let Some(off) = hole {
            self.garbage -= len as u64;
            let at = off as usize;
            self.bytes[at..at + len].copy_from_slice(key.as_bytes());
            return KeyRef::new(off, len);
        }
        let off = self.bytes.len() as u64;
        self.bytes.extend_from_slice(key.as_bytes());
        KeyRef::new(off, len)
    }

    fn free(&mut self, k: KeyRef) {
        if k.len() == 0 {
            return;
        }
        self.holes
            .entry(k.len() as u32)
            .or_default()
            .push(k.off() as u64);
        self.garbage += k.len() as u64;
    }

    fn live(&self) -> u64 {
        self.bytes.len() as u64 - self.garbage
    }
}

struct Slot<V> {
    key: KeyRef,
    val: V,
}

/// The entries of an [`Index`], in slot order.
pub(crate) struct Iter<'a, V> {
    slots: std::slice::Iter<'a, Option<Slot<V>>>,
    keys: &'a Keys,
}

impl<'a, V> Iterator for Iter<'a, V> {
    type Item = (&'a str, &'a V);

    fn next(&mut self) -> Option<Self::Item> {
        let s = self.slots.by_ref().flatten().next()?;
        Some((self.keys.get(s.key), &s.val))
    }
}

/// The map (module docs).
pub(crate) struct Index<V> {
    table: HashTable<u32>,
    slots: Vec<Option<Slot<V>>>,
    free: Vec<u32>,
    keys: Keys,
    hasher: foldhash::fast::RandomState,
}

impl<V> Default for Index<V> {
    fn default() -> Self {
        Index {
            table: HashTable::new(),
            slots: Vec::new(),
            free: Vec::new(),
            keys: Keys::default(),
            hasher: foldhash::fast::RandomState::default(),
        }
    }
}

/// The occupied slot `i` (the table only holds those).
fn slot<V>(slots: &[Option<Slot<V>>], i: u32) -> &Slot<V> {
    slots[i as usize]
        .as_ref()
        .expect("the table names only occupied slots")
}

impl<V> Index<V> {
    pub fn len(&self) -> usize {
        self.table.len()
    }

    fn hash(&self, key: &str) -> u64 {
        self.hasher.hash_one(key.as_bytes())
    }

    fn find(&self, key: &str) -> Option<u32> {
        let Index {
            table, slots, keys, ..
        } = self;
        let h = self.hash(key);
        table
            .find(h, |&i| keys.get(slot(slots, i).key) == key)
            .copied()
    }

    pub fn get(&self, key: &str) -> Option<&V> {
        let i = self.find(key)?;
        Some(&slot(&self.slots, i).val)
    }

    pub fn get_mut(&mut self, key: &str) -> Option<&mut V> {
        let i = self.find(key)?;
        self.slots[i as usize].as_mut().map(|s| &mut s.val)
    }

    /// Puts `val` under `key`, replacing (and returning) the value it had; returns the value
    /// now held too.
    pub fn insert(&mut self, key: &str, val: V) -> (&mut V, Option<V>) {
        let h = self.hash(key);
        let Index {
            table,
            slots,
            free,
            keys,
            hasher,
        } = self;
        let entry = table.entry(
            h,
            |&i| keys.get(slot(slots, i).key) == key,
            |&i| hasher.hash_one(keys.get(slot(slots, i).key).as_bytes()),
        );
        let (i, old) = match entry {
            Entry::Occupied(o) => {
                let i = *o.get();
                let s = slots[i as usize].as_mut().expect("occupied");
                (i, Some(std::mem::replace(&mut s.val, val)))
            }
            Entry::Vacant(v) => {
                let k = keys.add(key);
                let s = Some(Slot { key: k, val });
                let i = match free.pop() {
                    Some(i) => {
                        slots[i as usize] = s;
                        i
                    }
                    None => {
                        let i = u32::try_from(slots.len()).expect("under 2^32 objects");
                        slots.push(s);
                        i
                    }
                };
                v.insert(i);
                (i, None)
            }
        };
        let s = self.slots[i as usize].as_mut().expect("just filled");
        (&mut s.val, old)
    }

    pub fn remove(&mut self, key: &str) -> Option<V> {
        let h = self.hash(key);
        let Index {
            table, slots, keys, ..
        } = self;
        let Ok(o) = table.find_entry(h, |&i| keys.get(slot(slots, i).key) == key) else {
            return None;
        };
        let (i, _) = o.remove();
        Some(self.vacate(i))
    }

    /// Empties slot `i` (already out of the table): its key becomes a hole, its number free.
    fn vacate(&mut self, i: u32) -> V {
        let s = self.slots[i as usize].take().expect("occupied");
        self.keys.free(s.key);
        self.free.push(i);
        self.maybe_compact();
        s.val
    }

    /// Keeps the entries `f` accepts; `f` may change them. `gone` sees each dropped one.
    pub fn retain(
        &mut self,
        mut f: impl FnMut(&str, &mut V) -> bool,
        mut gone: impl FnMut(&str, V),
    ) {
        for i in 0..self.slots.len() {
            let Some(s) = self.slots[i].as_mut() else {
                continue;
            };
            if f(self.keys.get(s.key), &mut s.val) {
                continue;
            }
            let k = s.key;
            let h = self.hash(self.keys.get(k));
            let i = i as u32;
            if let Ok(o) = self.table.find_entry(h, |&j| j == i) {
                o.remove();
            }
            let s = self.slots[i as usize].take().expect("occupied");
            gone(self.keys.get(k), s.val);
            self.keys.free(k);
            self.free.push(i);
        }
        self.maybe_compact();
    }

    pub fn iter(&self) -> Iter<'_, V> {
        Iter {
            slots: self.slots.iter(),
            keys: &self.keys,
        }
    }

    pub fn values(&self) -> impl Iterator<Item = &V> + '_ {
        self.slots.iter().flatten().map(|s| &s.val)
    }

    /// Copies the live keys into a new array when holes outweigh them (module docs).
    fn maybe_compact(&mut self) {
        let k = &self.keys;
        if k.garbage < KEY_GARBAGE_MIN_BYTES || k.garbage <= k.live() {
            return;
        }
        let mut bytes = Vec::with_capacity(k.live() as usize);
        for s in self.slots.iter_mut().flatten() {
            let off = bytes.len() as u64;
            bytes.extend_from_slice(&k.bytes[s.key.off()..s.key.off() + s.key.len()]);
            s.key = KeyRef::new(off, s.key.len());
        }
        self.keys = Keys {
            bytes,
            ..Keys::default()
        };
        // Vacant slots at the end give their memory back too.
        while matches!(self.slots.last(), Some(None)) {
            self.slots.pop();
        }
        let n = self.slots.len() as u32;
        self.free.retain(|&i| i < n);
        self.slots
            .shrink_to(self.slots.len().max(self.slots.capacity() / 2));
    }

    /// Checks the invariants of the module docs (tests).
    #[cfg(test)]
    pub fn check(&self) {
        let occupied = self.slots.iter().flatten().count();
        assert_eq!(occupied, self.table.len());
        assert_eq!(occupied + self.free.len(), self.slots.len());
        for (k, _) in self.iter() {
            assert!(self.find(k).is_some(), "{k:?} not found");
        }
        let mut ranges: Vec<(usize, usize)> =
            self.slots
                .iter()
                .flatten()
                .map(|s| (s.key.off(), s.key.len()))
                .chain(
                    self.keys.holes.iter().flat_map(|(&len, offs)| {
                        offs.iter().map(move |&o| (o as usize, len as usize))
                    }),
                )
                .filter(|&(_, len)| len > 0)
                .collect();
        ranges.sort_unstable();
        for w in ranges.windows(2) {
            assert!(w[0].0 + w[0].1 <= w[1].0, "overlapping keys {w:?}");
        }
        if let Some(&(o, l)) = ranges.last() {
            assert!(o + l <= self.keys.bytes.len());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    use proptest::prelude::*;

    #[derive(Debug, Clone)]
    enum Op {
        Insert(u16, u32),
        Remove(u16),
        Retain(u32),
    }

    fn key(k: u16) -> String {
        // Lengths from 0 to 12 bytes, so holes of several lengths are reused and left.
        format!("{:.*}", (k % 13) as usize, format!("k{k}-xxxxxxxxxxxx"))
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            4 => (0u16..300, any::<u32>()).prop_map(|(k, v)| Op::Insert(k, v)),
            3 => (0u16..300).prop_map(Op::Remove),
            1 => (2u32..5).prop_map(Op::Retain),
        ]
    }

    proptest! {
        /// The index behaves as a `HashMap` under any mix of inserts, removes and retains.
        #[test]
        fn behaves_as_a_hash_map(ops in proptest::collection::vec(op(), 1..400)) {
            let mut ix = Index::<u32>::default();
            let mut model = HashMap::<String, u32>::new();
            for op in ops {
                match op {
                    Op::Insert(k, v) => {
                        let (now, old) = ix.insert(&key(k), v);
                        assert_eq!(*now, v);
                        assert_eq!(old, model.insert(key(k), v));
                    }
                    Op::Remove(k) => assert_eq!(ix.remove(&key(k)), model.remove(&key(k))),
                    Op::Retain(m) => {
                        let mut dropped = Vec::new();
                        ix.retain(|_, v| { *v = v.wrapping_add(1); *v % m != 0 },
                                  |k, v| dropped.push((k.to_string(), v)));
                        let mut want = Vec::new();
                        model.retain(|k, v| {
                            *v = v.wrapping_add(1);
                            let keep = *v % m != 0;
                            if !keep { want.push((k.clone(), *v)); }
                            keep
                        });
                        dropped.sort();
                        want.sort();
                        assert_eq!(dropped, want);
                    }
                }
                ix.check();
                assert_eq!(ix.len(), model.len());
            }
            for (k, v) in &model {
                assert_eq!(ix.get(k), Some(v));
            }
            let mut got: Vec<_> = ix.iter().map(|(k, v)| (k.to_string(), *v)).collect();
            let mut want: Vec<_> = model.into_iter().collect();
            got.sort();
            want.sort();
            assert_eq!(got, want);
        }
    }

    #[test]
    fn compaction_keeps_every_key() {
        let mut ix = Index::<u64>::default();
        // Keys of changing lengths, so holes are not reused and garbage builds up.
        for round in 0..4u64 {
            for i in 0..40_000u64 {
                let k = format!("{}-{i}", "r".repeat(round as usize + 1));
                ix.insert(&k, i);
            }
            if round < 3 {
                let pre = "r".repeat(round as usize + 1);
                ix.retain(|k, _| !k.starts_with(&format!("{pre}-")), |_, _| {});
            }
        }
        ix.check();
        assert_eq!(ix.len(), 40_000);
        assert!(ix.keys.bytes.len() < 2 * 40_000 * 12, "compacted");
        assert_eq!(ix.get("rrrr-39999"), Some(&39_999));
    }
}
