//! The dummy side: a process that owns no segment and no master connection, and puts and gets
//! through a standalone `mooncake_client` on the same host.
//!
//! At connect the dummy maps one shared region (a memfd) of `mem_pool_size +
//! local_buffer_size` bytes, exports it under a same-host name (`dataplane::mem::shm`) and
//! says so in its `Hello`; the standalone client maps the same pages. Memory handed out by
//! [`DummyClient::alloc`] (`alloc_from_mem_pool`) lies in the region, so puts from and gets
//! into it move no byte in this process; any other buffer is staged through a temporary
//! allocation in the region (one memcpy). Calls on one client are serialised on its one
//! connection.
//!
//! When the standalone client goes away the connection ends: the call in flight and every
//! later call fail at once with `RPC_FAIL` and a logged reason (never a hang; a standalone
//! client that is alive but stuck is bounded by [`REPLY_TIMEOUT`]).

use std::collections::BTreeMap;
use std::io;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixStream};

use dataplane::mem::shm::{Guards, Offer, ShmExport};
use dataplane::mem::{Dst, Segment, SegmentOptions, Src};
use parking_lot::Mutex;
use protocol::wire::Wire;
use protocol::{ErrorCode, ReplicateConfig, TaskInfo, Uuid};

use super::wire::{
    read_frame, write_frame, Item, Range, RangeRead, Request, Response, WIRE_VERSION,
};
use crate::limits::REPLY_TIMEOUT;

/// Allocation granularity in the shared region.
const ALIGN: u64 = 64;

/// First-fit allocator over `[0, len)` offsets of the region.
#[derive(Debug)]
struct Alloc {
    free: BTreeMap<u64, u64>,
}

impl Alloc {
    fn new(len: u64) -> Alloc {
        let mut free = BTreeMap::new();
        if len > 0 {
            free.insert(0, len);
        }
        Alloc { free }
    }

    fn alloc(&mut self, size: u64) -> Option<u64> {
        let size = size.max(1).checked_add(ALIGN - 1)? / ALIGN * ALIGN;
        let (&off, &len) = self.free.iter().find(|(_, &l)| l >= size)?;
        self.free.remove(&off);
        if len > size {
            self.free.insert(off + size, len - size);
        }
        Some(off)
    }

    fn release(&mut self, off: u64, size: u64) {
        let mut size = size.max(1).div_ceil(ALIGN) * ALIGN;
        let mut off = off;
        if let Some((&next, &nlen)) = self.free.range(off + size..).next() {
            if next == off + size {
                self.free.remove(&next);
                size += nlen;
            }
        }
        if let Some((&prev, &plen)) = self.free.range(..off).next_back() {
            if prev + plen == off {
                self.free.remove(&prev);
                off = prev;
                size += plen;
            }
        }
        self.free.insert(off, size);
    }
}

struct Conn {
    stream: UnixStream,
    /// Why the connection is unusable, once it is.
    dead: Option<String>,
}

/// A dummy client connected to a standalone `mooncake_client`.
pub struct DummyClient {
    conn: Mutex<Conn>,
    /// Dropped after the connection: the standalone client unmaps first.
    _export: ShmExport,
    region: Segment,
    alloc: Mutex<Alloc>,
    hostname: String,
    server: String,
}

/// A temporary allocation in the region, released when dropped.
struct Staged<'c> {
    client: &'c DummyClient,
    off: u64,
    len: u64,
}

impl Staged<'_> {
    fn addr(&self) -> u64 {
        self.client.base() + self.off
    }
    /// The staged bytes, as a raw range: the real client's process maps the same pages.
    fn dst(&mut self) -> Dst<'_> {
        // SAFETY: [off, off + len) lies inside the region (the allocator hands out only such
        // ranges), which stays mapped while the client lives, and is ours alone until this
        // value is dropped; the `Dst` borrows it.
        unsafe {
            Dst::from_raw(
                self.client.region.as_ptr().add(self.off as usize),
                self.len as usize,
            )
        }
    }
}

/// Where the server writes each read of one batch: caller memory inside the region directly,
/// other caller memory through a staging range that is copied out after the call.
#[derive(Default)]
struct Destinations<'c> {
    /// (index of the read, caller address, staging).
    staged: Vec<(usize, u64, Staged<'c>)>,
}

