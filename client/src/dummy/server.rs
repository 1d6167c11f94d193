//! The standalone client's side: serves dummy clients on [`super::wire::socket_name`].
//!
//! One accept thread, one thread per connected dummy. The [`Store`] is set up when the first
//! dummy says `Hello`. A connection starts with `Hello`: the server maps the dummy's shared region (the memfd the dummy exports through
//! `dataplane::mem::shm`), registers the mapping as a buffer of its own [`Store`] and answers
//! `Welcome`. Every later request names ranges of that region; the server translates them into
//! its mapping (bounds-checked: a range outside the region is `INVALID_PARAMS` for that item)
//! and runs the call on the [`Store`], so the bytes move between the region and the replicas
//! with no copy in the dummy. When the dummy goes (EOF, or a frame that does not decode) the
//! mapping is unregistered and dropped.
//!
//! Only a peer with this process's uid, or root, is served (`SO_PEERCRED`): the socket gives
//! the same access to the store as this process has.

use std::io;
use std::os::fd::AsRawFd;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixListener, UnixStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use dataplane::mem::shm::ShmMapping;
use dataplane::mem::{Dst, Src};
use protocol::wire::Wire;
use protocol::ErrorCode;

use super::wire::{
    read_frame, write_frame, Item, Range, RangeRead, Request, Response, WIRE_VERSION,
};
use crate::limits::{ACCEPT_POLL_MS, DUMMIES_MAX};
use crate::store::{ObjectRead, StoreError};
use crate::Store;

/// Sets up the store client dummies are served with.
pub type StoreFactory = Box<dyn Fn() -> Result<Store, ErrorCode> + Send + Sync>;

/// The store client, set up on first use and kept.
struct LazyStore {
    make: StoreFactory,
    made: parking_lot::Mutex<Option<Arc<Store>>>,
}

impl LazyStore {
    fn get(&self) -> Result<Arc<Store>, ErrorCode> {
        let mut made = self.made.lock();
        if let Some(s) = made.as_ref() {
            return Ok(s.clone());
        }
        let s = Arc::new((self.make)()?);
        *made = Some(s.clone());
        Ok(s)
    }
}

/// The dummy-client service of a standalone `mooncake_client`.
pub struct DummyServer {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    connected: Arc<AtomicUsize>,
}

impl DummyServer {
    /// Listens on the abstract socket for `port` and serves dummies with the store client
    /// `make_store` sets up when the first dummy says `Hello` (so a standalone client no dummy
    /// uses adds no client at the master). Fails if the name is taken (another standalone
    /// client with the same `--port` on this host).
    pub fn start(port: u16, make_store: StoreFactory) -> io::Result<DummyServer> {
        let store = Arc::new(LazyStore {
            make: make_store,
            made: parking_lot::Mutex::new(None),
        });
        let addr = SocketAddr::from_abstract_name(super::wire::socket_name(port).as_bytes())?;
        let listener = UnixListener::bind_addr(&addr)?;
        listener.set_nonblocking(true)?;
        let stop = Arc::new(AtomicBool::new(false));
        let connected = Arc::new(AtomicUsize::new(0));
        let (flag, count) = (stop.clone(), connected.clone());
        let thread = std::thread::Builder::new()
            .name("mc-dummy-accept".into())
            .spawn(move || accept_loop(listener, store, flag, count))?;
        Ok(DummyServer {
            stop,
            thread: Some(thread),
            connected,
        })
    }

    /// Dummy clients connected right now.
    pub fn connected(&self) -> usize {
        self.connected.load(Ordering::Relaxed)
    }
}

