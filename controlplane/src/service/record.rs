//! The compact form of one object's metadata ([`Object`]), as the index holds it.
//!
//! A master may hold tens of millions of objects, so an object is 96 bytes, laid out as:
//!
//! ```text
//!   version       16  term, seq (u64 each)
//!   replicas      32  one replica inline (the usual case), or a Vec of them
//!   rare           8  Option<Box<Rare>>: soft pin, lease group, disk hits, tenant charge
//!   packed        36  bytes, little-endian fields:
//!                       0..5   last_read_ms        40-bit milliseconds
//!                       5..10  put_start_ms        40-bit milliseconds
//!                      10..15  read_lease_until    40-bit milliseconds
//!                      15..20  read_window_until   40-bit milliseconds
//!                      20..25  probe_lease_until   40-bit milliseconds
//!                      25..31  size                48-bit bytes
//!                      31..35  writer              u32, an id of the index's writer table
//!                      35      flags               bit 0 hard pin, bits 1-2 announced medium
//!   (padding 4)
//! ```
//!
//! Times are the master's monotonic milliseconds (`crate::clock`, starting at 1,000 when it
//! starts), so 40 bits last 34 years of uptime; a time at or past 2^40 - 1 (a lease of an
//! absurd ttl, saturated to `u64::MAX` by the code that sets it) reads back as `u64::MAX`,
//! which keeps every comparison with a real `now` as it was. A size is at most 2^48 - 1
//! bytes (256 TiB: more than any segment holds; [`Object::new`] asserts it). The writer is
//! the client whose put is in flight or completed last, interned in the index's writer table
//! (`index.rs`), so an object carries 4 bytes for the 16 of a UUID.
//!
//! What is rare in a large index goes behind one pointer ([`Rare`]): a soft pin, a lease
//! group, disk hits and a tenant charge. An object without any of them has none allocated;
//! setting one back to its default frees the box when all are.

use protocol::{ReplicaStatus, Version};

use super::object::{GroupMember, SoftPin};
use super::segments::SegRef;
use crate::alloc::Span;
use crate::events::Medium;
use crate::limits::OBJECT_SIZE_MAX_BYTES;

pub(crate) struct Replica {
    pub seg: SegRef,
    pub span: Span,
    pub status: ReplicaStatus,
    /// On a disk segment (`docs/tiering.md`): not charged to its tenant's quota, which
    /// weighs memory.
    pub on_disk: bool,
}

/// An object's replicas: one inline, or several on the heap. Reads go through `Deref` to a
/// slice; the few changes have methods of their own.
pub(crate) enum Replicas {
    One(Replica),
    Many(Vec<Replica>),
}

const _: () = assert!(std::mem::size_of::<Replicas>() == 32);

impl Default for Replicas {
    fn default() -> Self {
        Replicas::Many(Vec::new())
    }
}

impl std::ops::Deref for Replicas {
    type Target = [Replica];

    fn deref(&self) -> &[Replica] {
        match self {
            Replicas::One(r) => std::slice::from_ref(r),
            Replicas::Many(v) => v,
        }
    }
}

impl std::ops::DerefMut for Replicas {
    fn deref_mut(&mut self) -> &mut [Replica] {
        match self {
            Replicas::One(r) => std::slice::from_mut(r),
            Replicas::Many(v) => v,
        }
    }
}

impl From<Vec<Replica>> for Replicas {
    fn from(mut v: Vec<Replica>) -> Self {
        match v.len() {
            1 => Replicas::One(v.pop().expect("one replica")),
            _ => Replicas::Many(v),
        }
    }
}

impl Replicas {
    fn into_vec(self) -> Vec<Replica> {
        match self {
            Replicas::One(r) => vec![r],
            Replicas::Many(v) => v,
        }
    }

    /// Changes the replicas as a `Vec`, then goes back to the compact form.
    fn with_vec<T>(&mut self, f: impl FnOnce(&mut Vec<Replica>) -> T) -> T {
        let mut v = std::mem::take(self).into_vec();
        let out = f(&mut v);
        *self = Replicas::from(v);
        out
    }

