//! A disk worker: one thread, its own ring and bounce buffers, its own subdirectory.
//!
//! Objects belong to workers by address ([`super::worker_of`]); every operation on an
//! object's file (write, read, delete) runs on its worker's thread, one after the other, so
//! no two threads ever touch one file and the index entry of an address changes only on its
//! worker. Callers send a request over the worker's channel and block for the answer; the
//! caller's bytes ([`Src`]/[`Dst`]) travel with the request and are used only until the
//! answer is sent.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{Receiver, SyncSender};
use std::sync::Arc;

use dataplane::mem::{Dst, Src};
use protocol::Version;

use super::format::{self, FileHeader};
use super::io::{Dir, Io, Piece};
use super::limits::{DISK_BOUNCE_BYTES, DISK_STREAM_PIECE_BYTES, DISK_WORKER_BUFFERS};
use super::{bump, now_ms, DiskError, Entry, Pins, Shared};

/// What a worker is asked.
pub(super) enum Op {
    Write {
        addr: u64,
        key: String,
        version: Version,
        pins: Pins,
        src: Src<'static>,
    },
    Read {
        start: u64,
        offset: u64,
        dst: Dst<'static>,
        /// A streamed read (the listener's): told after each batch how much of `dst` is
        /// filled, and read in smaller pieces so that sending overlaps reading.
        progress: Option<Progress>,
    },
    /// Delete the object at `addr`; with `tomb`, only if it is that key at or below that
    /// version. Answers whether it deleted.
    Delete {
        addr: u64,
        tomb: Option<(String, Version)>,
    },
}

/// How far a streamed read has filled its destination: bytes from its start, published
/// (`Release`) after they are copied, and the thread to wake.
#[derive(Clone)]
pub(super) struct Progress {
    pub filled: Arc<std::sync::atomic::AtomicU64>,
    pub wake: std::thread::Thread,
}

impl Progress {
    pub(super) fn publish(&self, filled: u64) {
        self.filled.store(filled, Ordering::Release);
        self.wake.unpark();
    }
}

pub(super) enum Answer {
    Done(Result<(), DiskError>),
    Deleted(bool),
}

pub(super) struct Request {
    pub op: Op,
    pub reply: SyncSender<Answer>,
}

pub(super) struct Worker {
    pub dir: PathBuf,
    pub shared: Arc<Shared>,
    pub io: Io,
    /// Callers waiting in the queue for something other than a write.
    pub urgent: Arc<super::priority::Urgent>,
}

impl Worker {
    pub(super) fn run(mut self, rx: Receiver<Request>) {
        let mut priority = super::priority::Priority::probe(
            self.shared.cfg.write_priority,
            Arc::clone(&self.urgent),
        );
        while let Ok(req) = rx.recv() {
            let write = matches!(req.op, Op::Write { .. });
            if !write {
                self.urgent.taken();
            }
            priority.set_background(write);
            let answer = match req.op {
                Op::Write {
                    addr,
                    key,
                    version,
                    pins,
                    src,
                } => Answer::Done(self.write(addr, &key, version, pins, src)),
                Op::Read {
                    start,
                    offset,
                    dst,
                    progress,
                } => Answer::Done(self.read(start, offset, dst, progress.as_ref())),
                Op::Delete { addr, tomb } => Answer::Deleted(self.delete(addr, tomb)),
            };
            // The caller waits for this; if it is gone there is nobody to tell.
            let _ = req.reply.send(answer);
        }
    }

    fn path(&self, addr: u64) -> PathBuf {
        self.dir.join(format::object_name(addr))
    }

    pub(super) fn open(&self, path: &PathBuf, write: bool) -> io::Result<File> {
        let mut o = OpenOptions::new();
        if write {
            o.write(true).create(true).truncate(true).mode(0o600);
        } else {
            o.read(true);
        }
        if self.shared.direct {
            o.custom_flags(libc::O_DIRECT);
        }
        o.open(path)
    }

