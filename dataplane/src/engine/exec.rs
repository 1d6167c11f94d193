//! Running requests: a memcpy for the local segment, one kernel copy for a same-host peer
//! (`samehost`), the TCP client for other peers, and the worker threads that run
//! asynchronous batches.
//!
//! Every request is checked before any byte moves: its local range (`source`, `length`) must
//! lie inside one buffer registered with this engine, else it fails with
//! `ERR_ADDRESS_NOT_REGISTERED` (-3) and nothing is touched. For the local segment the
//! target range is checked the same way. For a peer the target range is checked by the
//! peer's server, which refuses it with -3 and leaves its memory untouched; for a same-host
//! peer, against the peer's table here, with the same -3 and nothing touched.
//!
//! The engine's transfer guard (a read lock) is held from those checks until the request's
//! I/O ends, and `unregister_memory` takes it for writing, so once `unregister_memory`
//! returns no request of this engine touches that buffer any more.
//!
//! Requests larger than [`SLICE_BYTES`] are cut into slices that the TCP client spreads over
//! the peer's lanes; a request fails if any of its slices fails (with the first slice's
//! code).

use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Mutex};

use super::config::{SLICE_BYTES, WORKER_THREADS};
use super::samehost::{Peer, PEER_LOST};
use super::segments::RemoteSegment;
use super::{Running, SegmentHandle, TransferRequest};
use crate::limits::BATCH_REQUESTS_MAX;
use crate::mem::{Dst, Src};
use crate::transport::client::TransferOp;
use crate::transport::header::Opcode;
use crate::TeError;

/// Outcome of one request: `Ok` or a negative TE code.
pub(crate) type Outcome = Result<(), i32>;

const NOT_REGISTERED: i32 = TeError::AddressNotRegistered as i32;
const INVALID: i32 = TeError::InvalidArgument as i32;

type Job = Box<dyn FnOnce() + Send + 'static>;

/// A fixed pool of threads running batch jobs in submission order.
pub(crate) struct Workers {
    tx: Mutex<Sender<Job>>,
}

impl Workers {
    pub(crate) fn start() -> std::io::Result<Workers> {
        let (tx, rx) = channel::<Job>();
        let rx = Arc::new(Mutex::new(rx));
        for i in 0..WORKER_THREADS {
            let rx = Arc::clone(&rx);
            std::thread::Builder::new()
                .name(format!("te-worker-{i}"))
                .spawn(move || worker_loop(&rx))?;
        }
        Ok(Workers { tx: Mutex::new(tx) })
    }

    /// Queues `job`; runs it on the calling thread if the pool is gone.
    pub(crate) fn spawn(&self, job: Job) {
        let sent = self.tx.lock().unwrap_or_else(|e| e.into_inner()).send(job);
        if let Err(returned) = sent {
            (returned.0)();
        }
    }
}

fn worker_loop(rx: &Mutex<Receiver<Job>>) {
    loop {
        let job = rx.lock().unwrap_or_else(|e| e.into_inner()).recv();
        match job {
            Ok(job) => job(),
            Err(_) => return, // every sender is gone: the engine was dropped
        }
    }
}

/// `[addr, addr + len)` does not wrap and fits in `usize`.
fn valid_range(addr: u64, len: u64) -> bool {
    addr.checked_add(len).is_some() && usize::try_from(len).is_ok()
}

impl Running {
    /// Runs `reqs` (all to the segment `handle`) and returns one outcome per request.
    pub(crate) fn execute(&self, handle: SegmentHandle, reqs: &[TransferRequest]) -> Vec<Outcome> {
        let _guard = self.guard.read().unwrap_or_else(|e| e.into_inner());
        let mut out: Vec<Outcome> = vec![Ok(()); reqs.len()];
        for (i, r) in reqs.iter().enumerate() {
            if r.length == 0 {
                continue; // upstream: zero-length requests complete without I/O
            }
            out[i] = if !valid_range(r.source, r.length)
                || !valid_range(r.target_offset, r.length)
                || !matches!(r.opcode, Opcode::Read | Opcode::Write)
            {
                // CATALOG_PUT and FENCE are store-client requests, not transfers.
                Err(INVALID)
            } else if !self.memory.check(r.source, r.length) {
                Err(NOT_REGISTERED)
            } else {
                Ok(())
            };
        }
        if handle == SegmentHandle::LOCAL {
            self.run_local(reqs, &mut out);
            return out;
        }
        match self.remote(handle) {
            Ok(seg) => {
                let done = (seg.same_host.as_ref())
                    .map_or(0, |p| self.run_same_host(handle, p, reqs, &mut out));
                if done < reqs.len() {
                    self.run_remote(handle, &seg, &reqs[done..], &mut out[done..]);
                }
            }
            Err(e) => {
                for (o, r) in out.iter_mut().zip(reqs) {
                    if o.is_ok() && r.length > 0 {
                        *o = Err(e.code().code());
                    }
                }
            }
        }
        out
    }