impl<'c> Destinations<'c> {
    /// The address the server should write read `i`'s `len` bytes to, for caller memory at
    /// `addr`.
    fn place(
        &mut self,
        client: &'c DummyClient,
        i: usize,
        addr: u64,
        len: u64,
    ) -> Result<u64, ErrorCode> {
        if client.in_region(addr, len) {
            return Ok(addr);
        }
        let s = client.stage(len)?;
        let at = s.addr();
        self.staged.push((i, addr, s));
        Ok(at)
    }

    /// Copies every staged read that got `out[i] > 0` bytes out to its caller address.
    ///
    /// # Safety
    /// Each staged read's caller range `[addr, addr + len)` is writable memory the caller
    /// owns for the call.
    unsafe fn copy_out(&mut self, out: &[i64]) {
        for (i, addr, s) in &mut self.staged {
            let got = out[*i];
            if got > 0 {
                let mut src = s.dst();
                let n = (got as usize).min(src.len());
                // SAFETY: this function's contract; n <= len; src is our staging, disjoint
                // from caller memory outside the region.
                unsafe { std::ptr::copy_nonoverlapping(src.as_mut_ptr(), *addr as *mut u8, n) };
            }
        }
    }
}

impl Drop for Staged<'_> {
    fn drop(&mut self) {
        self.client.alloc.lock().release(self.off, self.len);
    }
}

/// The port of a `host:port` (or bare port) server address.
pub fn parse_server_port(server_address: &str) -> Result<u16, String> {
    let s = server_address.trim();
    let port = s.rsplit_once(':').map(|(_, p)| p).unwrap_or(s);
    port.parse::<u16>()
        .ok()
        .filter(|p| *p != 0)
        .ok_or_else(|| format!("server_address {server_address:?}: expected host:port"))
}

impl DummyClient {
    /// Connects to the standalone client serving `server_address` (`host:port`, its
    /// `--host`/`--port`; it must run on this host) with a region of `mem_pool_size +
    /// local_buffer_size` bytes. The error carries a code and the reason.
    pub fn connect(
        mem_pool_size: u64,
        local_buffer_size: u64,
        server_address: &str,
    ) -> Result<DummyClient, (ErrorCode, String)> {
        let bad = |why: String| (ErrorCode::InvalidParams, why);
        let port = parse_server_port(server_address).map_err(bad)?;
        let total = mem_pool_size
            .checked_add(local_buffer_size)
            .filter(|t| *t > 0 && usize::try_from(*t).is_ok())
            .ok_or_else(|| {
                bad(format!(
                    "mem_pool_size + local_buffer_size = {mem_pool_size} + {local_buffer_size}: \
                     must be positive and addressable"
                ))
            })?;
        let region = Segment::new_shared(total as usize, SegmentOptions::default())
            .map_err(|e| bad(format!("cannot map a shared region of {total} bytes: {e}")))?;
        let fd = region.shared_fd().ok_or_else(|| {
            (
                ErrorCode::InternalError,
                "no memfd for the shared region (memfd_create refused)".to_string(),
            )
        })?;
        let shm_name = format!(
            "dummy/{}/{:x}",
            std::process::id(),
            protocol::Uuid::random().lo
        );
        let offer = Offer {
            base: region.addr() as u64,
            len: region.len() as u64,
            guards: Guards::None,
        };
        let export = ShmExport::start(&shm_name, fd, offer, None).map_err(|e| {
            (
                ErrorCode::InternalError,
                format!("cannot offer the shared region: {e}"),
            )
        })?;
        let gone = |e: io::Error| {
            (
                ErrorCode::InternalError,
                format!(
                    "no standalone mooncake_client serving dummy clients at {server_address} \
                     on this host: {e}"
                ),
            )
        };
        let addr = SocketAddr::from_abstract_name(super::wire::socket_name(port).as_bytes())
            .map_err(gone)?;
        let mut stream = UnixStream::connect_addr(&addr).map_err(gone)?;
        // The name belongs to the network namespace, not to a user: a process of another user
        // could hold it and see our keys and sizes. Only ours or root's is a standalone client.
        if !dataplane::sys::unix::peer_is_trusted(&stream) {
            return Err((
                ErrorCode::InternalError,
                format!(
                    "the process serving dummy clients at {server_address} runs as another \
                     user: refused"
                ),
            ));
        }
        stream.set_read_timeout(Some(REPLY_TIMEOUT)).map_err(gone)?;
        let hello = Request::Hello {
            version: WIRE_VERSION,
            shm_name,
            base: offer.base,
            len: offer.len,
        };
        write_frame(&mut stream, &hello).map_err(gone)?;
        let answer = read_frame(&mut stream)
            .map_err(gone)?
            .ok_or_else(|| gone(io::ErrorKind::UnexpectedEof.into()))?;
        let hostname = match Response::from_bytes(&answer) {
            Ok(Response::Welcome { hostname, .. }) => hostname,
            Ok(Response::Refused { code, why }) => {
                let code = ErrorCode::from_i32(code).unwrap_or(ErrorCode::InternalError);
                return Err((code, format!("standalone client refused: {why}")));
            }
            Ok(other) => return Err(bad(format!("unexpected answer to Hello: {other:?}"))),
            Err(e) => return Err(bad(format!("undecodable answer to Hello: {e}"))),
        };
        Ok(DummyClient {
            conn: Mutex::new(Conn { stream, dead: None }),
            _export: export,
            alloc: Mutex::new(Alloc::new(region.len() as u64)),
            region,
            hostname,
            server: server_address.to_string(),
        })
    }

