//! The catalog of a served memory table: which committed object sits at which address.
//!
//! The data plane never interprets keys on the byte path, yet after a master restart the
//! master's index is empty and only the processes that own the bytes can say what they hold.
//! So every served table ([`ServedMemory`](crate::mem::served::ServedMemory)) keeps a
//! catalog, `start address -> (key, length, pins, version)`, that the writer of an object fills
//! as part of its put (the `CATALOG_PUT` request, after the replica's WRITE on the same
//! connection) and the owner reports back with `ReMountSegment` when the master asks for a
//! re-mount. `docs/recovery.md` tells the whole story.
//!
//! A record on the wire (the payload of `CATALOG_PUT`, little-endian):
//!
//! ```text
//!  0                               8               12              16
//!  +-------------------------------+---------------+---------------+
//!  | object_len (u64)              | flags (u32)   | reserved = 0  |
//!  +-------------------------------+---------------+---------------+
//!  16 (only when flags bit 1)      24              32
//!  +-------------------------------+-------------------------------+
//!  | version.term (u64)            | version.seq (u64)             |
//!  +-------------------------------+-------------------------------+
//!  then, in this order, each only when its flag is set:
//!  +-------------------------------+  bit 3 (SOFT_PIN)
//!  | soft_pin_ttl_ms (u64)         |
//!  +-------------------------------+-------------------------------+  bit 6 (COMMIT)
//!  | provisional.term (u64)        | provisional.seq (u64)         |
//!  +-------------------------------+-------------------------------+
//!  and last the key (UTF-8, the rest of the record)
//!  flags: bit 0 = hard pin; bit 1 = VERSIONED (the version follows the fixed part);
//!         bit 2 = TOMBSTONE (needs bit 1, not bit 0 or 3): `key` was removed at `version`,
//!         drop its entry in `[addr, addr + object_len)` and remember the removal;
//!         bit 3 = SOFT_PIN (needs bit 1, not bit 2): the put asked for a soft pin of
//!         `soft_pin_ttl_ms` (0: the master's default ttl), which follows the version;
//!         bit 4 = INTENT (needs bit 1, not bits 0, 2 or 3): the put of `key` at `version`
//!         is about to write `[addr, addr + object_len)` ([`Catalog::overwrite`]);
//!         bit 5 = PROVISIONAL (needs bit 1, not bits 0 or 3): the bytes of the put of `key`
//!         at `version` are in `[addr, addr + object_len)` and its commit at the master is
//!         still to come (a provisional entry: [`RecordKind::Provisional`]);
//!         bit 6 = COMMIT (needs bit 1): the master committed `key` at `version`, and its
//!         bytes are those of the provisional entry of `key` at exactly that range and at
//!         the provisional version that follows ([`RecordKind::Commit`]).
//!         At most one of bits 2, 4, 5 and 6. Every other bit 0.
//!         key: 1 ..= KEY_MAX_BYTES bytes
//! ```
//!
//! The soft pin is the one the put asked for (`SoftPinAction::Enable` and its ttl), so that a
//! new leader can restore it from the re-report (`docs/ha.md`, "Soft pins after a
//! failover"); the owner only stores and re-reports it.
//!
//! A record without a version (a writer that predates versions) is version 0.0, older than
//! every versioned write.
//!
//! Invariants:
//! - entries never overlap: an insert first removes every entry overlapping its range, so a
//!   reused range replaces what was there and the catalog holds at most one entry per byte
//!   of served memory (its size is bounded by the segment, not by a separate limit);
//! - every entry lies inside memory that was registered when it was inserted; unregistering
//!   a buffer drops the entries inside it;
//! - each entry carries the catalog's insertion sequence number, so a removal notice that
//!   was decided before the entry existed (see [`Catalog::forget`]) cannot drop it;
//! - each entry carries the master's version of its write, and the catalog keeps at most
//!   [`CATALOG_TOMBSTONES_MAX`] tombstones (key -> version removed). A tombstone only ever
//!   drops entries of its own key at or below its version, so it never hides a newer write,
//!   of that key or of another key that reused the range.
//!
//! - a write's *intent* (sent before its bytes: an INTENT record on the WRITE's connection,
//!   or a same-host writer's announcement, `crate::mem::shm`) drops the older entries its
//!   object's range overlaps, except the entry of its own key at exactly that range (an
//!   in-place upsert's, which must stay if the upsert is never recorded), so an entry never
//!   names another key's newer bytes ([`Catalog::overwrite`]).
//!
//! - a *provisional* entry holds the bytes of a put whose commit at the master has not been
//!   heard of: a writer that commits in one round trip (its range was reserved ahead, so
//!   its commit can be refused or answered after its bytes are in) records them before the
//!   commit and confirms them after it with a COMMIT record. A provisional entry is never
//!   re-reported (the master did not say it holds the key, and a refused writer's bytes
//!   must not come back over the winner's), and a COMMIT turns it into an object only if it
//!   is still there, unchanged: a tombstone, a freed notice or a newer intent that came
//!   first (the commit made the removal and the reuse possible) removed it, and the late
//!   COMMIT then changes nothing ([`Catalog::commit`]).
//!
//! Locking: one small mutex. It is not on the byte path: a replica written over TCP touches
//! it once per slice (its intent) and once for its record, not per byte, and the owner
//! touches it once per ping (freed ranges) and once per re-mount (snapshot). "Nothing on the
//! data path takes a lock" is about READ and WRITE payloads, which never look at it.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex, Weak};

use protocol::Version;

use super::Fence;

use crate::limits::{
    CATALOG_RECORD_HEADER_BYTES, CATALOG_RECORD_MAX_BYTES, CATALOG_RECORD_SOFT_PIN_BYTES,
    CATALOG_RECORD_VERSION_BYTES, CATALOG_TOMBSTONES_MAX,
};
use crate::TeError;

/// `flags` bit of a record: the object is hard-pinned (never evicted).
pub const CATALOG_FLAG_HARD_PIN: u32 = 1;
/// `flags` bit of a record: a version follows the fixed part.
pub const CATALOG_FLAG_VERSIONED: u32 = 2;
/// `flags` bit of a record: a tombstone (the key was removed at the record's version).
pub const CATALOG_FLAG_TOMBSTONE: u32 = 4;
/// `flags` bit of a record: soft-pinned; its ttl follows the version.
pub const CATALOG_FLAG_SOFT_PIN: u32 = 8;
/// `flags` bit of a record: an intent (the key's put is about to write the range).
pub const CATALOG_FLAG_INTENT: u32 = 16;
/// `flags` bit of a record: provisional (the put's bytes are in, its commit is to come).
pub const CATALOG_FLAG_PROVISIONAL: u32 = 32;
/// `flags` bit of a record: the commit of a provisional entry, whose version follows.
pub const CATALOG_FLAG_COMMIT: u32 = 64;