    fn write(
        &mut self,
        addr: u64,
        key: &str,
        version: Version,
        pins: Pins,
        src: Src<'static>,
    ) -> Result<(), DiskError> {
        let sh = Arc::clone(&self.shared);
        let mut header = FileHeader {
            key: key.to_string(),
            version,
            size: src.len() as u64,
            data_crc: 0,
            hard_pin: pins.hard,
            soft_pin_ttl_ms: pins.soft_ttl_ms,
        };
        let file_len = header.file_len();
        sh.reserve(addr, file_len)?;
        let temp = self.dir.join(format::temp_name(addr));
        let result = if self.can_write_direct(&src) {
            self.write_direct(&temp, &mut header, src)
        } else {
            self.write_file(&temp, &mut header, src)
        };
        let outcome =
            result.and_then(|physical| std::fs::rename(&temp, self.path(addr)).map(|()| physical));
        match outcome {
            Ok(physical) => {
                sh.commit(
                    addr,
                    Entry {
                        key: key.to_string(),
                        size: header.size,
                        version,
                        hard_pin: pins.hard,
                        soft_pin_ttl_ms: pins.soft_ttl_ms,
                        physical,
                        last_read_ms: 0,
                        seq: 0,
                    },
                    file_len,
                    |a| self.shared.path_of(a),
                );
                bump(&sh.stats.writes);
                sh.stats
                    .bytes_written
                    .fetch_add(header.size, Ordering::Relaxed);
                Ok(())
            }
            Err(e) => {
                sh.release(file_len);
                let _ = std::fs::remove_file(&temp);
                bump(&sh.stats.io_errors);
                Err(sh.write_failed(addr, e))
            }
        }
    }

    /// Writes the file: data first (computing its crc), then the header block at offset 0.
    /// Returns the file's physical bytes.
    fn write_file(
        &mut self,
        path: &PathBuf,
        header: &mut FileHeader,
        src: Src<'_>,
    ) -> io::Result<u64> {
        let file = self.open(path, true)?;
        let hdr_len = header.header_len();
        let mut crc = crc32fast::Hasher::new();
        let mut rest = src;
        let mut offset = hdr_len;
        while !rest.is_empty() {
            let mut pieces: Vec<Piece> = Vec::with_capacity(DISK_WORKER_BUFFERS);
            for buf in 0..DISK_WORKER_BUFFERS {
                if rest.is_empty() {
                    break;
                }
                let n = rest.len().min(DISK_BOUNCE_BYTES);
                let (now, later) = rest.split_at(n);
                rest = later;
                let padded =
                    format::round_up(n as u64).unwrap_or(DISK_BOUNCE_BYTES as u64) as usize;
                let b = self.io.buf_mut(buf);
                now.copy_to(&mut Dst::from(&mut b[..n]));
                b[n..padded].fill(0);
                crc.update(&b[..n]);
                pieces.push(Piece {
                    buf,
                    offset,
                    len: padded,
                });
                offset += padded as u64;
            }
            for r in self.io.run(&file, Dir::Write, &pieces) {
                r?;
            }
        }
        header.data_crc = crc.finalize();
        let block = header.encode();
        let b = self.io.buf_mut(0);
        b[..block.len()].copy_from_slice(&block);
        let piece = Piece {
            buf: 0,
            offset: 0,
            len: block.len(),
        };
        for r in self.io.run(&file, Dir::Write, &[piece]) {
            r?;
        }
        let meta = file.metadata()?;
        Ok(meta.blocks() * 512)
    }

    fn read(
        &mut self,
        start: u64,
        offset: u64,
        mut dst: Dst<'static>,
        progress: Option<&Progress>,
    ) -> Result<(), DiskError> {
        let sh = Arc::clone(&self.shared);
        // Looked up again here, on the address's worker: the object may have been replaced
        // (by a shorter one) or deleted since the caller found it.
        let found = sh
            .lookup(start)
            .filter(|&(_, size)| offset.saturating_add(dst.len() as u64) <= size);
        let Some((key, size)) = found else {
            return Err(DiskError::NotFound {
                addr: start + offset,
                len: dst.len() as u64,
            });
        };
        let path = self.path(start);
        let checked = self.read_checked(&path, &key, size, offset, &mut dst, progress);
        match checked {
            Ok(()) => {
                sh.touch(start, now_ms());
                bump(&sh.stats.reads);
                sh.stats
                    .bytes_read
                    .fetch_add(dst.len() as u64, Ordering::Relaxed);
                Ok(())
            }
            Err(ReadFailure::Io(e)) => {
                bump(&sh.stats.io_errors);
                Err(DiskError::Io {
                    op: "read",
                    path,
                    source: e,
                })
            }
            Err(ReadFailure::Corrupt(why)) => {
                bump(&sh.stats.checksum_failures);
                tracing::warn!(
                    addr = format_args!("{start:#x}"),
                    key = %key,
                    file = %path.display(),
                    "disk tier: {why}; file deleted, the replica is lost (readers fall back)"
                );
                let _ = std::fs::remove_file(&path);
                sh.lose(start);
                Err(DiskError::Corrupt { addr: start, why })
            }
        }
    }

