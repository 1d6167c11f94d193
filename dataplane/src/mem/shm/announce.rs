//! What an importer tells the exporter of its copies, in its ring (`super::ring`): the frames
//! ([`Announcement`], wire format in the parent module's docs), and the exporter's side that
//! reads and applies them ([`Importers`]).
//!
//! Why intents: the owner does not see a memcpy, yet its catalog must not keep an entry that
//! names bytes written over since. A range the master freed can be handed out again before
//! the owner heard of the free, and a writer that dies between its memcpy and its record
//! would leave the old key's entry over its bytes, which the next master would list
//! (`docs/recovery.md`, "A range written over"; over TCP the same intent goes as a
//! CATALOG_PUT before the WRITE). The intent is in the owner's ring before the first byte
//! is copied, and the owner applies every intent before it takes a catalog snapshot and when
//! the importer's end closes ([`Catalog::overwrite`]: it drops only entries older than the
//! write's version and spares the key's own entry in place, so applying it late, after the
//! writer's own record, loses nothing).
//!
//! Why records here too (offer version 4): over TCP a same-host put's record was a round trip
//! to the node's shard, a third of a small put's time, and on a machine where that shard's
//! pinned core sleeps, most of it (waking it from another core). In the ring it costs a copy.
//! What a record over TCP promised still holds, because every reader of the catalog that
//! must come after it reads the ring first:
//! - the writer publishes the record once its bytes are in, and only then commits the put
//!   at the master. Whatever the commit makes possible later (a removal's tombstone, a range
//!   freed and handed out again, another writer's intent or record over it) reaches the
//!   catalog after the record was published, and the catalog reads every importer's ring
//!   that holds anything unread before it applies an intent, a record or a tombstone from
//!   anywhere else ([`Catalog::settle`]; a load per importer when there is nothing). An
//!   intent too: one applied before an older record over its range would let that record
//!   name its bytes (found by `master_restart.rs`'s writers that die over a reused range);
//! - the owner reads everything before it raises its term fence, and applies it under the
//!   fence it was published under. A put whose record is in the ring may be acknowledged by
//!   the master that ended until the new master serves, and the owner hears of the new term
//!   only from the new master. A record read later, of an ended term, is refused as over
//!   TCP; its put's commit finds no put at the new master and fails;
//! - before every snapshot the owner reads everything, as for intents; a writer that dies
//!   after publishing leaves the record in the ring (the owner's memory), read when its
//!   socket closes.
//!
//! A writer whose ring stays full for `INTENT_SEND_TIMEOUT` records the rest over
//! TCP (after settling, which reads the ring, so the order holds), and writes over TCP the
//! objects whose intents did not fit.

use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::sync::{Arc, Mutex, Weak};

use protocol::Version;

use super::{le_u32, le_u64, Ring, ANNOUNCEMENT_HEADER_BYTES, ANNOUNCEMENT_MAGIC};
use crate::limits::CATALOG_RECORD_MAX_BYTES;
use crate::mem::served::ServedMemory;
use crate::mem::Dst;
use crate::recovery::catalog::{
    Catalog, CatalogRecord, PendingWrites, RecordKind, CATALOG_FLAG_VERSIONED,
};
use crate::recovery::inflight::WritePage;
use crate::sys::rawio;

/// One frame an importer sends: a catalog record about `[addr, addr + record.len)` of the
/// exporter's segment, the intent of a copy about to start or (offer version 4) the record of
/// an object whose bytes are in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Announcement<'a> {
    pub addr: u64,
    pub record: CatalogRecord<'a>,
}