/// One committed object of the catalog.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CatalogEntry {
    pub addr: u64,
    pub len: u64,
    pub key: String,
    pub hard_pin: bool,
    /// The soft pin its put asked for: `Some(ttl_ms)`, `Some(0)` for the master's default.
    pub soft_pin_ttl_ms: Option<u64>,
    pub version: Version,
}

/// What a record asks of the catalog.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RecordKind {
    /// The object is committed: insert it.
    Object,
    /// The key was removed at the record's version: drop its entry, remember the removal.
    Tombstone,
    /// The key's put is about to write the range: drop what it goes over
    /// ([`Catalog::overwrite`]).
    Intent,
    /// The bytes of the key's put at the record's version are in the range; its commit at the
    /// master is to come: a provisional entry (module docs).
    Provisional,
    /// The master committed the key at the record's version; its bytes are the provisional
    /// entry's of the key at exactly this range and at this (provisional) version
    /// ([`Catalog::commit`]).
    Commit(Version),
}

/// A decoded `CATALOG_PUT` payload.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CatalogRecord<'a> {
    pub len: u64,
    pub hard_pin: bool,
    pub key: &'a str,
    pub version: Version,
    pub kind: RecordKind,
    /// The soft pin the put asked for: `Some(ttl_ms)`, `Some(0)` for the master's default.
    pub soft_pin_ttl_ms: Option<u64>,
}

impl<'a> CatalogRecord<'a> {
    /// The intent of the put of `key` at `version` to write its object, `len` bytes at the
    /// address the record is sent for ([`Catalog::overwrite`]).
    pub fn intent(len: u64, key: &'a str, version: Version) -> CatalogRecord<'a> {
        CatalogRecord {
            len,
            hard_pin: false,
            key,
            version,
            kind: RecordKind::Intent,
            soft_pin_ttl_ms: None,
        }
    }

    /// The wire form (see the module docs); always versioned.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(
            CATALOG_RECORD_HEADER_BYTES
                + CATALOG_RECORD_VERSION_BYTES
                + CATALOG_RECORD_SOFT_PIN_BYTES
                + CATALOG_RECORD_VERSION_BYTES
                + self.key.len(),
        );
        out.extend_from_slice(&self.len.to_le_bytes());
        let mut flags = CATALOG_FLAG_VERSIONED;
        if self.hard_pin {
            flags |= CATALOG_FLAG_HARD_PIN;
        }
        match self.kind {
            RecordKind::Object => {}
            RecordKind::Tombstone => flags |= CATALOG_FLAG_TOMBSTONE,
            RecordKind::Intent => flags |= CATALOG_FLAG_INTENT,
            RecordKind::Provisional => flags |= CATALOG_FLAG_PROVISIONAL,
            RecordKind::Commit(_) => flags |= CATALOG_FLAG_COMMIT,
        }
        if self.soft_pin_ttl_ms.is_some() {
            flags |= CATALOG_FLAG_SOFT_PIN;
        }
        out.extend_from_slice(&flags.to_le_bytes());
        out.extend_from_slice(&0u32.to_le_bytes());
        out.extend_from_slice(&self.version.term.to_le_bytes());
        out.extend_from_slice(&self.version.seq.to_le_bytes());
        if let Some(ttl) = self.soft_pin_ttl_ms {
            out.extend_from_slice(&ttl.to_le_bytes());
        }
        if let RecordKind::Commit(p) = self.kind {
            out.extend_from_slice(&p.term.to_le_bytes());
            out.extend_from_slice(&p.seq.to_le_bytes());
        }
        out.extend_from_slice(self.key.as_bytes());
        out
    }

    /// Decodes a payload. Errors (`InvalidArgument`): shorter than the fixed part (and the
    /// version when flagged), longer than [`CATALOG_RECORD_MAX_BYTES`], unknown flags, a
    /// tombstone, an intent, a provisional record or a commit without a version, a
    /// tombstone, an intent or a provisional record with a pin, two of those kinds at once, a
    /// soft pin without a version (or short of its ttl), a commit short of its provisional
    /// version, a reserved field not 0, an empty key or one over `KEY_MAX_BYTES`, a key that
    /// is not UTF-8, or an object length of 0.
    pub fn decode(b: &[u8]) -> Result<CatalogRecord<'_>, TeError> {
        if b.len() <= CATALOG_RECORD_HEADER_BYTES || b.len() as u64 > CATALOG_RECORD_MAX_BYTES {
            return Err(TeError::InvalidArgument);
        }
        let (fixed, rest) = b.split_at(CATALOG_RECORD_HEADER_BYTES);
        let mut fixed = Fields(fixed);
        let len = fixed.u64().ok_or(TeError::InvalidArgument)?;
        let flags = fixed.u32().ok_or(TeError::InvalidArgument)?;
        let reserved = fixed.u32().ok_or(TeError::InvalidArgument)?;
        let versioned = flags & CATALOG_FLAG_VERSIONED != 0;
        let hard_pin = flags & CATALOG_FLAG_HARD_PIN != 0;
        let soft_pin = flags & CATALOG_FLAG_SOFT_PIN != 0;
        let kind = RecordKind::of_flags(flags)?;
        // Only an object and a commit carry pins (a commit's become the object's).
        let pins_allowed = matches!(kind, RecordKind::Object | RecordKind::Commit(_));
        if reserved != 0
            || (kind != RecordKind::Object && !versioned)
            || (!pins_allowed && (hard_pin || soft_pin))
            || (soft_pin && !versioned)
        {
            return Err(TeError::InvalidArgument);
        }
        // Each optional field must leave at least one byte of key behind it.
        let mut rest = Fields(rest);
        let bad = || TeError::InvalidArgument;
        let version = if versioned {
            rest.version().ok_or_else(bad)?
        } else {
            Version::ZERO
        };
        let soft_pin_ttl_ms = if soft_pin {
            Some(rest.u64().ok_or_else(bad)?)
        } else {
            None
        };
        let kind = match kind {
            RecordKind::Commit(_) => RecordKind::Commit(rest.version().ok_or_else(bad)?),
            k => k,
        };
        let key = std::str::from_utf8(rest.0).map_err(|_| bad())?;
        // The total bound above leaves room for fields a record may not carry: bound the key.
        if len == 0 || key.is_empty() || key.len() > protocol::limits::KEY_MAX_BYTES {
            return Err(bad());
        }
        Ok(CatalogRecord {
            len,
            hard_pin,
            key,
            version,
            kind,
            soft_pin_ttl_ms,
        })
    }
}