    /// Reads the whole object, checks its crc and copies `[offset, offset + dst.len())` of
    /// its data into `dst` (one copy, from the bounce buffer). With `progress`, publishes
    /// after each batch how much of `dst` is filled.
    fn read_checked(
        &mut self,
        path: &PathBuf,
        key: &str,
        size: u64,
        offset: u64,
        dst: &mut Dst<'_>,
        progress: Option<&Progress>,
    ) -> Result<(), ReadFailure> {
        let file = self.open_to_read(path)?;
        if self.can_read_direct(size, offset, dst) {
            super::bump(&self.shared.stats.direct_reads);
            let expect = super::direct::Expect::Key(key);
            let checked = |filled| {
                if let Some(p) = progress {
                    p.publish(filled)
                }
            };
            return super::direct::read_direct(&mut self.io, &file, expect, size, dst, checked);
        }
        let hdr_len = format::header_len(key.len());
        let file_len = hdr_len + format::round_up(size).unwrap_or(u64::MAX);
        let want_end = offset + dst.len() as u64;
        let mut crc = crc32fast::Hasher::new();
        let mut stored_crc: Option<u32> = None;
        let mut pos = 0u64;
        let piece = match progress {
            Some(_) => DISK_STREAM_PIECE_BYTES,
            None => DISK_BOUNCE_BYTES,
        };
        let mut filled = 0u64;
        while pos < file_len {
            let (pieces, at) = read_batch(pos, file_len, piece);
            let results = self.io.run(&file, Dir::Read, &pieces);
            for (p, r) in pieces.iter().zip(results) {
                let n = r.map_err(ReadFailure::Io)?;
                if n < p.len {
                    return Err(ReadFailure::Corrupt(format!(
                        "file cut short: {} bytes, its header needs {file_len}",
                        p.offset + n as u64
                    )));
                }
                let b = &self.io.buf(p.buf)[..p.len];
                if p.offset == 0 {
                    stored_crc = Some(super::direct::Expect::Key(key).check(b, size)?);
                }
                // The data bytes of this piece: [lo, hi) in data offsets.
                let piece_lo = p.offset.max(hdr_len);
                let piece_hi = (p.offset + p.len as u64).min(hdr_len + size);
                if piece_lo >= piece_hi {
                    continue;
                }
                let data = &b[(piece_lo - p.offset) as usize..(piece_hi - p.offset) as usize];
                crc.update(data);
                let (lo, hi) = (piece_lo - hdr_len, piece_hi - hdr_len);
                let (c_lo, c_hi) = (lo.max(offset), hi.min(want_end));
                if c_lo < c_hi {
                    let from = &data[(c_lo - lo) as usize..(c_hi - lo) as usize];
                    Src::from(from).copy_to(&mut dst.tail((c_lo - offset) as usize));
                    filled = c_hi - offset;
                }
            }
            if let Some(p) = progress {
                p.publish(filled);
            }
            pos = at;
        }
        crc_matches(stored_crc, crc.finalize())
    }

    /// Opens an object's file for reading; a missing file is a lost copy.
    fn open_to_read(&self, path: &PathBuf) -> Result<File, ReadFailure> {
        match self.open(path, false) {
            Ok(f) => Ok(f),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                Err(ReadFailure::Corrupt("the file is missing".into()))
            }
            Err(e) => Err(ReadFailure::Io(e)),
        }
    }

    fn delete(&mut self, addr: u64, tomb: Option<(String, Version)>) -> bool {
        let sh = &self.shared;
        if !sh.matches(addr, tomb.as_ref()) {
            return false;
        }
        match std::fs::remove_file(self.path(addr)) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => {
                tracing::warn!(error = %e, addr = format_args!("{addr:#x}"),
                    "disk tier: could not delete a freed object's file");
                bump(&sh.stats.io_errors);
            }
        }
        sh.remove(addr);
        true
    }
}

/// The next batch of reads from `pos` in `file_len`: up to one piece per bounce buffer, each
/// at most a buffer long; returns the pieces and where the batch ends.
fn read_batch(pos: u64, file_len: u64, piece: usize) -> (Vec<Piece>, u64) {
    let mut pieces: Vec<Piece> = Vec::with_capacity(DISK_WORKER_BUFFERS);
    let mut at = pos;
    for buf in 0..DISK_WORKER_BUFFERS {
        if at >= file_len {
            break;
        }
        let len = (file_len - at).min(piece as u64) as usize;
        pieces.push(Piece {
            buf,
            offset: at,
            len,
        });
        at += len as u64;
    }
    (pieces, at)
}

/// Whether the data's checksum is the one its header stored.
pub(super) fn crc_matches(stored: Option<u32>, computed: u32) -> Result<(), ReadFailure> {
    match stored {
        Some(stored) if stored == computed => Ok(()),
        Some(stored) => Err(ReadFailure::Corrupt(format!(
            "data checksum {computed:#010x} does not match the header's {stored:#010x}"
        ))),
        None => Err(ReadFailure::Corrupt("no header".into())),
    }
}

pub(super) enum ReadFailure {
    Io(io::Error),
    Corrupt(String),
}