    /// The standalone client's name.
    pub fn hostname(&self) -> &str {
        &self.hostname
    }

    fn base(&self) -> u64 {
        self.region.addr() as u64
    }

    /// The shared region, `(base, len)`.
    pub fn region(&self) -> (u64, u64) {
        (self.base(), self.region.len() as u64)
    }

    /// Whether `[addr, addr + len)` lies in the shared region.
    pub fn in_region(&self, addr: u64, len: u64) -> bool {
        addr >= self.base()
            && addr
                .checked_add(len)
                .is_some_and(|end| end <= self.base() + self.region.len() as u64)
    }

    /// `alloc_from_mem_pool`: `size` bytes of the shared region, for the life of the client
    /// (0 when the region is full).
    pub fn alloc(&self, size: u64) -> u64 {
        match self.alloc.lock().alloc(size) {
            Some(off) => self.base() + off,
            None => 0,
        }
    }

    fn stage(&self, len: u64) -> Result<Staged<'_>, ErrorCode> {
        let off = self.alloc.lock().alloc(len).ok_or_else(|| {
            tracing::error!(
                "dummy client: {len} bytes do not fit in the free part of the shared region \
                 (raise local_buffer_size)"
            );
            ErrorCode::BufferOverflow
        })?;
        Ok(Staged {
            client: self,
            off,
            len,
        })
    }

    /// One round trip; `RPC_FAIL` (logged) once the standalone client is gone.
    fn exchange(&self, req: &Request) -> Result<Response, ErrorCode> {
        let mut c = self.conn.lock();
        if let Some(why) = &c.dead {
            tracing::error!("dummy client: {why}");
            return Err(ErrorCode::RpcFail);
        }
        let answer = write_frame(&mut c.stream, req).and_then(|_| {
            read_frame(&mut c.stream)?.ok_or_else(|| io::ErrorKind::UnexpectedEof.into())
        });
        let answer = match answer {
            Ok(a) => a,
            Err(e) => {
                let why = format!(
                    "the standalone mooncake_client at {} is gone ({e}); set up again",
                    self.server
                );
                tracing::error!("dummy client: {why}");
                c.dead = Some(why);
                let _ = c.stream.shutdown(std::net::Shutdown::Both);
                return Err(ErrorCode::RpcFail);
            }
        };
        match Response::from_bytes(&answer) {
            Ok(Response::Refused { code, why }) => {
                tracing::error!("dummy client: request refused: {why}");
                Err(ErrorCode::from_i32(code).unwrap_or(ErrorCode::InternalError))
            }
            Ok(r) => Ok(r),
            Err(e) => {
                let why = format!("undecodable answer ({e:?})");
                tracing::error!("dummy client: {why}");
                c.dead = Some(why);
                Err(ErrorCode::RpcFail)
            }
        }
    }

    /// [`Self::exchange`] for the requests answered with codes.
    fn call(&self, req: &Request) -> Result<Vec<i64>, ErrorCode> {
        match self.exchange(req)? {
            Response::Codes(v) => Ok(v),
            other => Err(self.unexpected(&other)),
        }
    }

    /// An answer of the wrong kind: the connection is not trusted any more.
    fn unexpected(&self, answer: &Response) -> ErrorCode {
        let why = format!("unexpected answer {answer:?}");
        tracing::error!("dummy client: {why}");
        self.conn.lock().dead = Some(why);
        ErrorCode::RpcFail
    }

    /// The one code of a request answered with a value or a code.
    fn failure(&self, answer: &Response) -> ErrorCode {
        match answer {
            Response::Codes(v) if v.len() == 1 && v[0] < 0 => {
                ErrorCode::from_i32(v[0] as i32).unwrap_or(ErrorCode::InternalError)
            }
            other => self.unexpected(other),
        }
    }

    fn call_n(&self, req: &Request, n: usize) -> Vec<i64> {
        match self.call(req) {
            Ok(v) if v.len() == n => v,
            Ok(_) => vec![i64::from(ErrorCode::RpcFail.code()); n],
            Err(e) => vec![i64::from(e.code()); n],
        }
    }

    fn call_one(&self, req: &Request) -> i64 {
        self.call_n(req, 1)[0]
    }

    /// Stages `parts` unless they all lie in the region already; returns the ranges to send
    /// and the staging to keep alive until the answer.
    fn ranges_of(&self, parts: &[Src<'_>]) -> Result<(Vec<Range>, Option<Staged<'_>>), ErrorCode> {
        if parts.iter().all(|p| self.holds(p)) {
            return Ok((parts.iter().map(range_of).collect(), None));
        }
        let (range, s) = self.stage_all(parts)?;
        Ok((vec![range], Some(s)))
    }

    /// [`Self::ranges_of`] as one range (a batch item has one): staged unless `parts` is a
    /// single part already in the region.
    fn one_range_of(&self, parts: &[Src<'_>]) -> Result<(Range, Option<Staged<'_>>), ErrorCode> {
        match parts {
            [] => Ok((range_of(&Src::empty()), None)),
            [one] if self.holds(one) => Ok((range_of(one), None)),
            _ => self.stage_all(parts).map(|(r, s)| (r, Some(s))),
        }
    }

    fn holds(&self, part: &Src<'_>) -> bool {
        self.in_region(part.addr(), part.len() as u64)
    }

    /// The concatenation of `parts`, copied into a fresh staging range of the region.
    fn stage_all(&self, parts: &[Src<'_>]) -> Result<(Range, Staged<'_>), ErrorCode> {
        let total: u64 = parts.iter().map(|p| p.len() as u64).sum();
        let mut s = self.stage(total)?;
        let mut dst = s.dst();
        let mut at = 0;
        for p in parts {
            p.copy_to(&mut dst.tail(at));
            at += p.len();
        }
        let range = Range {
            addr: s.addr(),
            len: total,
        };
        Ok((range, s))
    }

    /// `put` / `upsert` of the concatenation of `parts`: 0 or a code.
    pub fn put(&self, key: &str, parts: &[Src<'_>], cfg: &ReplicateConfig, upsert: bool) -> i32 {
        let (ranges, _staged) = match self.ranges_of(parts) {
            Ok(x) => x,
            Err(e) => return e.code(),
        };
        let r = self.call_one(&Request::Put {
            upsert,
            config: cfg.clone(),
            key: key.to_string(),
            parts: ranges,
        });
        r as i32
    }

    /// Batch put / upsert: 0 or a code per key.
    pub fn put_many(
        &self,
        keys: &[String],
        values: &[Src<'_>],
        cfg: &ReplicateConfig,
        upsert: bool,
    ) -> Vec<i32> {
        let parts: Vec<[Src<'_>; 1]> = values.iter().map(|v| [*v]).collect();
        let parts: Vec<&[Src<'_>]> = parts.iter().map(|p| &p[..]).collect();
        self.put_many_parts(keys, &parts, cfg, upsert)
    }

    /// Batch put / upsert where each object is the concatenation of its parts (staged into
    /// one range unless it is a single part already in the region): 0 or a code per key.
    pub fn put_many_parts(
        &self,
        keys: &[String],
        objects: &[&[Src<'_>]],
        cfg: &ReplicateConfig,
        upsert: bool,
    ) -> Vec<i32> {
        if keys.len() != objects.len() {
            return vec![ErrorCode::InvalidParams.code(); keys.len().max(objects.len())];
        }
        let mut staged = Vec::new();
        let mut items = Vec::with_capacity(keys.len());
        for (k, parts) in keys.iter().zip(objects) {
            let (range, s) = match self.one_range_of(parts) {
                Ok(x) => x,
                Err(e) => return vec![e.code(); keys.len()],
            };
            staged.extend(s);
            items.push(Item {
                key: k.clone(),
                addr: range.addr,
                len: range.len,
            });
        }
        self.call_n(
            &Request::BatchPut {
                upsert,
                config: cfg.clone(),
                items,
            },
            keys.len(),
        )
        .into_iter()
        .map(|c| c as i32)
        .collect()
    }

    /// Sizes (or codes) of `keys`.
    pub fn get_sizes(&self, keys: &[String]) -> Vec<i64> {
        self.call_n(
            &Request::GetSize {
                keys: keys.to_vec(),
            },
            keys.len(),
        )
    }

    /// Whole objects, or a code each.
    pub fn get_many(&self, keys: &[String]) -> Vec<Result<Vec<u8>, ErrorCode>> {
        let sizes = self.get_sizes(keys);
        let code = |c: i64| ErrorCode::from_i32(c as i32).unwrap_or(ErrorCode::InternalError);
        let mut staged: Vec<Option<Staged<'_>>> = Vec::with_capacity(keys.len());
        let mut items = Vec::new();
        let mut out: Vec<Result<Vec<u8>, ErrorCode>> = Vec::with_capacity(keys.len());
        for (k, &size) in keys.iter().zip(&sizes) {
            if size < 0 {
                out.push(Err(code(size)));
                staged.push(None);
                continue;
            }
            match self.stage(size as u64) {
                Ok(s) => {
                    items.push(Item {
                        key: k.clone(),
                        addr: s.addr(),
                        len: size as u64,
                    });
                    staged.push(Some(s));
                    out.push(Ok(Vec::new()));
                }
                Err(e) => {
                    out.push(Err(e));
                    staged.push(None);
                }
            }
        }
        if items.is_empty() {
            return out;
        }
        let n = items.len();
        let got = self.call_n(&Request::GetInto { items }, n);
        let mut got = got.into_iter();
        for (o, s) in out.iter_mut().zip(staged.iter_mut()) {
            let Some(s) = s else { continue };
            let g = got.next().unwrap_or(i64::from(ErrorCode::RpcFail.code()));
            *o = if g < 0 {
                Err(code(g))
            } else {
                let bytes = s.dst();
                let n = (g as usize).min(bytes.len());
                Ok(bytes.as_src().split_at(n).0.to_vec())
            };
        }
        out
    }

    /// `get_into` for each `(key, addr, len)`: the size read, or a code. Buffers outside the
    /// region are staged (the caller guarantees each is writable for `len` bytes).
    pub fn get_into_many(&self, reads: &[(String, u64, u64)]) -> Vec<i64> {
        let direct = reads.iter().all(|(_, a, l)| self.in_region(*a, *l));
        if direct {
            let items = reads
                .iter()
                .map(|(k, a, l)| Item {
                    key: k.clone(),
                    addr: *a,
                    len: *l,
                })
                .collect();
            return self.call_n(&Request::GetInto { items }, reads.len());
        }
        // Stage only what each object needs: ask the sizes first.
        let keys: Vec<String> = reads.iter().map(|(k, _, _)| k.clone()).collect();
        let sizes = self.get_sizes(&keys);
        let mut out = vec![0i64; reads.len()];
        let mut dsts = Destinations::default();
        let mut items = Vec::new();
        let mut at = Vec::new();
        for (i, ((k, addr, cap), &size)) in reads.iter().zip(&sizes).enumerate() {
            if size < 0 {
                out[i] = size;
                continue;
            }
            if size as u64 > *cap {
                out[i] = i64::from(ErrorCode::InvalidParams.code());
                continue;
            }
            match dsts.place(self, i, *addr, size as u64) {
                Ok(dst) => {
                    items.push(Item {
                        key: k.clone(),
                        addr: dst,
                        len: size as u64,
                    });
                    at.push(i);
                }
                Err(e) => out[i] = i64::from(e.code()),
            }
        }
        if items.is_empty() {
            return out;
        }
        let got = self.call_n(&Request::GetInto { items }, at.len());
        for (i, g) in at.into_iter().zip(got) {
            out[i] = g;
        }
        // SAFETY: the caller guarantees each [addr, addr + cap) is writable memory it owns for
        // the call, and a staged read is never longer than its cap.
        unsafe { dsts.copy_out(&out) };
        out
    }

    /// Ranged reads `(key, offset, addr, len)`: bytes `[offset, offset + len)` of each object
    /// into `[addr, addr + len)`, zero copy when that lies in the region, else staged and
    /// copied out. Per read the bytes read or a code (`INVALID_PARAMS` past the object's end).
    ///
    /// # Safety
    /// Every `[addr, addr + len)` outside the region is writable memory the caller owns for
    /// the call.
    pub unsafe fn read_ranges(&self, reads: &[(String, u64, u64, u64)]) -> Vec<i64> {
        let mut out = vec![0i64; reads.len()];
        let mut wire = Vec::with_capacity(reads.len());
        let mut at = Vec::with_capacity(reads.len());
        let mut dsts = Destinations::default();
        for (i, (key, offset, addr, len)) in reads.iter().enumerate() {
            let dst = match dsts.place(self, i, *addr, *len) {
                Ok(dst) => dst,
                Err(e) => {
                    out[i] = i64::from(e.code());
                    continue;
                }
            };
            wire.push(RangeRead {
                key: key.clone(),
                offset: *offset,
                addr: dst,
                len: *len,
            });
            at.push(i);
        }
        if wire.is_empty() {
            return out;
        }
        let n = wire.len();
        for (i, g) in at
            .into_iter()
            .zip(self.call_n(&Request::ReadRanges { reads: wire }, n))
        {
            out[i] = g;
        }
        // SAFETY: our caller guarantees each destination outside the region is writable
        // memory it owns for the call.
        unsafe { dsts.copy_out(&out) };
        out
    }

    /// `create_copy_task` (`source` `None`) / `create_move_task`: the task's id, or a code.
    pub fn create_task(
        &self,
        key: &str,
        targets: &[String],
        source: Option<&str>,
    ) -> Result<Uuid, ErrorCode> {
        match self.exchange(&Request::CreateTask {
            key: key.to_string(),
            targets: targets.to_vec(),
            source: source.map(str::to_string),
        })? {
            Response::TaskCreated { id } => Ok(id),
            other => Err(self.failure(&other)),
        }
    }

    /// `query_task`: the task's state, or a code (`TASK_NOT_FOUND`).
    pub fn query_task(&self, id: Uuid) -> Result<TaskInfo, ErrorCode> {
        match self.exchange(&Request::QueryTask { id })? {
            Response::Task(t) => Ok(t),
            other => Err(self.failure(&other)),
        }
    }

    /// 1, 0 or a code per key.
    pub fn is_exist(&self, keys: &[String]) -> Vec<i64> {
        self.call_n(
            &Request::IsExist {
                keys: keys.to_vec(),
            },
            keys.len(),
        )
    }

    /// 0 or a code per key.
    pub fn remove(&self, keys: &[String], force: bool) -> Vec<i64> {
        self.call_n(
            &Request::Remove {
                keys: keys.to_vec(),
                force,
            },
            keys.len(),
        )
    }

    pub fn remove_all(&self, force: bool) -> i64 {
        self.call_one(&Request::RemoveAll { force })
    }

    pub fn remove_by_regex(&self, pattern: &str, force: bool) -> i64 {
        self.call_one(&Request::RemoveByRegex {
            pattern: pattern.to_string(),
            force,
        })
    }

    /// The standalone client's health (0, 1 closed, 2 master unreachable), 2 when it is gone.
    pub fn health(&self) -> i32 {
        match self.call(&Request::Health) {
            Ok(v) if v.len() == 1 => v[0] as i32,
            _ => 2,
        }
    }
}

/// The range a part occupies (in this process's addresses).
fn range_of(part: &Src<'_>) -> Range {
    Range {
        addr: part.addr(),
        len: part.len() as u64,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allocator_reuses_and_coalesces() {
        let mut a = Alloc::new(1024);
        let x = a.alloc(100).unwrap();
        let y = a.alloc(100).unwrap();
        assert_ne!(x, y);
        assert!(a.alloc(1024).is_none());
        a.release(x, 100);
        a.release(y, 100);
        assert_eq!(a.alloc(1024), Some(0));
        assert!(a.alloc(1).is_none());
    }

    #[test]
    fn server_port_parses() {
        assert_eq!(parse_server_port("127.0.0.1:50052"), Ok(50052));
        assert_eq!(parse_server_port("localhost:7"), Ok(7));
        assert_eq!(parse_server_port("[::1]:9"), Ok(9));
        assert!(parse_server_port("host").is_err());
        assert!(parse_server_port("h:0").is_err());
    }
}