impl RecordKind {
    /// The kind a record's flags name (a commit's provisional version still to be read);
    /// unknown flags, or two kinds at once, are `InvalidArgument`.
    fn of_flags(flags: u32) -> Result<RecordKind, TeError> {
        let known = CATALOG_FLAG_HARD_PIN | CATALOG_FLAG_VERSIONED | CATALOG_FLAG_SOFT_PIN;
        Ok(match flags & !known {
            0 => RecordKind::Object,
            CATALOG_FLAG_TOMBSTONE => RecordKind::Tombstone,
            CATALOG_FLAG_INTENT => RecordKind::Intent,
            CATALOG_FLAG_PROVISIONAL => RecordKind::Provisional,
            CATALOG_FLAG_COMMIT => RecordKind::Commit(Version::ZERO),
            _ => return Err(TeError::InvalidArgument),
        })
    }
}

/// Little-endian fields read off the front of a record.
struct Fields<'a>(&'a [u8]);

impl Fields<'_> {
    fn take<const N: usize>(&mut self) -> Option<[u8; N]> {
        let (head, rest) = self.0.split_first_chunk::<N>()?;
        self.0 = rest;
        Some(*head)
    }

    fn u32(&mut self) -> Option<u32> {
        self.take().map(u32::from_le_bytes)
    }

    fn u64(&mut self) -> Option<u64> {
        self.take().map(u64::from_le_bytes)
    }

    fn version(&mut self) -> Option<Version> {
        Some(Version {
            term: self.u64()?,
            seq: self.u64()?,
        })
    }
}

#[derive(Debug)]
struct Entry {
    len: u64,
    key: Box<str>,
    hard_pin: bool,
    soft_pin_ttl_ms: Option<u64>,
    version: Version,
    /// Insertion sequence number (see [`Catalog::mark`]).
    seq: u64,
    /// Bytes whose commit is to come: never listed ([`RecordKind::Provisional`]).
    provisional: bool,
}

#[derive(Debug, Default)]
struct Inner {
    by_addr: BTreeMap<u64, Entry>,
    /// Sequence number of the last insert.
    seq: u64,
    /// Removed keys: key -> the version removed, and the same ordered by version (to drop
    /// the oldest beyond [`CATALOG_TOMBSTONES_MAX`]).
    tombstones: HashMap<Box<str>, Version>,
    tombstones_by_version: BTreeSet<(Version, Box<str>)>,
}

impl Inner {
    /// Removes the entries overlapping `[addr, addr + len)` whose sequence number is at most
    /// `upto`; returns how many.
    fn remove_overlapping(&mut self, addr: u64, len: u64, upto: u64) -> usize {
        self.remove_overlapping_where(addr, len, |_, e| e.seq <= upto)
    }

    /// Removes the entries overlapping `[addr, addr + len)` that `doomed` accepts, given
    /// each entry's start address.
    fn remove_overlapping_where(
        &mut self,
        addr: u64,
        len: u64,
        doomed: impl Fn(u64, &Entry) -> bool,
    ) -> usize {
        let end = addr.saturating_add(len);
        let mut hit: Vec<u64> = Vec::new();
        // Entries never overlap, so only the last one starting before `addr` can reach into
        // the range; every entry starting inside it overlaps it.
        if let Some((&a, e)) = self.by_addr.range(..addr).next_back() {
            if a.saturating_add(e.len) > addr && doomed(a, e) {
                hit.push(a);
            }
        }
        hit.extend(
            self.by_addr
                .range(addr..end)
                .filter(|(&a, e)| doomed(a, e))
                .map(|(&a, _)| a),
        );
        for a in &hit {
            self.by_addr.remove(a);
        }
        hit.len()
    }

    fn drop_tombstone(&mut self, key: &str) {
        if let Some((k, v)) = self.tombstones.remove_entry(key) {
            self.tombstones_by_version.remove(&(v, k));
        }
    }

    /// Remembers that `key` was removed at `version` (the newer removal wins).
    fn add_tombstone(&mut self, key: &str, version: Version) {
        if self.tombstones.get(key).is_some_and(|&v| v >= version) {
            return;
        }
        self.drop_tombstone(key);
        self.tombstones.insert(key.into(), version);
        self.tombstones_by_version.insert((version, key.into()));
        while self.tombstones.len() > CATALOG_TOMBSTONES_MAX {
            let Some((_, k)) = self.tombstones_by_version.pop_first() else {
                break;
            };
            self.tombstones.remove(&k);
        }
    }
}

/// Writes into this catalog's memory that the owner hears of out of band and has not
/// applied yet: same-host memcpys announced in the shared-memory ring
/// (`crate::mem::shm`), their intents and their records. The catalog applies all of them
/// before every snapshot and before it raises its fence, and before any intent, record or
/// tombstone that reaches it otherwise ([`Catalog::settle`]).
pub trait PendingWrites: Send + Sync {
    /// Applies every announced intent and record to `catalog` ([`Catalog::apply_now`]).
    fn apply_pending(&self, catalog: &Catalog);

    /// Applies what was announced so far (cheap when there is nothing): it comes before
    /// whatever the caller applies next.
    fn settle(&self, catalog: &Catalog) {
        self.apply_pending(catalog);
    }
}

/// See the module docs.
#[derive(Default)]
pub struct Catalog {
    inner: Mutex<Inner>,
    /// The term of the master the owner last heard from ([`Catalog::fence`]): an object
    /// record of an older term is refused. Shared with the servers, which fence WRITEs by it.
    fence: Arc<Fence>,
    /// Sources of announced writes ([`Catalog::watch`]), applied before each snapshot.
    pending: Mutex<Vec<Weak<dyn PendingWrites>>>,
}