impl Drop for DummyServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn accept_loop(
    listener: UnixListener,
    store: Arc<LazyStore>,
    stop: Arc<AtomicBool>,
    connected: Arc<AtomicUsize>,
) {
    while !stop.load(Ordering::Acquire) {
        let mut pfd = libc::pollfd {
            fd: listener.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd for the duration of the call.
        let n = unsafe { libc::poll(&mut pfd, 1, ACCEPT_POLL_MS) };
        if n <= 0 {
            continue;
        }
        let Ok((conn, _)) = listener.accept() else {
            continue;
        };
        if !dataplane::sys::unix::peer_is_trusted(&conn) {
            tracing::warn!("dummy client refused: peer runs as another user");
            continue;
        }
        if connected.load(Ordering::Relaxed) >= DUMMIES_MAX {
            let mut c = conn;
            let _ = c.set_nonblocking(false);
            let _ = write_frame(
                &mut c,
                &Response::Refused {
                    code: ErrorCode::InternalError.code(),
                    why: format!("already serving {DUMMIES_MAX} dummy clients"),
                },
            );
            continue;
        }
        let (store, stop, count) = (store.clone(), stop.clone(), connected.clone());
        count.fetch_add(1, Ordering::Relaxed);
        let spawned = std::thread::Builder::new()
            .name("mc-dummy-conn".into())
            .spawn(move || {
                if let Err(e) = serve_one(conn, &store, &stop) {
                    tracing::info!("dummy client connection ended: {e}");
                }
                count.fetch_sub(1, Ordering::Relaxed);
            });
        if spawned.is_err() {
            connected.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

/// The dummy's region as mapped here, registered with the store while it lives.
struct Region<'s> {
    map: ShmMapping,
    local: u64,
    len: u64,
    store: &'s Store,
}

impl Region<'_> {
    /// Our address of the dummy's `[addr, addr + len)`, or `None` outside the region.
    fn local(&self, addr: u64, len: u64) -> Option<u64> {
        self.map.translate(addr, len).map(|p| p as u64)
    }

    /// The dummy's `r` as a range to read from, or `None` outside the region.
    fn src(&self, r: &Range) -> Option<Src<'_>> {
        let p = self.map.translate(r.addr, r.len)?;
        let len = usize::try_from(r.len).ok()?;
        // SAFETY: `translate` checked that the range lies inside our mapping, which lives as
        // long as `self`, and no Rust reference covers the mapping. The dummy may write the
        // same pages meanwhile; that garbles its own put (it is told, in the docs, not to),
        // nothing here.
        Some(unsafe { Src::from_raw(p, len) })
    }
}

impl Drop for Region<'_> {
    fn drop(&mut self) {
        let _ = self.store.unregister_buffer(self.local);
    }
}

fn refuse(conn: &mut UnixStream, code: ErrorCode, why: String) -> io::Result<()> {
    tracing::warn!("dummy client refused: {why}");
    write_frame(
        conn,
        &Response::Refused {
            code: code.code(),
            why,
        },
    )
}

fn serve_one(mut conn: UnixStream, lazy: &LazyStore, stop: &AtomicBool) -> io::Result<()> {
    conn.set_nonblocking(false)?;
    let Some(first) = read_frame(&mut conn)? else {
        return Ok(());
    };
    let (shm_name, base, len) = match Request::from_bytes(&first) {
        Ok(Request::Hello {
            version,
            shm_name,
            base,
            len,
        }) if version == WIRE_VERSION => (shm_name, base, len),
        Ok(Request::Hello { version, .. }) => {
            let why = format!("dummy wire version {version}, this client speaks {WIRE_VERSION}");
            return refuse(&mut conn, ErrorCode::InvalidVersion, why);
        }
        Ok(_) => {
            let why = "first request is not Hello".to_string();
            return refuse(&mut conn, ErrorCode::InvalidParams, why);
        }
        Err(e) => {
            return refuse(
                &mut conn,
                ErrorCode::InvalidParams,
                format!("bad Hello: {e}"),
            )
        }
    };
    let store = match lazy.get() {
        Ok(s) => s,
        Err(e) => {
            let why = format!("this standalone client's store client cannot be set up: {e}");
            return refuse(&mut conn, e, why);
        }
    };
    let store: &Store = &store;
    let map = match ShmMapping::import(&shm_name) {
        Ok(Some(m)) => m,
        Ok(None) => {
            let why = format!("no shared region exported as {shm_name:?} on this host");
            return refuse(&mut conn, ErrorCode::InvalidParams, why);
        }
        Err(e) => {
            let why = format!("cannot map the shared region {shm_name:?}: {e}");
            return refuse(&mut conn, ErrorCode::InvalidParams, why);
        }
    };
    let offer = map.offer();
    if offer.base != base || offer.len != len {
        let why = format!(
            "region {shm_name:?} is {:#x}+{} but Hello said {base:#x}+{len}",
            offer.base, offer.len
        );
        return refuse(&mut conn, ErrorCode::InvalidParams, why);
    }
    let Some(local) = map.translate(base, len).map(|p| p as u64) else {
        return refuse(&mut conn, ErrorCode::InvalidParams, "empty region".into());
    };
    // SAFETY: `map` is our read-write mapping of the whole region; it moves into `region`,
    // whose `Drop` unregisters the range before the mapping is dropped.
    if let Err(e) = unsafe { store.register_buffer(local, len) } {
        let why = format!("cannot register the shared region: {e}");
        return refuse(&mut conn, e.code, why);
    }
    let region = Region {
        map,
        local,
        len,
        store,
    };
    tracing::info!(
        "dummy client attached: region {shm_name:?} of {} bytes",
        region.len
    );
    write_frame(
        &mut conn,
        &Response::Welcome {
            version: WIRE_VERSION,
            hostname: store.hostname().to_string(),
        },
    )?;
    while !stop.load(Ordering::Acquire) {
        let Some(payload) = read_frame(&mut conn)? else {
            return Ok(());
        };
        let req = match Request::from_bytes(&payload) {
            Ok(r) => r,
            Err(e) => {
                // The stream may be out of step: answer once and close.
                return refuse(
                    &mut conn,
                    ErrorCode::InvalidParams,
                    format!("bad request: {e}"),
                );
            }
        };
        let resp = handle(&region, store, req);
        write_frame(&mut conn, &resp)?;
    }
    Ok(())
}