    fn run_local(&self, reqs: &[TransferRequest], out: &mut [Outcome]) {
        for (r, o) in reqs.iter().zip(out.iter_mut()) {
            if o.is_err() || r.length == 0 {
                continue;
            }
            if !self.memory.check(r.target_offset, r.length) {
                *o = Err(NOT_REGISTERED);
                continue;
            }
            let (src, dst) = match r.opcode {
                Opcode::Write => (r.source, r.target_offset),
                Opcode::Read => (r.target_offset, r.source),
                Opcode::CatalogPut | Opcode::Fence => continue, // refused in `execute`
            };
            // SAFETY: both ranges were just found inside buffers registered with this engine
            // (checked above and in `execute`), whose registrants vouched (register_memory's
            // contract) that they stay mapped and writable while registered; the transfer
            // guard keeps them registered until this copy ends. `copy` allows overlap.
            unsafe {
                std::ptr::copy(src as *const u8, dst as *mut u8, r.length as usize);
            }
        }
    }

    fn run_remote(
        &self,
        handle: SegmentHandle,
        seg: &RemoteSegment,
        reqs: &[TransferRequest],
        out: &mut [Outcome],
    ) {
        if self.run_rdma(handle, seg, reqs, out) {
            return;
        }
        let client = match seg.client(self.client_config()) {
            Ok(c) => c,
            Err(e) => {
                self.segments.invalidate(handle.0);
                for (o, r) in out.iter_mut().zip(reqs) {
                    if o.is_ok() && r.length > 0 {
                        *o = Err(e.code().code());
                    }
                }
                return;
            }
        };
        let mut ops: Vec<TransferOp<'_>> = Vec::new();
        let mut owner: Vec<usize> = Vec::new();
        for (i, r) in reqs.iter().enumerate() {
            if out[i].is_err() || r.length == 0 {
                continue;
            }
            let mut off = 0u64;
            while off < r.length {
                let n = SLICE_BYTES.min(r.length - off);
                let local = (r.source + off) as *mut u8;
                let remote_addr = r.target_offset + off;
                ops.push(match r.opcode {
                    Opcode::Read => TransferOp::Read {
                        remote_addr,
                        // SAFETY: [source, source+length) lies inside one registered buffer
                        // (checked in `execute`), mapped while registered by register_memory's
                        // contract, and the transfer guard keeps it registered until this
                        // function returns, which `ops` does not outlive. No reference is formed
                        // over it, so a submission whose READ destinations overlap only garbles
                        // its own bytes (as upstream's).
                        dst: unsafe { Dst::from_raw(local, n as usize) },
                    },
                    Opcode::Write => TransferOp::Write {
                        remote_addr,
                        // SAFETY: as for `Read` above; the bytes are only read.
                        src: unsafe { Src::from_raw(local, n as usize) },
                    },
                    Opcode::CatalogPut | Opcode::Fence => break, // refused in `execute`
                });
                owner.push(i);
                off += n;
            }
        }
        let mut connection_lost = false;
        let mut at = 0;
        for chunk in ops.chunks_mut(BATCH_REQUESTS_MAX) {
            let results = client.submit(chunk);
            for (k, res) in results.into_iter().enumerate() {
                if let Err(e) = res {
                    let i = owner[at + k];
                    if out[i].is_ok() {
                        out[i] = Err(e.code());
                    }
                    if !matches!(e, crate::transport::client::TransferError::Refused { .. }) {
                        connection_lost = true;
                    }
                }
            }
            at += chunk.len();
        }
        if connection_lost {
            // The peer may have gone or moved: fetch its descriptor again on next use.
            self.segments.invalidate(handle.0);
        }
    }

    /// Runs `reqs` to a same-host peer by cross-memory attach (`samehost`): each target
    /// range is checked against the peer's live table under the reader's busy mark, then
    /// copied by the kernel. Returns how many requests it handled: all of them, or those
    /// before the first one that found the peer's table overflowed, the rest untouched for
    /// TCP.
    fn run_same_host(
        &self,
        handle: SegmentHandle,
        peer: &Peer,
        reqs: &[TransferRequest],
        out: &mut [Outcome],
    ) -> usize {
        let busy = peer.begin();
        let mut lost = !peer.alive();
        let mut handled = reqs.len();
        for (i, (r, o)) in reqs.iter().zip(out.iter_mut()).enumerate() {
            if o.is_err() || r.length == 0 {
                continue;
            }
            if lost {
                *o = Err(PEER_LOST);
                continue;
            }
            match peer.check(r.target_offset, r.length) {
                Ok(Some(true)) => {}
                Ok(Some(false)) => {
                    *o = Err(NOT_REGISTERED);
                    continue;
                }
                Ok(None) => {
                    handled = i;
                    break;
                }
                Err(()) => {
                    lost = true;
                    *o = Err(PEER_LOST);
                    continue;
                }
            }
            let local = r.source as *mut u8;
            let n = r.length as usize;
            // SAFETY: [source, source+length) lies inside one buffer registered with this
            // engine (checked in `execute`), mapped while registered by register_memory's
            // contract, and the transfer guard keeps it registered until this returns. The
            // remote range is the peer's, checked against its table under `busy`; the kernel
            // checks its mapping.
            let res = unsafe {
                match r.opcode {
                    Opcode::Read => peer.read(r.target_offset, Dst::from_raw(local, n)),
                    _ => peer.write(r.target_offset, Src::from_raw(local, n)),
                }
            };
            if let Err(e) = res {
                tracing::warn!("same-host copy of {n} bytes failed: {e}");
                lost = true;
                *o = Err(PEER_LOST);
            }
        }
        drop(busy);
        if lost {
            // The peer died or broke its table: fetch its descriptor again on next use.
            self.segments.invalidate(handle.0);
        }
        handled
    }
}