    pub fn push(&mut self, r: Replica) {
        match self {
            Replicas::Many(v) if !v.is_empty() => v.push(r),
            Replicas::Many(_) => *self = Replicas::One(r),
            Replicas::One(_) => self.with_vec(|v| v.push(r)),
        }
    }

    pub fn swap_remove(&mut self, at: usize) -> Replica {
        self.with_vec(|v| v.swap_remove(at))
    }

    pub fn retain(&mut self, f: impl FnMut(&Replica) -> bool) {
        self.with_vec(|v| v.retain(f))
    }
}

impl<'a> IntoIterator for &'a Replicas {
    type Item = &'a Replica;
    type IntoIter = std::slice::Iter<'a, Replica>;

    fn into_iter(self) -> Self::IntoIter {
        self.iter()
    }
}

impl<'a> IntoIterator for &'a mut Replicas {
    type Item = &'a mut Replica;
    type IntoIter = std::slice::IterMut<'a, Replica>;

    fn into_iter(self) -> Self::IntoIter {
        self.iter_mut()
    }
}

impl IntoIterator for Replicas {
    type Item = Replica;
    type IntoIter = std::vec::IntoIter<Replica>;

    fn into_iter(self) -> Self::IntoIter {
        self.into_vec().into_iter()
    }
}

/// What few objects of a large index have (module docs).
#[derive(Default)]
struct Rare {
    soft_pin: Option<SoftPin>,
    group: Option<GroupMember>,
    disk_hits: u32,
    charge: u64,
}

impl Rare {
    fn is_default(&self) -> bool {
        self.soft_pin.is_none() && self.group.is_none() && self.disk_hits == 0 && self.charge == 0
    }
}

/// Largest time a 40-bit field holds; it reads back as `u64::MAX`.
const TIME_SATURATED: u64 = (1 << 40) - 1;

const LAST_READ: usize = 0;
const PUT_START: usize = 5;
const READ_LEASE: usize = 10;
const READ_WINDOW: usize = 15;
const PROBE_LEASE: usize = 20;
const SIZE: usize = 25;
const WRITER: usize = 31;
const FLAGS: usize = 35;
const PACKED_LEN: usize = 36;

const HARD_PIN: u8 = 1;
const ANNOUNCED_SHIFT: u8 = 1;
const ANNOUNCED_MASK: u8 = 3 << ANNOUNCED_SHIFT;

pub(crate) struct Object {
    /// The version of the write these replicas hold (`tombstones.rs`).
    pub version: Version,
    pub replicas: Replicas,
    rare: Option<Box<Rare>>,
    packed: [u8; PACKED_LEN],
}

const _: () = assert!(std::mem::size_of::<Object>() == 96);

impl Object {
    /// A new object of `size` bytes written by writer id `writer` (`index.rs`), started at
    /// `now`: no lease, no pin, no group, last read now.
    pub fn new(size: u64, version: Version, writer: u32, now: u64, replicas: Replicas) -> Self {
        assert!(
            size <= OBJECT_SIZE_MAX_BYTES,
            "object size {size} over 48 bits"
        );
        let mut o = Object {
            version,
            replicas,
            rare: None,
            packed: [0; PACKED_LEN],
        };
        o.put(SIZE, 6, size);
        o.set_writer(writer);
        o.set_put_start_ms(now);
        o.set_last_read_ms(now);
        o
    }

    fn get(&self, at: usize, len: usize) -> u64 {
        let mut b = [0u8; 8];
        b[..len].copy_from_slice(&self.packed[at..at + len]);
        u64::from_le_bytes(b)
    }

    fn put(&mut self, at: usize, len: usize, v: u64) {
        self.packed[at..at + len].copy_from_slice(&v.to_le_bytes()[..len]);
    }

    fn time(&self, at: usize) -> u64 {
        match self.get(at, 5) {
            TIME_SATURATED => u64::MAX,
            t => t,
        }
    }

    fn set_time(&mut self, at: usize, t: u64) {
        self.put(at, 5, t.min(TIME_SATURATED));
    }