fn code_of(r: Result<(), impl Into<StoreError>>) -> i64 {
    match r {
        Ok(()) => 0,
        Err(e) => err(e),
    }
}

/// The code a dummy gets for a failed call; its cause, when the store gave one, goes to this
/// process's log (the dummy sees only the number, as a store's caller does).
fn err(e: impl Into<StoreError>) -> i64 {
    let e = e.into();
    if !e.cause.is_empty() && !e.is_miss() {
        tracing::warn!("dummy client call failed: {e}");
    }
    i64::from(e.code.code())
}

/// Runs one request on the store.
fn handle(region: &Region<'_>, store: &Store, req: Request) -> Response {
    let codes = match req {
        Request::Hello { .. } => {
            return Response::Refused {
                code: ErrorCode::InvalidParams.code(),
                why: "Hello twice".into(),
            }
        }
        Request::Put {
            upsert,
            config,
            key,
            parts,
        } => {
            let slices: Option<Vec<Src<'_>>> = parts.iter().map(|p| region.src(p)).collect();
            vec![match slices {
                None => err(ErrorCode::InvalidParams),
                Some(s) => code_of(store.put_parts(&key, &s, &config, upsert)),
            }]
        }
        Request::BatchPut {
            upsert,
            config,
            items,
        } => batch_put(region, store, upsert, &config, items),
        Request::GetInto { items } => items
            .iter()
            .map(|it| match region.local(it.addr, it.len) {
                None => err(ErrorCode::InvalidParams),
                // SAFETY: `local` checked the range lies inside our mapping of the dummy's
                // region, which lives as long as `region`; the dummy is told (docs) that a
                // buffer must not be touched while a call that fills it runs.
                Some(p) => match unsafe { store.get_into(&it.key, p, it.len) } {
                    Ok(n) => n as i64,
                    Err(e) => err(e),
                },
            })
            .collect(),
        Request::GetSize { keys } => keys
            .iter()
            .map(|k| match store.get_size(k) {
                Ok(n) => n as i64,
                Err(e) => err(e),
            })
            .collect(),
        Request::IsExist { keys } => store
            .batch_is_exist(&keys)
            .into_iter()
            .map(|r| match r {
                Ok(b) => i64::from(b),
                Err(e) => err(e),
            })
            .collect(),
        Request::Remove { keys, force } => {
            if keys.len() == 1 {
                vec![code_of(store.remove(&keys[0], force))]
            } else {
                store
                    .batch_remove(&keys, force)
                    .into_iter()
                    .map(code_of)
                    .collect()
            }
        }
        Request::RemoveAll { force } => vec![match store.remove_all(force) {
            Ok(n) => n as i64,
            Err(e) => err(e),
        }],
        Request::RemoveByRegex { pattern, force } => {
            vec![match store.remove_by_regex(&pattern, force) {
                Ok(n) => n as i64,
                Err(e) => err(e),
            }]
        }
        Request::Health => vec![i64::from(store.health())],
        Request::ReadRanges { reads } => read_ranges(region, store, &reads),
        Request::CreateTask {
            key,
            targets,
            source,
        } => {
            let made = match (&source, targets.as_slice()) {
                (None, _) => store.create_copy_task(&key, &targets),
                (Some(src), [target]) => store.create_move_task(&key, src, target),
                (Some(_), _) => Err(ErrorCode::InvalidParams.into()),
            };
            match made {
                Ok(id) => return Response::TaskCreated { id },
                Err(e) => vec![err(e)],
            }
        }
        Request::QueryTask { id } => match store.query_task(id) {
            Ok(t) => return Response::Task(t),
            Err(e) => vec![err(e)],
        },
    };
    Response::Codes(codes)
}