impl<'a> Announcement<'a> {
    /// The intent of the put of `key` at `version` to write `[addr, addr + len)`.
    pub fn intent(addr: u64, len: u64, key: &'a str, version: Version) -> Announcement<'a> {
        Announcement {
            addr,
            record: CatalogRecord::intent(len, key, version),
        }
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::new();
        Announcement::frame(self.addr, &self.record.encode(), &mut b);
        b
    }

    /// Appends the frame of an encoded catalog record about `addr` to `out`.
    pub fn frame(addr: u64, record: &[u8], out: &mut Vec<u8>) {
        out.reserve(ANNOUNCEMENT_HEADER_BYTES + record.len());
        out.extend_from_slice(&Announcement::header(addr, record.len()));
        out.extend_from_slice(record);
    }

    /// The fixed part of the frame of an encoded catalog record of `record_len` bytes about
    /// `addr`; the record follows it.
    pub fn header(addr: u64, record_len: usize) -> [u8; ANNOUNCEMENT_HEADER_BYTES] {
        let mut h = [0u8; ANNOUNCEMENT_HEADER_BYTES];
        h[..4].copy_from_slice(&ANNOUNCEMENT_MAGIC.to_le_bytes());
        h[4..8].copy_from_slice(&(record_len as u32).to_le_bytes());
        h[8..16].copy_from_slice(&addr.to_le_bytes());
        h
    }

    /// The whole length of the announcement whose fixed part is `header`; errors say what
    /// was wrong. Never panics.
    pub fn frame_len(header: &[u8]) -> Result<usize, &'static str> {
        if header.len() < ANNOUNCEMENT_HEADER_BYTES {
            return Err("announcement header is short");
        }
        if le_u32(header, 0) != ANNOUNCEMENT_MAGIC {
            return Err("bad announcement magic");
        }
        let record = le_u32(header, 4) as u64;
        if record == 0 || record > CATALOG_RECORD_MAX_BYTES {
            return Err("announcement record length out of bounds");
        }
        Ok(ANNOUNCEMENT_HEADER_BYTES + record as usize)
    }

    /// Decodes one whole announcement: an intent or an object record (a tombstone is not
    /// announced); errors say what was wrong. Never panics.
    pub fn decode(b: &'a [u8]) -> Result<Announcement<'a>, &'static str> {
        if Announcement::frame_len(b)? != b.len() {
            return Err("announcement length is not its header's");
        }
        let record = CatalogRecord::decode(&b[ANNOUNCEMENT_HEADER_BYTES..])
            .map_err(|_| "announced record does not decode")?;
        // Every announcing writer versions its writes (a record without a version is a
        // writer's from before versions, which never announces).
        if le_u32(b, ANNOUNCEMENT_HEADER_BYTES + 8) & CATALOG_FLAG_VERSIONED == 0 {
            return Err("announced record has no version");
        }
        if record.kind == RecordKind::Tombstone {
            return Err("a tombstone is not announced");
        }
        let addr = le_u64(b, 8);
        if addr.checked_add(record.len).is_none() {
            return Err("announced range wraps");
        }
        Ok(Announcement { addr, record })
    }
}

/// One connected importer: its socket (its wake-ups and its close), its ring, and the part
/// of an announcement read from it so far.
pub(super) struct Importer {
    pub(super) conn: UnixStream,
    /// Its announcements (offer version 4); `None` for an export without a catalog.
    ring: Option<Ring>,
    /// Bytes read from the ring, being decoded (kept for their room).
    bytes: Vec<u8>,
    partial: Vec<u8>,
    /// The whole length of the announcement in `partial`, once its fixed part is in; 0 before.
    need: usize,
    /// Its end closed, or it broke the ring's rules or sent bytes that are not
    /// announcements: dropped by the export thread.
    pub(super) closed: bool,
    /// Its write page, also watched by the fence (which forgets it once this is dropped and
    /// no copy is under way).
    _page: Option<Arc<WritePage>>,
}

impl Importer {
    pub(super) fn new(
        conn: UnixStream,
        page: Option<Arc<WritePage>>,
        ring: Option<Ring>,
    ) -> Importer {
        Importer {
            conn,
            ring,
            bytes: Vec::new(),
            partial: Vec::new(),
            need: 0,
            closed: false,
            _page: page,
        }
    }

    /// Whether it published announcements not read yet.
    fn pending(&self) -> bool {
        self.ring.as_ref().is_some_and(Ring::pending)
    }

    /// Reads the importer's socket (wake-ups, which carry nothing, and its close) unless
    /// `socket` is false (a poll just found nothing there), and then its ring, and applies
    /// each whole announcement to `memory`'s catalog; whether there were any. Marks the
    /// importer closed at its socket's end of file or an error (once its ring is read), and
    /// when it broke the ring's rules or published bytes that do not decode (it sees the close
    /// and uses TCP).
    fn drain(&mut self, memory: &ServedMemory, socket: bool) -> bool {
        let mut wakes = [0u8; 64];
        let gone = socket
            && loop {
                let fd = self.conn.as_raw_fd();
                match rawio::recv(fd, &mut Dst::from(&mut wakes[..]), libc::MSG_DONTWAIT) {
                    Ok(n) if n > 0 => continue,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break false,
                    // End of file, or an error.
                    _ => break true,
                }
            };
        let read = self.read_ring(memory);
        self.closed |= gone;
        read
    }