    pub fn size(&self) -> u64 {
        self.get(SIZE, 6)
    }

    /// The writer's id in the index's writer table (`Objects::writer_id`).
    pub fn writer(&self) -> u32 {
        self.get(WRITER, 4) as u32
    }

    pub fn set_writer(&mut self, id: u32) {
        self.put(WRITER, 4, u64::from(id));
    }

    pub fn put_start_ms(&self) -> u64 {
        self.time(PUT_START)
    }

    pub fn set_put_start_ms(&mut self, t: u64) {
        self.set_time(PUT_START, t);
    }

    /// Last `GetReplicaList` (or completion): the recency eviction orders by.
    pub fn last_read_ms(&self) -> u64 {
        self.time(LAST_READ)
    }

    pub fn set_last_read_ms(&mut self, t: u64) {
        self.set_time(LAST_READ, t);
    }

    /// The object's own read lease (`object.rs`, "Leases").
    pub fn read_lease_until(&self) -> u64 {
        self.time(READ_LEASE)
    }

    pub fn set_read_lease_until(&mut self, t: u64) {
        self.set_time(READ_LEASE, t);
    }

    /// The end of the last read window handed out (`object.rs`, "Read windows").
    pub fn read_window_until(&self) -> u64 {
        self.time(READ_WINDOW)
    }

    pub fn set_read_window_until(&mut self, t: u64) {
        self.set_time(READ_WINDOW, t);
    }

    /// The object's own probe lease (`object.rs`, "Leases").
    pub fn probe_lease_until(&self) -> u64 {
        self.time(PROBE_LEASE)
    }

    pub fn set_probe_lease_until(&mut self, t: u64) {
        self.set_time(PROBE_LEASE, t);
    }

    pub fn hard_pin(&self) -> bool {
        self.packed[FLAGS] & HARD_PIN != 0
    }

    pub fn set_hard_pin(&mut self, on: bool) {
        self.packed[FLAGS] = (self.packed[FLAGS] & !HARD_PIN) | u8::from(on);
    }

    /// The medium last announced in a KV-cache event (`objects.rs`; `None`: not announced).
    pub fn announced(&self) -> Medium {
        match (self.packed[FLAGS] & ANNOUNCED_MASK) >> ANNOUNCED_SHIFT {
            1 => Medium::Cpu,
            2 => Medium::Disk,
            _ => Medium::None,
        }
    }

    pub fn set_announced(&mut self, m: Medium) {
        let bits = match m {
            Medium::None => 0,
            Medium::Cpu => 1,
            Medium::Disk => 2,
        };
        self.packed[FLAGS] = (self.packed[FLAGS] & !ANNOUNCED_MASK) | (bits << ANNOUNCED_SHIFT);
    }

    /// Changes the rare part, allocating it on demand and freeing it when back to defaults.
    fn rare_mut(&mut self, f: impl FnOnce(&mut Rare)) {
        let mut r = self.rare.take().unwrap_or_default();
        f(&mut r);
        if !r.is_default() {
            self.rare = Some(r);
        }
    }

    pub fn soft_pin(&self) -> SoftPin {
        self.rare
            .as_ref()
            .and_then(|r| r.soft_pin)
            .unwrap_or(SoftPin::None)
    }

    pub fn set_soft_pin(&mut self, p: SoftPin) {
        if p == SoftPin::None && self.rare.is_none() {
            return;
        }
        self.rare_mut(|r| r.soft_pin = (p != SoftPin::None).then_some(p));
    }

    /// Its lease group, if any (`object.rs`, "Lease groups").
    pub fn group(&self) -> Option<&GroupMember> {
        self.rare.as_ref().and_then(|r| r.group.as_ref())
    }

    pub fn set_group(&mut self, g: Option<GroupMember>) {
        if g.is_none() && self.rare.is_none() {
            return;
        }
        self.rare_mut(|r| r.group = g);
    }