/// Ranged reads into the region: one replica lookup for the keys, then every read that lies
/// inside its object (and its range inside the region) in batches of disjoint destinations.
/// Per read the bytes read or a code.
fn read_ranges(region: &Region<'_>, store: &Store, reads: &[RangeRead]) -> Vec<i64> {
    let keys: Vec<String> = reads.iter().map(|r| r.key.clone()).collect();
    let lists = store.batch_replicas(&keys);
    let mut out = vec![0i64; reads.len()];
    let mut planned = Vec::with_capacity(reads.len());
    for (i, (rd, list)) in reads.iter().zip(&lists).enumerate() {
        let plan = list.as_ref().map_err(Clone::clone).and_then(|list| {
            let size = list.object_size()?;
            if rd.offset.checked_add(rd.len).is_none_or(|end| end > size) {
                return Err(ErrorCode::InvalidParams.into());
            }
            let p = region
                .local(rd.addr, rd.len)
                .ok_or(ErrorCode::InvalidParams)?;
            Ok((list, p))
        });
        match plan {
            Ok(_) if rd.len == 0 => {}
            Ok((list, p)) => planned.push((i, list, p)),
            Err(e) => out[i] = err(e),
        }
    }
    // One batch holds disjoint destinations only: a read overlapping another goes in a later
    // batch, so the caller's overlapping reads land in turn and the later one wins.
    planned.sort_by_key(|&(i, _, p)| (p, i));
    while !planned.is_empty() {
        let mut end = 0u64;
        let (now, later): (Vec<_>, Vec<_>) = planned.into_iter().partition(|&(i, _, p)| {
            let disjoint = p >= end;
            if disjoint {
                end = p + reads[i].len;
            }
            disjoint
        });
        planned = later;
        let mut at = Vec::with_capacity(now.len());
        let batch = now
            .into_iter()
            .map(|(i, list, p)| {
                at.push(i);
                out[i] = reads[i].len as i64;
                let len = reads[i].len as usize;
                ObjectRead {
                    list,
                    offset: reads[i].offset,
                    // SAFETY: `local` checked the range lies inside our mapping of the dummy's
                    // region, which outlives this call and which no Rust reference covers; the
                    // dummy is told (docs) not to touch a buffer while a call fills it.
                    dst: unsafe { Dst::from_raw(p as *mut u8, len) },
                }
            })
            .collect();
        for (i, r) in at.into_iter().zip(store.read_many_from(batch)) {
            if let Err(e) = r {
                out[i] = err(e);
            }
        }
    }
    out
}

fn batch_put(
    region: &Region<'_>,
    store: &Store,
    upsert: bool,
    config: &protocol::ReplicateConfig,
    items: Vec<Item>,
) -> Vec<i64> {
    // Items whose range lies outside the region fail alone; the rest go in one batch.
    let mut out = vec![0i64; items.len()];
    let mut keys = Vec::with_capacity(items.len());
    let mut values = Vec::with_capacity(items.len());
    let mut at = Vec::with_capacity(items.len());
    for (i, it) in items.iter().enumerate() {
        match region.src(&Range {
            addr: it.addr,
            len: it.len,
        }) {
            Some(s) => {
                keys.push(it.key.clone());
                values.push(vec![s]);
                at.push(i);
            }
            None => out[i] = err(ErrorCode::InvalidParams),
        }
    }
    if !keys.is_empty() {
        let config = config.for_items(items.len(), &at);
        for (i, r) in at
            .into_iter()
            .zip(store.put_many(&keys, &values, &config, upsert))
        {
            out[i] = code_of(r);
        }
    }
    out
}