impl std::fmt::Debug for Catalog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Catalog")
            .field("inner", &self.inner)
            .field("fence", &self.fence)
            .finish_non_exhaustive()
    }
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

    /// Records that version `version` of `key` (`len` bytes) is committed at `addr`,
    /// replacing every entry that overlaps `[addr, addr + len)` (the master allocated the
    /// range anew, so what was there is gone), and forgetting an older tombstone of `key`.
    /// The caller has checked the range against registered memory. Not soft-pinned: a pinned
    /// object comes in through [`Catalog::apply`].
    /// Refused with `ERR_METADATA` when `version` is of a term older than the fence.
    pub fn insert(
        &self,
        addr: u64,
        len: u64,
        key: &str,
        hard_pin: bool,
        version: Version,
    ) -> Result<(), TeError> {
        self.settle();
        self.insert_pinned(addr, len, key, (hard_pin, None), version, false)
    }

    /// [`Catalog::insert`] with the object's pins: hard, and the soft pin's ttl; or, when
    /// `provisional`, a provisional entry (no pins), which leaves the key's tombstone alone
    /// (only a commit says the key is written again). Refused with `ERR_METADATA` when
    /// `version` is of a term older than the fence ([`Catalog::fence`]).
    fn insert_pinned(
        &self,
        addr: u64,
        len: u64,
        key: &str,
        (hard_pin, soft_pin_ttl_ms): (bool, Option<u64>),
        version: Version,
        provisional: bool,
    ) -> Result<(), TeError> {
        let mut inner = self.lock();
        if version.term < self.fence.term() {
            return Err(TeError::Metadata);
        }
        inner.remove_overlapping(addr, len, u64::MAX);
        if !provisional && inner.tombstones.get(key).is_some_and(|&v| v < version) {
            inner.drop_tombstone(key);
        }
        inner.seq += 1;
        let seq = inner.seq;
        inner.by_addr.insert(
            addr,
            Entry {
                len,
                key: key.into(),
                hard_pin,
                soft_pin_ttl_ms,
                version,
                seq,
                provisional,
            },
        );
        Ok(())
    }

    /// The master committed `key` at `version`, and its bytes are those of the provisional
    /// entry of `key` at exactly `[addr, addr + len)` at version `provisional`: that entry
    /// becomes the object, with these pins, and keeps its sequence number (it holds the
    /// same bytes, so a freed notice decided after its bytes came may still drop it). Returns
    /// whether it was there.
    ///
    /// If it is not, something that came after the commit and reached this catalog first
    /// removed or replaced it: a removal's tombstone, a freed notice, the intent or record of
    /// a later put into the range (the commit made them possible, and its writer sends this
    /// record only once the master answered). The object is no longer here, and nothing
    /// changes. Refused with `ERR_METADATA` when `version` is of a term older than the fence.
    ///
    /// Records announced in a same-host ring before it are applied first
    /// ([`Catalog::settle`]).
    pub fn commit(
        &self,
        addr: u64,
        len: u64,
        key: &str,
        pins: (bool, Option<u64>),
        provisional: Version,
        version: Version,
    ) -> Result<bool, TeError> {
        self.settle();
        self.commit_now(addr, len, key, pins, provisional, version)
    }

    fn commit_now(
        &self,
        addr: u64,
        len: u64,
        key: &str,
        (hard_pin, soft_pin_ttl_ms): (bool, Option<u64>),
        provisional: Version,
        version: Version,
    ) -> Result<bool, TeError> {
        let mut inner = self.lock();
        if version.term < self.fence.term() {
            return Err(TeError::Metadata);
        }
        let Some(e) = inner.by_addr.get_mut(&addr) else {
            return Ok(false);
        };
        if !(e.provisional && e.len == len && &*e.key == key && e.version == provisional) {
            return Ok(false);
        }
        e.provisional = false;
        e.version = version;
        e.hard_pin = hard_pin;
        e.soft_pin_ttl_ms = soft_pin_ttl_ms;
        if inner.tombstones.get(key).is_some_and(|&v| v < version) {
            inner.drop_tombstone(key);
        }
        Ok(true)
    }

    /// Applies a record: an object is inserted, a tombstone buried, an intent drops what its
    /// write goes over. An object or an intent of a term older than the fence is refused with
    /// `ERR_METADATA` and changes nothing: its write belongs to a term that has ended (over
    /// TCP its WRITE is refused by its connection's term anyway; an RDMA writer, which waits
    /// for its intent's answer before its bytes, stops there). A tombstone is always applied
    /// (it drops only its own key's entries older than its version, so a late one cannot hide
    /// a newer write).
    ///
    /// Records announced in a same-host ring before this one are applied first
    /// ([`Catalog::settle`]).
    pub fn apply(&self, addr: u64, rec: &CatalogRecord<'_>) -> Result<(), TeError> {
        self.settle();
        self.apply_now(addr, rec)
    }

    /// [`Catalog::apply`] without applying announced records first: for the announcements'
    /// own sources, and for a caller that called [`Catalog::settle`] before it took a lock the
    /// sources take (`ServedMemory`'s table).
    pub fn apply_now(&self, addr: u64, rec: &CatalogRecord<'_>) -> Result<(), TeError> {
        match rec.kind {
            RecordKind::Tombstone => self
                .bury_now(addr, rec.len, rec.key, rec.version)
                .map(|_| ()),
            RecordKind::Intent => {
                if self.fence.refuses(rec.version.term) {
                    return Err(TeError::Metadata);
                }
                self.overwrite_now(addr, rec.len, rec.key, rec.version);
                Ok(())
            }
            RecordKind::Object => {
                let pins = (rec.hard_pin, rec.soft_pin_ttl_ms);
                self.insert_pinned(addr, rec.len, rec.key, pins, rec.version, false)
            }
            RecordKind::Provisional => {
                self.insert_pinned(addr, rec.len, rec.key, (false, None), rec.version, true)
            }
            RecordKind::Commit(provisional) => {
                let pins = (rec.hard_pin, rec.soft_pin_ttl_ms);
                self.commit_now(addr, rec.len, rec.key, pins, provisional, rec.version)
                    .map(|_| ())
            }
        }
    }

    /// Refuses, from now on, object records of a term older than `term`: the term of the
    /// master the owner just heard from (a ping's answer), raised before the owner re-mounts
    /// to it. Until the re-mount that master allocates nothing in this memory, so a record
    /// refused here is one a write of an earlier term sends late, and the range it names may
    /// already hold a newer object whose entry it would replace (`docs/ha.md`, "Late writes
    /// of an earlier term"). The fence follows the master (a lower term is taken too: a
    /// cluster moved to new masters starts counting again) and 0 turns it off.
    ///
    /// The same fence refuses the WRITEs of connections that declared an earlier term, and
    /// shuts those connections down now ([`Fence::raise`]); returns how many it shut down.
    /// Memcpy writes of earlier terms are refused before their first byte from now on; the
    /// caller waits for those already copying with [`Fence::wait_for_writes`] before it
    /// re-mounts.
    ///
    /// Every write announced in a same-host ring before the raise is applied first, under
    /// the fence it was published under: a put whose record is in the owner's ring may
    /// already be acknowledged by the master that ended (`mem::shm`'s `announce` module,
    /// "Why records here too").
    pub fn fence(&self, term: u64) -> usize {
        self.apply_pending();
        let _inner = self.lock();
        self.fence.raise(term)
    }

    /// The term set by the last [`Catalog::fence`] (0: none).
    pub fn fence_term(&self) -> u64 {
        self.fence.term()
    }

    /// The fence the servers of this table check WRITEs against.
    pub fn fences(&self) -> &Arc<Fence> {
        &self.fence
    }

    /// Records that `key` was removed at `version`: drops its entries overlapping
    /// `[addr, addr + len)` whose version is at most `version` (an entry of another key, or
    /// a newer one of this key, is a later write into the reused range and stays), and keeps
    /// a tombstone so that the removal is re-reported. Returns how many entries went.
    ///
    /// A tombstone of a term older than the fence is applied too (it drops only its own key's
    /// older entries) but answered `ERR_METADATA`: this owner may already have re-reported to
    /// the newer master, which would then never hear of the removal and keep listing the key
    /// from the re-report, so the remover must hand it to that master (`KeepRemoved`). The
    /// fence is read under the table's lock, which the re-mount's snapshot takes after raising
    /// it, so a tombstone answered `Ok` is in that snapshot.
    ///
    /// Records announced in a same-host ring before it are applied first
    /// ([`Catalog::settle`]): the put a removal removes may have sent its record there.
    pub fn bury(&self, addr: u64, len: u64, key: &str, version: Version) -> Result<usize, TeError> {
        self.settle();
        self.bury_now(addr, len, key, version)
    }

    fn bury_now(&self, addr: u64, len: u64, key: &str, version: Version) -> Result<usize, TeError> {
        let mut inner = self.lock();
        let n = inner
            .remove_overlapping_where(addr, len, |_, e| &*e.key == key && e.version <= version);
        inner.add_tombstone(key, version);
        if version.term < self.fence.term() {
            return Err(TeError::Metadata);
        }
        Ok(n)
    }

    /// Every tombstone: (key, version removed), in no particular order.
    pub fn tombstones(&self) -> Vec<(String, Version)> {
        self.lock()
            .tombstones
            .iter()
            .map(|(k, &v)| (k.to_string(), v))
            .collect()
    }

    /// The sequence number of the last insert so far. Take it before asking the master which
    /// ranges it freed; then [`Catalog::forget`] with it drops only entries that existed
    /// before the question was asked (a later insert into a freed range is a new object).
    ///
    /// Every write announced in a same-host ring so far is applied first, so a record sent
    /// before the question is older than the mark.
    pub fn mark(&self) -> u64 {
        self.apply_pending();
        self.lock().seq
    }

    /// Drops the entries overlapping `[addr, addr + len)` inserted no later than `mark`
    /// (`u64::MAX`: whatever their age); returns how many.
    pub fn forget(&self, addr: u64, len: u64, mark: u64) -> usize {
        self.lock().remove_overlapping(addr, len, mark)
    }

    /// The put of `key` at `version` is about to write its object, `[addr, addr + len)`
    /// (its intent): drops the entries that range overlaps whose version is older than
    /// `version`, except `key`'s own entry at exactly `[addr, addr + len)`, and returns how
    /// many went.
    ///
    /// The master hands out only ranges it holds as free, so an older entry there is one whose
    /// removal has not reached this owner (an eviction, a discarded put, a free cut short when
    /// the range was handed out again: `docs/recovery.md`, "A range written over"). Kept, it
    /// would name this put's bytes if the writer never records (it died between its bytes and
    /// its record), and a master rebuilding its index from the re-reports would list the old
    /// key over them. The entry spared is an in-place upsert's old value: an upsert cut before
    /// its record leaves its key readable, as it always did. Entries as new as the write or
    /// newer stay, so an intent applied late (a same-host announcement read after the
    /// writer's own record, or after a later put's) drops nothing that came after it.
    ///
    /// Records announced in a same-host ring before it are applied first
    /// ([`Catalog::settle`]): an older record read after the intent would name its bytes.
    pub fn overwrite(&self, addr: u64, len: u64, key: &str, version: Version) -> usize {
        self.settle();
        self.overwrite_now(addr, len, key, version)
    }

    /// [`Catalog::overwrite`] without applying announced records first: for their own source.
    pub fn overwrite_now(&self, addr: u64, len: u64, key: &str, version: Version) -> usize {
        self.lock().remove_overlapping_where(addr, len, |at, e| {
            e.version < version && !(&*e.key == key && at == addr && e.len == len)
        })
    }

    /// Has `source`'s announced writes applied before every snapshot ([`Catalog::entries_in`]),
    /// for as long as it lives.
    pub fn watch(&self, source: Weak<dyn PendingWrites>) {
        let mut pending = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        pending.retain(|w| w.strong_count() > 0);
        pending.push(source);
    }

    /// Calls `f` on each live source of announced writes ([`Catalog::watch`]), under the list's
    /// lock, which no source takes: no list copied per call, as a settle runs before every
    /// intent and record that reaches the catalog over TCP.
    fn each_source(&self, f: impl Fn(&dyn PendingWrites)) {
        let pending = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        for s in pending.iter().filter_map(Weak::upgrade) {
            f(&*s);
        }
    }

    /// Applies every write announced out of band so far: intents and records.
    fn apply_pending(&self) {
        self.each_source(|s| s.apply_pending(self));
    }

    /// Applies the intents and records announced in same-host rings so far
    /// (`crate::mem::shm`): whatever reaches the catalog after this call comes after them, as
    /// it would have if they had come over TCP. Called before applying an intent, a record or
    /// a tombstone, outside any lock the sources take. Cheap when nothing was announced.
    pub fn settle(&self) {
        self.each_source(|s| s.settle(self));
    }

    /// The objects starting inside `[base, base + len)`, in address order (provisional
    /// entries are not objects: module docs). Writes announced out of band are applied first
    /// ([`Catalog::watch`]), so a snapshot never lists an entry whose range a same-host
    /// writer announced it was writing before the snapshot began.
    pub fn entries_in(&self, base: u64, len: u64) -> Vec<CatalogEntry> {
        self.apply_pending();
        let end = base.saturating_add(len);
        self.lock()
            .by_addr
            .range(base..end)
            .filter(|(_, e)| !e.provisional)
            .map(|(&addr, e)| CatalogEntry {
                addr,
                len: e.len,
                key: e.key.to_string(),
                hard_pin: e.hard_pin,
                soft_pin_ttl_ms: e.soft_pin_ttl_ms,
                version: e.version,
            })
            .collect()
    }

    /// Every object, in address order.
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

    const V0: Version = Version::ZERO;

    fn v(term: u64, seq: u64) -> Version {
        Version { term, seq }
    }

    fn keys(c: &Catalog) -> Vec<(u64, String)> {
        c.entries().into_iter().map(|e| (e.addr, e.key)).collect()
    }

    #[test]
    fn records_round_trip_and_bad_ones_are_refused() {
        let r = CatalogRecord {
            len: 4096,
            hard_pin: true,
            key: "k/1",
            version: v(7, 9),
            kind: RecordKind::Object,
            soft_pin_ttl_ms: None,
        };
        let b = r.encode();
        assert_eq!(b.len(), 16 + 16 + 3);
        assert_eq!(&b[0..8], &4096u64.to_le_bytes());
        assert_eq!(&b[8..12], &3u32.to_le_bytes());
        assert_eq!(&b[16..24], &7u64.to_le_bytes());
        assert_eq!(&b[24..32], &9u64.to_le_bytes());
        assert_eq!(CatalogRecord::decode(&b), Ok(r));
        // A record of a writer that predates versions: version 0.0.
        let mut legacy = b[..16].to_vec();
        legacy[8] = 1;
        legacy.extend_from_slice(b"k/1");
        let old = CatalogRecord::decode(&legacy).unwrap();
        assert_eq!((old.version, old.key, old.hard_pin), (V0, "k/1", true));
        let tomb = CatalogRecord {
            hard_pin: false,
            kind: RecordKind::Tombstone,
            soft_pin_ttl_ms: None,
            ..r
        };
        assert_eq!(CatalogRecord::decode(&tomb.encode()), Ok(tomb));
        let bad = |f: &dyn Fn(&mut Vec<u8>)| {
            let mut x = b.clone();
            f(&mut x);
            CatalogRecord::decode(&x).is_err()
        };
        assert!(bad(&|x| x.truncate(32)), "empty key");
        assert!(bad(&|x| x.truncate(20)), "short version");
        assert!(bad(&|x| x[8] = 128 | 2), "unknown flag");
        assert!(bad(&|x| x[8] = 4 | 2 | 1), "pinned tombstone");
        assert!(bad(&|x| x[8] = 4), "tombstone without a version");
        assert!(bad(&|x| x[8] = 16), "intent without a version");
        assert!(bad(&|x| x[8] = 16 | 2 | 1), "pinned intent");
        assert!(bad(&|x| x[8] = 16 | 4 | 2), "intent and tombstone");
        assert!(bad(&|x| x[13] = 1), "reserved");
        assert!(bad(&|x| x[0..8].fill(0)), "zero length");
        assert!(bad(&|x| x.push(0xff)), "not UTF-8");
        let huge = "k".repeat(protocol::limits::KEY_MAX_BYTES + 1);
        let long = CatalogRecord {
            len: 1,
            hard_pin: false,
            key: &huge,
            version: V0,
            kind: RecordKind::Object,
            soft_pin_ttl_ms: None,
        };
        assert!(CatalogRecord::decode(&long.encode()).is_err());
        let max = "k".repeat(protocol::limits::KEY_MAX_BYTES);
        let ok = CatalogRecord {
            len: 1,
            hard_pin: false,
            key: &max,
            version: v(u64::MAX, u64::MAX),
            kind: RecordKind::Object,
            soft_pin_ttl_ms: Some(u64::MAX),
        };
        assert_eq!(
            CatalogRecord::decode(&ok.encode()).map(|r| r.soft_pin_ttl_ms),
            Ok(Some(u64::MAX)),
            "the longest object record decodes"
        );
        assert_eq!(CatalogRecord::decode(&ok.encode()), Ok(ok));
    }

    #[test]
    fn soft_pins_ride_the_record_into_the_catalog() {
        let r = CatalogRecord {
            len: 64,
            hard_pin: false,
            key: "pinned",
            version: v(2, 3),
            kind: RecordKind::Object,
            soft_pin_ttl_ms: Some(90_000),
        };
        let b = r.encode();
        assert_eq!(b.len(), 16 + 16 + 8 + 6);
        assert_eq!(&b[8..12], &(2u32 | 8).to_le_bytes());
        assert_eq!(&b[32..40], &90_000u64.to_le_bytes());
        assert_eq!(CatalogRecord::decode(&b), Ok(r));
        let default_ttl = CatalogRecord {
            soft_pin_ttl_ms: Some(0),
            ..r
        };
        assert_eq!(
            CatalogRecord::decode(&default_ttl.encode()),
            Ok(default_ttl)
        );
        let bad = |f: &dyn Fn(&mut Vec<u8>)| {
            let mut x = b.clone();
            f(&mut x);
            CatalogRecord::decode(&x).is_err()
        };
        assert!(bad(&|x| x.truncate(40)), "ttl but no key");
        assert!(bad(&|x| x.truncate(36)), "short ttl");
        assert!(bad(&|x| x[8] = 8 | 4 | 2), "pinned tombstone");
        // Without VERSIONED the ttl would be read as a version: refused.
        assert!(bad(&|x| x[8] = 8), "soft pin without a version");

        let c = Catalog::new();
        c.apply(0, &r).unwrap();
        c.apply(
            100,
            &CatalogRecord {
                key: "plain",
                soft_pin_ttl_ms: None,
                ..r
            },
        )
        .unwrap();
        let pins: Vec<_> = c
            .entries()
            .into_iter()
            .map(|e| (e.key, e.soft_pin_ttl_ms))
            .collect();
        assert_eq!(
            pins,
            vec![("pinned".into(), Some(90_000)), ("plain".into(), None)]
        );
        // A rewrite of the range without a pin (an upsert with DISABLE) drops it.
        c.apply(
            0,
            &CatalogRecord {
                soft_pin_ttl_ms: None,
                version: v(2, 4),
                ..r
            },
        )
        .unwrap();
        assert_eq!(c.entries()[0].soft_pin_ttl_ms, None);
    }

    #[test]
    fn inserts_replace_what_they_overlap() {
        let c = Catalog::new();
        c.insert(100, 50, "a", false, V0).unwrap();
        c.insert(200, 50, "b", false, V0).unwrap();
        c.insert(300, 50, "c", true, V0).unwrap();
        // Overlaps the tail of a and the head of b.
        c.insert(140, 70, "d", false, V0).unwrap();
        assert_eq!(
            keys(&c),
            vec![(140, "d".into()), (300, "c".into())],
            "a and b replaced"
        );
        // Same start, same range: replaced.
        c.insert(300, 50, "e", false, V0).unwrap();
        assert_eq!(c.entries()[1].key, "e");
        assert!(!c.entries()[1].hard_pin);
        // Adjacent ranges do not overlap.
        c.insert(350, 10, "f", false, V0).unwrap();
        c.insert(130, 10, "g", false, V0).unwrap();
        assert_eq!(c.len(), 4);
        assert_eq!(c.entries_in(135, 200).len(), 2, "starts inside [135, 335)");
    }

    #[test]
    fn a_fence_refuses_objects_of_earlier_terms_only() {
        let c = Catalog::new();
        assert_eq!(c.fence_term(), 0);
        c.insert(0, 10, "a", false, v(3, 1)).unwrap();
        c.fence(5);
        assert_eq!(
            c.insert(0, 10, "b", false, v(4, 99)),
            Err(TeError::Metadata)
        );
        assert_eq!(c.insert(0, 10, "b", false, V0), Err(TeError::Metadata));
        // So is an intent: its write belongs to an ended term (an RDMA writer stops there).
        let late = CatalogRecord::intent(10, "b", v(4, 99));
        assert_eq!(c.apply(0, &late), Err(TeError::Metadata));
        assert_eq!(keys(&c), vec![(0, "a".into())], "nothing replaced");
        let current = CatalogRecord::intent(10, "b", v(5, 1));
        assert_eq!(
            c.apply(20, &current),
            Ok(()),
            "the fence's own term goes through"
        );
        c.insert(20, 10, "c", false, v(5, 1)).unwrap();
        c.insert(40, 10, "d", false, v(6, 1)).unwrap();
        // A tombstone of an earlier term still buries its own key's older entries, but says
        // the master may not know (the owner may have re-reported already).
        assert_eq!(c.bury(0, 10, "a", v(4, 1)), Err(TeError::Metadata));
        assert_eq!(keys(&c), vec![(20, "c".into()), (40, "d".into())]);
        assert_eq!(c.tombstones(), vec![("a".to_string(), v(4, 1))]);
        assert_eq!(c.bury(20, 10, "c", v(5, 1)), Ok(1), "the fence's own term");
        // The fence follows the master, down too.
        c.fence(2);
        c.insert(0, 10, "e", false, v(2, 1)).unwrap();
        assert_eq!(c.len(), 2);
    }

    #[test]
    fn an_intent_drops_older_entries_it_overlaps_but_its_own_keys_in_place() {
        let c = Catalog::new();
        c.insert(0, 10, "a", false, v(3, 1)).unwrap();
        c.insert(10, 10, "b", false, V0).unwrap();
        c.insert(30, 10, "c", false, v(1, 1)).unwrap();
        c.insert(60, 10, "new", false, v(9, 1)).unwrap();
        c.bury(50, 10, "gone", v(2, 1)).unwrap();
        // Older entries of other keys go; a range that only touches an entry leaves it.
        assert_eq!(c.overwrite(5, 10, "x", v(5, 1)), 2);
        assert_eq!(keys(&c), vec![(30, "c".into()), (60, "new".into())]);
        assert_eq!(c.overwrite(20, 10, "x", v(5, 1)), 0);
        // The key's own entry at exactly the range stays (an in-place upsert); at another
        // range (a moved upsert whose old buffer was reused) it goes.
        assert_eq!(c.overwrite(30, 10, "c", v(5, 1)), 0);
        assert_eq!(c.overwrite(30, 11, "c", v(5, 1)), 1);
        // A newer entry stays, whatever its key: the intent came late.
        assert_eq!(c.overwrite(55, 10, "x", v(5, 1)), 0);
        assert_eq!(keys(&c), vec![(60, "new".into())]);
        assert_eq!(c.tombstones(), vec![("gone".to_string(), v(2, 1))]);
        // Through a record, as CATALOG_PUT carries it.
        let intent = CatalogRecord::intent(1, "y", v(10, 1));
        let wire = intent.encode();
        assert_eq!(CatalogRecord::decode(&wire), Ok(intent));
        assert_eq!(c.apply(69, &CatalogRecord::decode(&wire).unwrap()), Ok(()));
        assert!(c.is_empty());
    }

    #[test]
    fn forget_respects_the_mark() {
        let c = Catalog::new();
        c.insert(0, 10, "old", false, V0).unwrap();
        let mark = c.mark();
        // The range was freed and reused by a new put after the mark was taken.
        c.insert(20, 10, "new", false, V0).unwrap();
        assert_eq!(c.forget(0, 30, mark), 1);
        assert_eq!(keys(&c), vec![(20, "new".into())]);
        assert_eq!(c.forget(25, 1, u64::MAX), 1);
        assert!(c.is_empty());
    }

    #[test]
    fn tombstones_drop_only_older_entries_of_their_key() {
        let c = Catalog::new();
        c.insert(0, 10, "k", false, v(1, 5)).unwrap();
        c.insert(10, 10, "other", false, v(1, 6)).unwrap();
        // Removal of k at 1.5 drops k, not the neighbour it overlaps.
        assert_eq!(c.bury(0, 20, "k", v(1, 5)), Ok(1));
        assert_eq!(keys(&c), vec![(10, "other".into())]);
        assert_eq!(c.tombstones(), vec![("k".to_string(), v(1, 5))]);
        // A newer k in the range survives an older removal notice.
        c.insert(0, 10, "k", false, v(2, 1)).unwrap();
        assert!(
            c.tombstones().is_empty(),
            "a newer write supersedes the tombstone"
        );
        assert_eq!(c.bury(0, 10, "k", v(1, 9)), Ok(0));
        assert_eq!(c.len(), 2);
        assert_eq!(c.tombstones(), vec![("k".to_string(), v(1, 9))]);
        // The newer removal wins; an older one changes nothing.
        c.bury(0, 10, "k", v(2, 1)).unwrap();
        c.bury(0, 10, "k", v(1, 1)).unwrap();
        assert_eq!(c.tombstones(), vec![("k".to_string(), v(2, 1))]);
        assert_eq!(keys(&c), vec![(10, "other".into())]);
    }

    #[test]
    fn tombstones_are_bounded_oldest_first() {
        let c = Catalog::new();
        for i in 0..CATALOG_TOMBSTONES_MAX as u64 + 2 {
            c.bury(0, 1, &format!("k{i}"), v(1, i)).unwrap();
        }
        let t = c.tombstones();
        assert_eq!(t.len(), CATALOG_TOMBSTONES_MAX);
        assert!(!t.iter().any(|(k, _)| k == "k0" || k == "k1"));
        assert!(t.iter().any(|(k, _)| k == "k2"));
    }

    fn provisional(len: u64, key: &str, version: Version) -> CatalogRecord<'_> {
        CatalogRecord {
            len,
            hard_pin: false,
            key,
            version,
            kind: RecordKind::Provisional,
            soft_pin_ttl_ms: None,
        }
    }

    fn commit(len: u64, key: &str, provisional: Version, version: Version) -> CatalogRecord<'_> {
        CatalogRecord {
            kind: RecordKind::Commit(provisional),
            ..CatalogRecord::intent(len, key, version)
        }
    }

    #[test]
    fn provisional_and_commit_records_round_trip_and_bad_ones_are_refused() {
        let p = provisional(4096, "k", v(3, 4));
        let b = p.encode();
        assert_eq!(&b[8..12], &(2u32 | 32).to_le_bytes());
        assert_eq!(b.len(), 16 + 16 + 1);
        assert_eq!(CatalogRecord::decode(&b), Ok(p));
        let c = CatalogRecord {
            hard_pin: true,
            soft_pin_ttl_ms: Some(7),
            ..commit(4096, "k", v(3, 4), v(3, 9))
        };
        let cb = c.encode();
        assert_eq!(&cb[8..12], &(2u32 | 1 | 8 | 64).to_le_bytes());
        // The version, the soft pin's ttl, then the provisional version, then the key.
        assert_eq!(&cb[24..32], &9u64.to_le_bytes());
        assert_eq!(&cb[32..40], &7u64.to_le_bytes());
        assert_eq!(&cb[40..48], &3u64.to_le_bytes());
        assert_eq!(&cb[48..56], &4u64.to_le_bytes());
        assert_eq!(&cb[56..], b"k");
        assert_eq!(CatalogRecord::decode(&cb), Ok(c));
        let plain = commit(4096, "k", v(3, 4), v(3, 9));
        assert_eq!(CatalogRecord::decode(&plain.encode()), Ok(plain));
        let bad = |x: &[u8], flags: u32| {
            let mut x = x.to_vec();
            x[8..12].copy_from_slice(&flags.to_le_bytes());
            CatalogRecord::decode(&x).is_err()
        };
        assert!(bad(&b, 32), "provisional without a version");
        assert!(bad(&b, 32 | 2 | 1), "pinned provisional");
        assert!(bad(&b, 32 | 16 | 2), "provisional intent");
        assert!(bad(&b, 32 | 4 | 2), "provisional tombstone");
        assert!(bad(&b, 32 | 64 | 2), "provisional commit");
        assert!(bad(&cb, 64 | 1 | 8), "commit without a version");
        assert!(bad(&cb, 64 | 4 | 2), "commit tombstone");
        let short = commit(1, "", v(1, 1), v(1, 2)).encode();
        assert!(CatalogRecord::decode(&short).is_err(), "commit with no key");
        assert!(
            CatalogRecord::decode(&short[..40]).is_err(),
            "commit short of its provisional version"
        );
        // The longest record is a pinned commit of the longest key.
        let max = "k".repeat(protocol::limits::KEY_MAX_BYTES);
        let longest = CatalogRecord {
            soft_pin_ttl_ms: Some(1),
            ..commit(1, &max, v(1, 1), v(1, 2))
        };
        assert_eq!(longest.encode().len() as u64, CATALOG_RECORD_MAX_BYTES);
        assert_eq!(CatalogRecord::decode(&longest.encode()), Ok(longest));
    }

    #[test]
    fn a_provisional_entry_is_not_listed_until_its_exact_commit() {
        let c = Catalog::new();
        c.apply(0, &provisional(10, "k", v(1, 4))).unwrap();
        c.apply(10, &provisional(10, "j", v(1, 5))).unwrap();
        assert!(
            c.entries().is_empty(),
            "provisional entries are not objects"
        );
        assert_eq!(c.len(), 2);
        // A commit of another key, length, address or provisional version changes nothing.
        for (addr, len, key, p) in [
            (0, 10, "j", v(1, 4)),
            (0, 9, "k", v(1, 4)),
            (1, 10, "k", v(1, 4)),
            (0, 10, "k", v(1, 3)),
        ] {
            assert_eq!(
                c.commit(addr, len, key, (false, None), p, v(1, 9)),
                Ok(false)
            );
        }
        assert!(c.entries().is_empty());
        c.apply(0, &commit(10, "k", v(1, 4), v(1, 9))).unwrap();
        let e = c.entries();
        assert_eq!(e.len(), 1);
        assert_eq!((e[0].addr, &*e[0].key, e[0].version), (0, "k", v(1, 9)));
        // Twice is once: the entry is no longer provisional.
        assert_eq!(
            c.commit(0, 10, "k", (true, None), v(1, 4), v(1, 9)),
            Ok(false)
        );
        assert!(!c.entries()[0].hard_pin);
        // Pins come with the commit.
        c.apply(
            10,
            &CatalogRecord {
                hard_pin: true,
                soft_pin_ttl_ms: Some(0),
                ..commit(10, "j", v(1, 5), v(1, 10))
            },
        )
        .unwrap();
        let j = &c.entries()[1];
        assert_eq!((j.hard_pin, j.soft_pin_ttl_ms), (true, Some(0)));
    }

    /// A catalog holding the provisional entry of `k` at [0, 10) (version 1.4), after `first`
    /// reached it, and what the commit of that entry at 1.9 did there.
    fn commit_after(first: impl Fn(&Catalog)) -> (Catalog, Result<bool, TeError>) {
        let c = Catalog::new();
        c.apply(0, &provisional(10, "k", v(1, 4))).unwrap();
        first(&c);
        let done = c.commit(0, 10, "k", (false, None), v(1, 4), v(1, 9));
        (c, done)
    }

    #[test]
    fn a_late_commit_finds_nothing_once_its_entry_was_removed_or_written_over() {
        // A removal's tombstone came first (its bytes were removed after the commit).
        let (c, done) = commit_after(|c| {
            c.bury(0, 10, "k", v(1, 9)).unwrap();
        });
        assert_eq!(done, Ok(false));
        assert!(c.is_empty());
        // A freed notice came first (evicted, the range handed out again).
        let (c, done) = commit_after(|c| assert_eq!(c.forget(0, 10, c.mark()), 1));
        assert_eq!(done, Ok(false));
        assert!(c.is_empty());
        // A later put's intent came first; its writer then died before its record.
        let (c, done) = commit_after(|c| {
            c.overwrite(0, 10, "other", v(1, 12));
        });
        assert_eq!(done, Ok(false));
        assert!(
            c.is_empty(),
            "the late commit must not name the later put's bytes"
        );
        // A later put of the same key into the same range, recorded: its entry stays.
        let (c, done) = commit_after(|c| {
            c.overwrite(0, 10, "k", v(1, 12));
            c.insert(0, 10, "k", false, v(1, 12)).unwrap();
        });
        assert_eq!(done, Ok(false));
        assert_eq!(c.entries()[0].version, v(1, 12));
    }

    #[test]
    fn a_commit_is_fenced_and_keeps_the_provisional_entrys_age() {
        let c = Catalog::new();
        // A provisional entry leaves the key's tombstone; its commit supersedes an older one.
        c.bury(0, 10, "k", v(1, 2)).unwrap();
        c.apply(0, &provisional(10, "k", v(1, 4))).unwrap();
        assert_eq!(c.tombstones().len(), 1);
        // The entry keeps its sequence number: a freed notice asked for before the commit
        // (and after the bytes came) still drops the object its range held.
        let mark = c.mark();
        c.fence(2);
        assert_eq!(
            c.commit(0, 10, "k", (false, None), v(1, 4), v(1, 9)),
            Err(TeError::Metadata),
            "a commit of an ended term"
        );
        assert!(c.entries().is_empty());
        assert_eq!(
            c.commit(0, 10, "k", (false, None), v(1, 4), v(2, 1)),
            Ok(true)
        );
        assert!(
            c.tombstones().is_empty(),
            "the commit supersedes the older removal"
        );
        assert_eq!(c.forget(0, 10, mark), 1);
        assert!(c.is_empty());
        // A provisional record of an ended term is refused too.
        assert_eq!(
            c.apply(0, &provisional(10, "k", v(1, 5))),
            Err(TeError::Metadata)
        );
    }
}