    /// Reads answered while its only COMPLETE replicas were on disk, since its last
    /// promotion (`offload.rs`, promotion on hit). Saturates; reset when promoted.
    pub fn disk_hits(&self) -> u32 {
        self.rare.as_ref().map_or(0, |r| r.disk_hits)
    }

    pub fn set_disk_hits(&mut self, n: u32) {
        if n == 0 && self.rare.is_none() {
            return;
        }
        self.rare_mut(|r| r.disk_hits = n);
    }

    /// Bytes charged to its tenant (`objects.rs`; 0 without tenant quotas).
    pub fn charge(&self) -> u64 {
        self.rare.as_ref().map_or(0, |r| r.charge)
    }

    pub fn set_charge(&mut self, bytes: u64) {
        if bytes == 0 && self.rare.is_none() {
            return;
        }
        self.rare_mut(|r| r.charge = bytes);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn obj() -> Object {
        Object::new(
            4096,
            Version { term: 1, seq: 2 },
            7,
            1000,
            Replicas::default(),
        )
    }

    #[test]
    fn packed_fields_keep_their_values() {
        let mut o = obj();
        assert_eq!((o.size(), o.writer(), o.put_start_ms()), (4096, 7, 1000));
        assert_eq!(o.last_read_ms(), 1000);
        o.set_read_lease_until(123_456_789);
        o.set_read_window_until(5);
        o.set_probe_lease_until(TIME_SATURATED - 1);
        o.set_hard_pin(true);
        o.set_announced(Medium::Disk);
        o.set_writer(u32::MAX);
        assert_eq!(o.read_lease_until(), 123_456_789);
        assert_eq!(o.read_window_until(), 5);
        assert_eq!(o.probe_lease_until(), TIME_SATURATED - 1);
        assert!(o.hard_pin());
        assert_eq!(o.announced(), Medium::Disk);
        assert_eq!(o.writer(), u32::MAX);
        assert_eq!(
            (o.size(), o.put_start_ms(), o.last_read_ms()),
            (4096, 1000, 1000)
        );
        o.set_hard_pin(false);
        o.set_announced(Medium::Cpu);
        assert!(!o.hard_pin());
        assert_eq!(o.announced(), Medium::Cpu);
    }

    #[test]
    fn far_times_read_back_as_never_ending() {
        let mut o = obj();
        o.set_read_lease_until(u64::MAX);
        assert_eq!(o.read_lease_until(), u64::MAX);
        o.set_read_lease_until(1 << 45);
        assert_eq!(o.read_lease_until(), u64::MAX);
    }

    #[test]
    fn rare_state_is_allocated_only_while_set() {
        let mut o = obj();
        o.set_soft_pin(SoftPin::None);
        o.set_charge(0);
        assert!(o.rare.is_none());
        o.set_soft_pin(SoftPin::Until(99));
        o.set_charge(10);
        assert_eq!((o.soft_pin(), o.charge()), (SoftPin::Until(99), 10));
        o.set_soft_pin(SoftPin::None);
        assert!(o.rare.is_some());
        o.set_charge(0);
        assert!(o.rare.is_none());
        assert_eq!(o.soft_pin(), SoftPin::None);
    }

    #[test]
    fn replicas_go_between_inline_and_heap() {
        let r = |i: u32| Replica {
            seg: SegRef { idx: i, gen: 0 },
            span: Span { addr: 0, len: 1 },
            status: ReplicaStatus::Complete,
            on_disk: false,
        };
        let mut rs = Replicas::default();
        assert!(rs.is_empty());
        rs.push(r(1));
        assert!(matches!(rs, Replicas::One(_)));
        rs.push(r(2));
        assert_eq!(rs.len(), 2);
        assert_eq!(rs.swap_remove(0).seg.idx, 1);
        assert!(matches!(rs, Replicas::One(_)));
        rs.retain(|_| false);
        assert!(rs.is_empty());
        let rs = Replicas::from(vec![r(3), r(4), r(5)]);
        let idx: Vec<u32> = rs.into_iter().map(|r| r.seg.idx).collect();
        assert_eq!(idx, [3, 4, 5]);
    }
}