    fn read_ring(&mut self, memory: &ServedMemory) -> bool {
        let Some(ring) = self.ring.as_mut().filter(|_| !self.closed) else {
            return false;
        };
        self.bytes.clear();
        if let Err(why) = ring.read_into(&mut self.bytes) {
            tracing::warn!("same-host importer dropped: {why}");
            self.closed = true;
            return false;
        }
        let mut got = &self.bytes[..];
        let any = !got.is_empty();
        while !got.is_empty() && !self.closed {
            let want = if self.need == 0 {
                ANNOUNCEMENT_HEADER_BYTES
            } else {
                self.need
            };
            let take = (want - self.partial.len()).min(got.len());
            self.partial.extend_from_slice(&got[..take]);
            got = &got[take..];
            if self.partial.len() < want {
                continue;
            }
            let step = if self.need == 0 {
                Announcement::frame_len(&self.partial).map(|n| self.need = n)
            } else {
                Announcement::decode(&self.partial).map(|a| apply(memory, &a))
            };
            if self.need != 0 && self.partial.len() == self.need {
                self.partial.clear();
                self.need = 0;
            }
            if let Err(why) = step {
                tracing::warn!("same-host importer dropped: {why}");
                self.closed = true;
            }
        }
        any
    }
}

/// Applies one announcement to `memory`'s catalog.
///
/// An intent drops what its write goes over whatever the fence says: its copy holds a slot
/// of the write page, which the fence waits for, so its bytes land before the re-mount and no
/// entry may name them. An object record is checked as a CATALOG_PUT is: inside registered
/// memory, of a term the fence still takes.
fn apply(memory: &ServedMemory, a: &Announcement<'_>) {
    let r = &a.record;
    if r.kind == RecordKind::Intent {
        memory
            .catalog()
            .overwrite_now(a.addr, r.len, r.key, r.version);
        return;
    }
    if let Err(e) = memory.apply_unsettled(a.addr, r) {
        // An ended term's record (its put's commit fails at the new master), or a range
        // outside the served memory (unregistered meanwhile): nothing to keep.
        tracing::debug!(key = r.key, "same-host record not applied: {e:?}");
    }
}

/// The importers of one export; their announcements are applied by the export thread as they
/// come and by the catalog before every snapshot, fence raise and record from elsewhere
/// ([`PendingWrites`]).
pub(super) struct Importers {
    pub(super) list: Mutex<Vec<Importer>>,
    /// The memory whose catalog they write (the export thread holds it).
    pub(super) memory: Weak<ServedMemory>,
}

impl Importers {
    pub(super) fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Importer>> {
        self.list.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Drains the importers `which` picks; whether any had announcements.
    pub(super) fn drain(&self, which: impl Fn(&Importer) -> bool) -> bool {
        let Some(memory) = self.memory.upgrade() else {
            return false;
        };
        let mut any = false;
        for i in self.lock().iter_mut().filter(|i| which(i)) {
            any |= i.drain(&memory, true);
        }
        any
    }

    /// Drains every importer's ring, and the sockets of those a poll found readable or
    /// closed (`readable`, in the list's order; one missing counts as readable): the others'
    /// would only answer "nothing yet", a system call each on every wake of the export thread.
    pub(super) fn drain_polled(&self, readable: &[bool]) -> bool {
        let Some(memory) = self.memory.upgrade() else {
            return false;
        };
        let mut any = false;
        for (k, i) in self.lock().iter_mut().enumerate() {
            any |= i.drain(&memory, readable.get(k).copied().unwrap_or(true));
        }
        any
    }
}

impl PendingWrites for Importers {
    fn apply_pending(&self, _catalog: &Catalog) {
        self.drain(|_| true);
    }

    fn settle(&self, _catalog: &Catalog) {
        self.drain(Importer::pending);
    }
}
