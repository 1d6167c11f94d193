//! `SimVerbs`: a software model of RC queue pairs, across processes, for tests without
//! RDMA hardware. It implements [`Verbs`] exactly as the transport uses it.
//!
//! A *fabric* is a directory (normally under `/dev/shm`) shared by every process of a test.
//! It plays the HCAs' translation tables and the wire:
//!
//! ```text
//! <fabric>/mr-<key:08x>   one memory region, 32 bytes, little-endian
//!   0 magic "SMR1" | 4 owner pid | 8 addr u64 | 16 length u64 | 24 access u32 | 28 device u32
//! <fabric>/qp-<qpn:06x>   one queue pair endpoint, 16 bytes, rewritten on every transition
//!   0 magic "SQP1" | 4 owner pid | 8 state u32 (ibv_qp_state) | 12 remote qpn u32
//! ```
//!
//! Keys and QP numbers are random and claimed with `O_CREAT | O_EXCL`, so they are unique in
//! the fabric (an lkey equals the rkey). The bytes of a one-sided operation are moved by
//! `process_vm_readv`/`process_vm_writev` into the owner of the remote region (the model's
//! DMA engine; a plain copy when the owner is this process).
//!
//! What is checked, in the order a NIC would, with the status a real HCA reports:
//!
//! | check | status |
//! |---|---|
//! | QP not in RTS at post time | `post_send` fails with `EINVAL` |
//! | more outstanding WRs than `max_send_wr` | `post_send` fails with `ENOMEM` at that WR |
//! | QP in the error state | `WR_FLUSH_ERR` (every later WR too) |
//! | injected fault ([`SimVerbs::fail_next`]) | that status |
//! | lkey unknown, another PD, range outside it | `LOC_PROT_ERR` |
//! | remote QP gone, its owner dead, not connected back to us | `RETRY_EXC_ERR` |
//! | remote QP in the error state | `REM_OP_ERR` |
//! | rkey unknown, of another process, range outside it, access missing | `REM_ACCESS_ERR` |
//!
//! A region's record is held (`flock`, shared) by each WR moving bytes through it, and
//! `dereg_mr` takes it exclusively before removing it: once `dereg_mr` returns, no byte moves
//! through the region's keys, as a NIC's translation table guarantees (a key that changed,
//! `RdmaTransport::rekey`, fences late writers this way).
//!
//! A failed WR completes with its status (signalled or not), moves the QP to ERR (the file
//! too, so the peer sees it) and every WR posted after it completes with `WR_FLUSH_ERR`, as
//! real verbs do. Successful WRs complete only when signalled. Completions of a QP come in
//! posting order. `poll_cq` on a CQ that overflowed fails with `EOVERFLOW`.

use std::collections::{HashMap, VecDeque};
use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use super::verbs::{
    Access, Completion, Cq, Ctx, Gid, Mr, Pd, PortInfo, Qp, QpCaps, QpInfo, QpState, RdmaOp,
    RemoteEnd, SendWr, Transition, Verbs, VerbsError, WcStatus, PORT_ACTIVE,
};

/// Environment variable naming the fabric directory; when set, the engine uses the model.
pub const ENV_FABRIC: &str = "MOONCAKE_RDMA_SIM";
/// Comma-separated device names of the model (default `sim0,sim1`).
pub const ENV_DEVICES: &str = "MOONCAKE_RDMA_SIM_DEVICES";

const MR_MAGIC: &[u8; 4] = b"SMR1";
const QP_MAGIC: &[u8; 4] = b"SQP1";
const MR_RECORD_BYTES: usize = 32;
const QP_RECORD_BYTES: usize = 16;

/// A decoded `mr-*` record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MrRecord {
    pub pid: u32,
    pub addr: u64,
    pub length: u64,
    pub access: u32,
    pub device: u32,
}

/// A decoded `qp-*` record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QpRecord {
    pub pid: u32,
    pub state: u32,
    pub remote_qpn: u32,
}

fn u32_at(b: &[u8], o: usize) -> u32 {
    u32::from_le_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]])
}

fn u64_at(b: &[u8], o: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[o..o + 8]);
    u64::from_le_bytes(a)
}

impl MrRecord {
    pub fn encode(&self) -> [u8; MR_RECORD_BYTES] {
        let mut b = [0u8; MR_RECORD_BYTES];
        b[0..4].copy_from_slice(MR_MAGIC);
        b[4..8].copy_from_slice(&self.pid.to_le_bytes());
        b[8..16].copy_from_slice(&self.addr.to_le_bytes());
        b[16..24].copy_from_slice(&self.length.to_le_bytes());
        b[24..28].copy_from_slice(&self.access.to_le_bytes());
        b[28..32].copy_from_slice(&self.device.to_le_bytes());
        b
    }

    /// Decodes a record; an error says what was wrong (never panics).
    pub fn decode(b: &[u8]) -> Result<MrRecord, String> {
        if b.len() != MR_RECORD_BYTES {
            return Err(format!(
                "MR record of {} bytes, expected {MR_RECORD_BYTES}",
                b.len()
            ));
        }
        if &b[0..4] != MR_MAGIC {
            return Err(format!("MR record magic {:02x?}, expected SMR1", &b[0..4]));
        }
        let r = MrRecord {
            pid: u32_at(b, 4),
            addr: u64_at(b, 8),
            length: u64_at(b, 16),
            access: u32_at(b, 24),
            device: u32_at(b, 28),
        };
        if r.addr.checked_add(r.length).is_none() {
            return Err(format!("MR record range {:#x}+{} wraps", r.addr, r.length));
        }
        Ok(r)
    }

    /// `[addr, addr + len)` lies inside the region.
    pub fn covers(&self, addr: u64, len: u64) -> bool {
        addr >= self.addr
            && addr
                .checked_add(len)
                .is_some_and(|end| end <= self.addr + self.length)
    }
}

impl QpRecord {
    pub fn encode(&self) -> [u8; QP_RECORD_BYTES] {
        let mut b = [0u8; QP_RECORD_BYTES];
        b[0..4].copy_from_slice(QP_MAGIC);
        b[4..8].copy_from_slice(&self.pid.to_le_bytes());
        b[8..12].copy_from_slice(&self.state.to_le_bytes());
        b[12..16].copy_from_slice(&self.remote_qpn.to_le_bytes());
        b
    }

    /// Decodes a record; an error says what was wrong (never panics).
    pub fn decode(b: &[u8]) -> Result<QpRecord, String> {
        if b.len() != QP_RECORD_BYTES {
            return Err(format!(
                "QP record of {} bytes, expected {QP_RECORD_BYTES}",
                b.len()
            ));
        }
        if &b[0..4] != QP_MAGIC {
            return Err(format!("QP record magic {:02x?}, expected SQP1", &b[0..4]));
        }
        let r = QpRecord {
            pid: u32_at(b, 4),
            state: u32_at(b, 8),
            remote_qpn: u32_at(b, 12),
        };
        if QpState::from_u32(r.state).is_none() {
            return Err(format!(
                "QP record state {} is not an ibv_qp_state",
                r.state
            ));
        }
        Ok(r)
    }
}

struct SimMr {
    pd: u64,
    key: u32,
    rec: MrRecord,
}

struct SimCq {
    depth: usize,
    entries: VecDeque<Completion>,
    overflowed: bool,
}

struct SimQp {
    pd: u64,
    cq: u64,
    qp_num: u32,
    state: QpState,
    remote: Option<RemoteEnd>,
    max_send_wr: usize,
    /// Posted WR ids not yet retired by a polled completion (in order).
    outstanding: VecDeque<u64>,
    file: File,
}

#[derive(Default)]
struct State {
    next: u64,
    ctxs: HashMap<u64, u32>,
    pds: HashMap<u64, u32>,
    mrs: HashMap<u64, SimMr>,
    cqs: HashMap<u64, SimCq>,
    qps: HashMap<u64, SimQp>,
    /// Statuses forced onto the next WRs executed (fault injection).
    faults: VecDeque<WcStatus>,
}

/// The software model; see the module docs.
pub struct SimVerbs {
    fabric: PathBuf,
    devices: Vec<String>,
    pid: u32,
    state: Mutex<State>,
}

fn random_u32() -> u32 {
    protocol::Uuid::random().lo as u32
}

fn io_err(call: &'static str, e: std::io::Error) -> VerbsError {
    VerbsError::call(call, e.raw_os_error().unwrap_or(libc::EIO))
}

/// A fresh, empty fabric directory for tests and benchmarks (`MOONCAKE_RDMA_SIM`), under
/// /dev/shm when there is one, else the temp dir; `tag` goes into its name. The caller
/// removes it. Panics if it cannot be created (it serves tests, which stop there).
pub fn scratch_fabric(tag: &str) -> PathBuf {
    let base = if Path::new("/dev/shm").is_dir() {
        PathBuf::from("/dev/shm")
    } else {
        std::env::temp_dir()
    };
    let p = base.join(format!(
        "mc-rdma-sim-{tag}-{}-{}",
        std::process::id(),
        random_u32()
    ));
    std::fs::create_dir_all(&p).unwrap_or_else(|e| panic!("creating {}: {e}", p.display()));
    p
}

/// Whether process `pid` exists.
fn alive(pid: u32) -> bool {
    crate::sys::rawio::process_exists(pid as libc::pid_t)
}

impl SimVerbs {
    /// A model on fabric directory `fabric` (created if missing) with `devices`.
    pub fn new(fabric: &Path, devices: &[&str]) -> Result<SimVerbs, VerbsError> {
        std::fs::create_dir_all(fabric).map_err(|e| io_err("sim fabric", e))?;
        Ok(SimVerbs {
            fabric: fabric.to_path_buf(),
            devices: devices.iter().map(|d| d.to_string()).collect(),
            pid: std::process::id(),
            state: Mutex::new(State {
                next: 1,
                ..Default::default()
            }),
        })
    }

    /// The model the environment asks for ([`ENV_FABRIC`], [`ENV_DEVICES`]), if any.
    pub fn from_env() -> Option<Result<SimVerbs, VerbsError>> {
        let fabric = std::env::var(ENV_FABRIC)
            .ok()
            .filter(|v| !v.trim().is_empty())?;
        let devs = std::env::var(ENV_DEVICES).unwrap_or_else(|_| "sim0,sim1".into());
        let devs: Vec<&str> = devs
            .split(',')
            .map(str::trim)
            .filter(|d| !d.is_empty())
            .collect();
        Some(SimVerbs::new(Path::new(fabric.trim()), &devs))
    }

    /// The fabric directory.
    pub fn fabric(&self) -> &Path {
        &self.fabric
    }

    /// Fault injection: the next WR this model executes fails with `status` (then the QP
    /// errors and later WRs flush, as for a real failure). Queued statuses apply to the
    /// following WRs in order; `WcStatus::SUCCESS` lets one WR through unchanged.
    pub fn fail_next(&self, status: WcStatus) {
        self.lock().faults.push_back(status);
    }

    /// Fault injection: moves `qp` to the error state as an asynchronous QP error would.
    pub fn break_qp(&self, qp: Qp) -> Result<(), VerbsError> {
        self.modify_qp(qp, Transition::Err)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn mr_path(&self, key: u32) -> PathBuf {
        self.fabric.join(format!("mr-{key:08x}"))
    }

    fn qp_path(&self, qpn: u32) -> PathBuf {
        self.fabric.join(format!("qp-{qpn:06x}"))
    }

    fn read_record(path: &Path, len: usize) -> Option<Vec<u8>> {
        let mut v = Vec::with_capacity(len);
        File::open(path)
            .ok()?
            .take(len as u64 + 1)
            .read_to_end(&mut v)
            .ok()?;
        Some(v)
    }

    /// Claims a fresh name `make(random)` in the fabric with `O_EXCL`.
    fn claim(&self, make: impl Fn(u32) -> (u32, PathBuf)) -> Result<(u32, File), VerbsError> {
        for _ in 0..64 {
            let (v, path) = make(random_u32());
            if v == 0 {
                continue;
            }
            match OpenOptions::new()
                .read(true)
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&path)
            {
                Ok(f) => return Ok((v, f)),
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(io_err("sim claim", e)),
            }
        }
        Err(VerbsError::call("sim claim", libc::EEXIST))
    }

    fn write_qp(&self, qp: &SimQp) {
        let rec = QpRecord {
            pid: self.pid,
            state: qp.state as u32,
            remote_qpn: qp.remote.map_or(0, |r| r.qp_num),
        };
        // A failed write leaves the old state visible; the peer then sees a stale endpoint,
        // which the model treats like a lost packet.
        let _ = qp.file.write_all_at(&rec.encode(), 0);
    }

    /// Runs one WR; the status it completes with.
    fn execute(&self, st: &mut State, qp_h: u64, wr: &SendWr) -> WcStatus {
        let (pd, qp_num, state, remote) = {
            let q = &st.qps[&qp_h];
            (q.pd, q.qp_num, q.state, q.remote)
        };
        if state == QpState::Err {
            return WcStatus::WR_FLUSH_ERR;
        }
        // An injected SUCCESS lets the WR run normally (it only counts a WR off).
        if let Some(s) = st.faults.pop_front().filter(|s| !s.is_ok()) {
            return s;
        }
        let len = u64::from(wr.len);
        let local_ok = st.mrs.values().any(|m| {
            m.key == wr.lkey
                && m.pd == pd
                && m.rec.covers(wr.local_addr, len)
                && (wr.op == RdmaOp::Write || Access(m.rec.access).contains(Access::LOCAL_WRITE))
        });
        if !local_ok {
            return WcStatus::LOC_PROT_ERR;
        }
        let Some(remote) = remote else {
            return WcStatus::RETRY_EXC_ERR;
        };
        let peer = Self::read_record(&self.qp_path(remote.qp_num), QP_RECORD_BYTES)
            .and_then(|b| QpRecord::decode(&b).ok());
        let Some(peer) = peer else {
            return WcStatus::RETRY_EXC_ERR; // the peer QP is gone
        };
        if !alive(peer.pid) || peer.remote_qpn != qp_num {
            return WcStatus::RETRY_EXC_ERR;
        }
        if !matches!(
            QpState::from_u32(peer.state),
            Some(QpState::Rtr | QpState::Rts)
        ) {
            return WcStatus::REM_OP_ERR;
        }
        // Held (shared) until the bytes have moved: a `dereg_mr` takes it exclusively before
        // it removes the record, so no byte moves through a region once it is deregistered.
        let Some((held, rec)) = Self::lock_record(&self.mr_path(wr.rkey)) else {
            return WcStatus::REM_ACCESS_ERR;
        };
        let mr = MrRecord::decode(&rec).ok();
        let need = match wr.op {
            RdmaOp::Write => Access::REMOTE_WRITE,
            RdmaOp::Read => Access::REMOTE_READ,
        };
        let allowed = mr.is_some_and(|m| {
            m.pid == peer.pid && m.covers(wr.remote_addr, len) && Access(m.access).contains(need)
        });
        if !allowed {
            return WcStatus::REM_ACCESS_ERR;
        }
        let moved = match move_bytes(peer.pid, self.pid, wr) {
            Ok(()) => WcStatus::SUCCESS,
            Err(e) if e == libc::ESRCH => WcStatus::RETRY_EXC_ERR,
            Err(_) => WcStatus::REM_ACCESS_ERR,
        };
        drop(held);
        moved
    }

    /// Opens a region's record and locks it shared; `None` if it is gone (never registered,
    /// or deregistered, even between the open and the lock).
    fn lock_record(path: &Path) -> Option<(File, Vec<u8>)> {
        let mut f = File::open(path).ok()?;
        flock(&f, libc::LOCK_SH)?;
        // Removed while we waited for the lock: deregistered.
        if f.metadata().ok()?.nlink() == 0 {
            return None;
        }
        let mut v = Vec::with_capacity(MR_RECORD_BYTES);
        (&mut f)
            .take(MR_RECORD_BYTES as u64 + 1)
            .read_to_end(&mut v)
            .ok()?;
        Some((f, v))
    }
}

/// Moves the bytes of `wr` between this process and `peer_pid`; an errno on failure.
fn move_bytes(peer_pid: u32, my_pid: u32, wr: &SendWr) -> Result<(), i32> {
    let len = wr.len as usize;
    if len == 0 {
        return Ok(());
    }
    if peer_pid == my_pid {
        let (src, dst) = match wr.op {
            RdmaOp::Write => (wr.local_addr, wr.remote_addr),
            RdmaOp::Read => (wr.remote_addr, wr.local_addr),
        };
        // SAFETY: both ranges were found inside registered memory regions of this process
        // (the local one in our table, the remote one in the fabric's record owned by this
        // pid); registration's contract keeps them mapped. `copy` allows overlap.
        unsafe { std::ptr::copy(src as *const u8, dst as *mut u8, len) };
        return Ok(());
    }
    let mut done = 0usize;
    while done < len {
        let l = libc::iovec {
            iov_base: (wr.local_addr as usize + done) as *mut libc::c_void,
            iov_len: len - done,
        };
        let r = libc::iovec {
            iov_base: (wr.remote_addr as usize + done) as *mut libc::c_void,
            iov_len: len - done,
        };
        // SAFETY: the local iovec lies inside a registered region of ours (checked by the
        // caller); the kernel checks the remote one against the peer's mappings.
        let n = unsafe {
            match wr.op {
                RdmaOp::Write => libc::process_vm_writev(peer_pid as i32, &l, 1, &r, 1, 0),
                RdmaOp::Read => libc::process_vm_readv(peer_pid as i32, &l, 1, &r, 1, 0),
            }
        };
        if n < 0 {
            let e = std::io::Error::last_os_error()
                .raw_os_error()
                .unwrap_or(libc::EIO);
            if e == libc::EINTR {
                continue;
            }
            return Err(e);
        }
        if n == 0 {
            return Err(libc::EFAULT);
        }
        done += n as usize;
    }
    Ok(())
}

/// `flock(2)` on `f`, retried on `EINTR`.
fn flock(f: &File, op: i32) -> Option<()> {
    use std::os::fd::AsRawFd;
    loop {
        // SAFETY: a live descriptor owned by `f`.
        if unsafe { libc::flock(f.as_raw_fd(), op) } == 0 {
            return Some(());
        }
        if std::io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
            return None;
        }
    }
}

fn gid_of(name: &str) -> Gid {
    // fe80::/64 plus a hash of the device name: stable across processes.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in name.bytes() {
        h = (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3);
    }
    let mut raw = [0u8; 16];
    raw[0] = 0xfe;
    raw[1] = 0x80;
    raw[8..].copy_from_slice(&h.to_be_bytes());
    Gid(raw)
}

impl Verbs for SimVerbs {
    fn kind(&self) -> &'static str {
        "sim"
    }

    fn device_names(&self) -> Result<Vec<String>, VerbsError> {
        Ok(self.devices.clone())
    }

    fn open_device(&self, name: &str) -> Result<Ctx, VerbsError> {
        let i = self
            .devices
            .iter()
            .position(|d| d == name)
            .ok_or_else(|| VerbsError::NoDevice(name.to_string()))?;
        let mut st = self.lock();
        let h = st.next;
        st.next += 1;
        st.ctxs.insert(h, i as u32);
        Ok(Ctx(h))
    }

    fn close_device(&self, ctx: Ctx) -> Result<(), VerbsError> {
        self.lock()
            .ctxs
            .remove(&ctx.0)
            .map(|_| ())
            .ok_or(VerbsError::BadHandle("context"))
    }

    fn query_port(&self, ctx: Ctx, port: u8) -> Result<PortInfo, VerbsError> {
        let dev = *self
            .lock()
            .ctxs
            .get(&ctx.0)
            .ok_or(VerbsError::BadHandle("context"))?;
        if port != 1 {
            return Err(VerbsError::call("ibv_query_port", libc::EINVAL));
        }
        Ok(PortInfo {
            state: PORT_ACTIVE,
            active_mtu: 5,
            lid: dev as u16 + 1,
            link_layer: 1,
            gid_table_len: 1,
        })
    }

    fn query_gid(&self, ctx: Ctx, port: u8, index: u8) -> Result<Gid, VerbsError> {
        let dev = *self
            .lock()
            .ctxs
            .get(&ctx.0)
            .ok_or(VerbsError::BadHandle("context"))?;
        if port != 1 || index != 0 {
            return Err(VerbsError::call("ibv_query_gid", libc::EINVAL));
        }
        Ok(gid_of(&self.devices[dev as usize]))
    }

    fn alloc_pd(&self, ctx: Ctx) -> Result<Pd, VerbsError> {
        let mut st = self.lock();
        let dev = *st
            .ctxs
            .get(&ctx.0)
            .ok_or(VerbsError::BadHandle("context"))?;
        let h = st.next;
        st.next += 1;
        st.pds.insert(h, dev);
        Ok(Pd(h))
    }

    fn dealloc_pd(&self, pd: Pd) -> Result<(), VerbsError> {
        let mut st = self.lock();
        if st.mrs.values().any(|m| m.pd == pd.0) || st.qps.values().any(|q| q.pd == pd.0) {
            return Err(VerbsError::call("ibv_dealloc_pd", libc::EBUSY));
        }
        st.pds
            .remove(&pd.0)
            .map(|_| ())
            .ok_or(VerbsError::BadHandle("PD"))
    }

    unsafe fn reg_mr(&self, pd: Pd, addr: u64, len: u64, access: Access) -> Result<Mr, VerbsError> {
        let dev = *self
            .lock()
            .pds
            .get(&pd.0)
            .ok_or(VerbsError::BadHandle("PD"))?;
        if len == 0 || addr.checked_add(len).is_none() {
            return Err(VerbsError::call("ibv_reg_mr", libc::EINVAL));
        }
        let rec = MrRecord {
            pid: self.pid,
            addr,
            length: len,
            access: access.0,
            device: dev,
        };
        let (key, mut f) = self.claim(|r| (r, self.mr_path(r)))?;
        f.write_all(&rec.encode())
            .map_err(|e| io_err("ibv_reg_mr", e))?;
        let mut st = self.lock();
        let h = st.next;
        st.next += 1;
        st.mrs.insert(h, SimMr { pd: pd.0, key, rec });
        Ok(Mr {
            handle: h,
            lkey: key,
            rkey: key,
        })
    }

    fn dereg_mr(&self, mr: Mr) -> Result<(), VerbsError> {
        let m = self
            .lock()
            .mrs
            .remove(&mr.handle)
            .ok_or(VerbsError::BadHandle("MR"))?;
        // Exclusively: waits for the work requests moving bytes through it (each holds the
        // record shared), so that none does once this returns, as on a NIC.
        let path = self.mr_path(m.key);
        let held = File::open(&path).ok();
        if let Some(f) = &held {
            let _ = flock(f, libc::LOCK_EX);
        }
        let _ = std::fs::remove_file(&path);
        drop(held);
        Ok(())
    }

    fn create_cq(&self, ctx: Ctx, depth: u32) -> Result<Cq, VerbsError> {
        let mut st = self.lock();
        st.ctxs
            .get(&ctx.0)
            .ok_or(VerbsError::BadHandle("context"))?;
        let h = st.next;
        st.next += 1;
        st.cqs.insert(
            h,
            SimCq {
                depth: depth.max(1) as usize,
                entries: VecDeque::new(),
                overflowed: false,
            },
        );
        Ok(Cq(h))
    }

    fn destroy_cq(&self, cq: Cq) -> Result<(), VerbsError> {
        let mut st = self.lock();
        if st.qps.values().any(|q| q.cq == cq.0) {
            return Err(VerbsError::call("ibv_destroy_cq", libc::EBUSY));
        }
        st.cqs
            .remove(&cq.0)
            .map(|_| ())
            .ok_or(VerbsError::BadHandle("CQ"))
    }

    fn create_qp(&self, pd: Pd, cq: Cq, caps: QpCaps) -> Result<QpInfo, VerbsError> {
        {
            let st = self.lock();
            st.pds.get(&pd.0).ok_or(VerbsError::BadHandle("PD"))?;
            st.cqs.get(&cq.0).ok_or(VerbsError::BadHandle("CQ"))?;
        }
        let (qp_num, file) = self.claim(|r| {
            let n = r & 0x00ff_ffff;
            (n, self.qp_path(n))
        })?;
        let q = SimQp {
            pd: pd.0,
            cq: cq.0,
            qp_num,
            state: QpState::Reset,
            remote: None,
            max_send_wr: caps.max_send_wr.max(1) as usize,
            outstanding: VecDeque::new(),
            file,
        };
        self.write_qp(&q);
        let mut st = self.lock();
        let h = st.next;
        st.next += 1;
        st.qps.insert(h, q);
        Ok(QpInfo { qp: Qp(h), qp_num })
    }

    fn modify_qp(&self, qp: Qp, step: Transition) -> Result<(), VerbsError> {
        let mut st = self.lock();
        let q = st.qps.get_mut(&qp.0).ok_or(VerbsError::BadHandle("QP"))?;
        let (from, to) = step.states();
        if let Some(from) = from {
            if q.state != from {
                return Err(VerbsError::call("ibv_modify_qp", libc::EINVAL));
            }
        }
        if let Transition::Rtr { remote, .. } = step {
            q.remote = Some(remote);
        }
        q.state = to;
        self.write_qp(q);
        Ok(())
    }

    fn destroy_qp(&self, qp: Qp) -> Result<(), VerbsError> {
        let q = self
            .lock()
            .qps
            .remove(&qp.0)
            .ok_or(VerbsError::BadHandle("QP"))?;
        let _ = std::fs::remove_file(self.qp_path(q.qp_num));
        Ok(())
    }

    unsafe fn post_send(&self, qp: Qp, wrs: &[SendWr]) -> Result<(), VerbsError> {
        let mut st = self.lock();
        let (state, cq, qp_num, room) = {
            let q = st.qps.get(&qp.0).ok_or(VerbsError::BadHandle("QP"))?;
            (q.state, q.cq, q.qp_num, q.max_send_wr - q.outstanding.len())
        };
        if !matches!(state, QpState::Rts | QpState::Err) {
            return Err(VerbsError::Post {
                index: 0,
                errno: libc::EINVAL,
            });
        }
        for (i, wr) in wrs.iter().enumerate() {
            if i >= room {
                return Err(VerbsError::Post {
                    index: i,
                    errno: libc::ENOMEM,
                });
            }
            let status = self.execute(&mut st, qp.0, wr);
            if let Some(q) = st.qps.get_mut(&qp.0) {
                q.outstanding.push_back(wr.wr_id);
                if !status.is_ok() && q.state != QpState::Err {
                    q.state = QpState::Err;
                    self.write_qp(q);
                }
            }
            if !status.is_ok() || wr.signaled {
                if let Some(c) = st.cqs.get_mut(&cq) {
                    if c.entries.len() >= c.depth {
                        c.overflowed = true;
                    } else {
                        c.entries.push_back(Completion {
                            wr_id: wr.wr_id,
                            status,
                            qp_num,
                            byte_len: if status.is_ok() { wr.len } else { 0 },
                        });
                    }
                }
            }
        }
        Ok(())
    }

    fn poll_cq(&self, cq: Cq, max: usize, out: &mut Vec<Completion>) -> Result<usize, VerbsError> {
        let mut st = self.lock();
        let c = st.cqs.get_mut(&cq.0).ok_or(VerbsError::BadHandle("CQ"))?;
        if c.overflowed {
            return Err(VerbsError::call("ibv_poll_cq", libc::EOVERFLOW));
        }
        let n = max.min(c.entries.len());
        let got: Vec<Completion> = c.entries.drain(..n).collect();
        // A completion frees its QP's send-queue slots up to that WR (in-order retirement).
        for w in &got {
            if let Some(q) = st.qps.values_mut().find(|q| q.qp_num == w.qp_num) {
                if let Some(p) = q.outstanding.iter().position(|&id| id == w.wr_id) {
                    q.outstanding.drain(..=p);
                }
            }
        }
        out.extend_from_slice(&got);
        Ok(n)
    }
}

impl Drop for SimVerbs {
    fn drop(&mut self) {
        let st = self.lock();
        for m in st.mrs.values() {
            let _ = std::fs::remove_file(self.mr_path(m.key));
        }
        for q in st.qps.values() {
            let _ = std::fs::remove_file(self.qp_path(q.qp_num));
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    pub(crate) use super::scratch_fabric as fabric;

    struct End {
        cq: Cq,
        pd: Pd,
        qp: QpInfo,
    }

    fn end(v: &SimVerbs, depth: u32) -> End {
        let ctx = v.open_device("sim0").unwrap();
        let pd = v.alloc_pd(ctx).unwrap();
        let cq = v.create_cq(ctx, 64).unwrap();
        let caps = QpCaps {
            max_send_wr: depth,
            max_recv_wr: 1,
            max_sge: 1,
            max_inline: 0,
        };
        let qp = v.create_qp(pd, cq, caps).unwrap();
        v.modify_qp(qp.qp, Transition::Init { port: 1 }).unwrap();
        End { cq, pd, qp }
    }

    fn connect(v: &SimVerbs, e: &End, peer_qpn: u32) {
        let remote = RemoteEnd {
            qp_num: peer_qpn,
            lid: 1,
            gid: Gid::default(),
            psn: 0,
        };
        let rtr = Transition::Rtr {
            remote,
            mtu: 5,
            gid_index: 0,
            port: 1,
        };
        v.modify_qp(e.qp.qp, rtr).unwrap();
        v.modify_qp(e.qp.qp, Transition::Rts { psn: 0 }).unwrap();
    }

    fn wr(
        id: u64,
        op: RdmaOp,
        local: (u64, u32),
        len: u32,
        remote: (u64, u32),
        sig: bool,
    ) -> SendWr {
        SendWr {
            wr_id: id,
            op,
            local_addr: local.0,
            len,
            lkey: local.1,
            remote_addr: remote.0,
            rkey: remote.1,
            signaled: sig,
        }
    }

    fn poll_all(v: &SimVerbs, cq: Cq) -> Vec<Completion> {
        let mut out = Vec::new();
        while v.poll_cq(cq, 16, &mut out).unwrap() > 0 {}
        out
    }

    #[test]
    fn records_round_trip_and_reject_garbage() {
        let m = MrRecord {
            pid: 7,
            addr: 4096,
            length: 100,
            access: 7,
            device: 1,
        };
        assert_eq!(MrRecord::decode(&m.encode()).unwrap(), m);
        assert!(m.covers(4096, 100) && !m.covers(4096, 101) && !m.covers(4095, 1));
        assert!(!m.covers(u64::MAX, 2));
        assert!(MrRecord::decode(&[0; 31]).is_err());
        assert!(MrRecord::decode(&[0; 32]).is_err());
        let mut wrap = m;
        wrap.addr = u64::MAX;
        assert!(MrRecord::decode(&wrap.encode()).is_err());
        let q = QpRecord {
            pid: 1,
            state: 3,
            remote_qpn: 9,
        };
        assert_eq!(QpRecord::decode(&q.encode()).unwrap(), q);
        let mut bad = q.encode();
        bad[8] = 9;
        assert!(QpRecord::decode(&bad).is_err());
    }

    #[test]
    fn write_read_with_selective_signalling_and_access_checks() {
        let f = fabric("rw");
        let a = SimVerbs::new(&f, &["sim0"]).unwrap();
        let b = SimVerbs::new(&f, &["sim0"]).unwrap();
        let (ea, eb) = (end(&a, 8), end(&b, 8));
        connect(&a, &ea, eb.qp.qp_num);
        connect(&b, &eb, ea.qp.qp_num);
        let mut src = vec![0u8; 4096];
        let mut dst = vec![0u8; 4096];
        for (i, x) in src.iter_mut().enumerate() {
            *x = i as u8;
        }
        let (sa, da) = (src.as_mut_ptr() as u64, dst.as_mut_ptr() as u64);
        // SAFETY: both vectors outlive the models' use of them (dropped at the end).
        let ma = unsafe { a.reg_mr(ea.pd, sa, 4096, Access::ALL_RDMA) }.unwrap();
        // SAFETY: as above.
        let mb = unsafe { b.reg_mr(eb.pd, da, 4096, Access::ALL_RDMA) }.unwrap();
        let wrs = [
            wr(1, RdmaOp::Write, (sa, ma.lkey), 1024, (da, mb.rkey), false),
            wr(
                2,
                RdmaOp::Write,
                (sa + 1024, ma.lkey),
                3072,
                (da + 1024, mb.rkey),
                true,
            ),
        ];
        // SAFETY: local ranges inside `ma`, alive until the end of the test.
        unsafe { a.post_send(ea.qp.qp, &wrs) }.unwrap();
        let c = poll_all(&a, ea.cq);
        assert_eq!(c.len(), 1, "only the signalled WR completes: {c:?}");
        assert_eq!((c[0].wr_id, c[0].status), (2, WcStatus::SUCCESS));
        assert_eq!(dst, src);
        // READ back into the first half of src.
        src[..100].fill(0);
        let r = wr(3, RdmaOp::Read, (sa, ma.lkey), 100, (da, mb.rkey), true);
        // SAFETY: as above.
        unsafe { a.post_send(ea.qp.qp, &[r]) }.unwrap();
        assert!(poll_all(&a, ea.cq)[0].status.is_ok());
        assert_eq!(&src[..100], &dst[..100]);
        // Out of bounds at the remote end: REM_ACCESS_ERR, then every later WR flushes.
        let bad = [
            wr(
                4,
                RdmaOp::Write,
                (sa, ma.lkey),
                16,
                (da + 4090, mb.rkey),
                false,
            ),
            wr(5, RdmaOp::Write, (sa, ma.lkey), 16, (da, mb.rkey), false),
        ];
        // SAFETY: as above.
        unsafe { a.post_send(ea.qp.qp, &bad) }.unwrap();
        let c = poll_all(&a, ea.cq);
        assert_eq!(
            c.iter().map(|c| (c.wr_id, c.status)).collect::<Vec<_>>(),
            vec![(4, WcStatus::REM_ACCESS_ERR), (5, WcStatus::WR_FLUSH_ERR)]
        );
        // The error state is visible in the fabric, as the peer would see it.
        let rec = SimVerbs::read_record(&a.qp_path(ea.qp.qp_num), QP_RECORD_BYTES).unwrap();
        assert_eq!(QpRecord::decode(&rec).unwrap().state, QpState::Err as u32);
        a.dereg_mr(ma).unwrap();
        b.dereg_mr(mb).unwrap();
        drop((a, b));
        let _ = std::fs::remove_dir_all(&f);
    }

    #[test]
    fn each_fault_has_the_status_a_nic_reports() {
        let f = fabric("faults");
        let a = SimVerbs::new(&f, &["sim0"]).unwrap();
        let b = SimVerbs::new(&f, &["sim0"]).unwrap();
        let mut la = vec![0u8; 256];
        let mut lb = vec![0u8; 256];
        let (pa, pb) = (la.as_mut_ptr() as u64, lb.as_mut_ptr() as u64);
        // Fresh connected QPs per case, since each failure breaks its QP.
        let run = |make: &dyn Fn(u32, u32) -> SendWr, setup: &dyn Fn(&End, &End)| {
            let (ea, eb) = (end(&a, 8), end(&b, 8));
            connect(&a, &ea, eb.qp.qp_num);
            connect(&b, &eb, ea.qp.qp_num);
            // SAFETY: the vectors outlive every use (the MRs are deregistered below).
            let ma = unsafe { a.reg_mr(ea.pd, pa, 256, Access::ALL_RDMA) }.unwrap();
            // SAFETY: as above; remote-read only.
            let mb = unsafe { b.reg_mr(eb.pd, pb, 256, Access::REMOTE_READ) }.unwrap();
            setup(&ea, &eb);
            // SAFETY: as above.
            unsafe { a.post_send(ea.qp.qp, &[make(ma.lkey, mb.rkey)]) }.unwrap();
            let c = poll_all(&a, ea.cq);
            a.dereg_mr(ma).unwrap();
            b.dereg_mr(mb).unwrap();
            a.destroy_qp(ea.qp.qp).unwrap();
            let _ = b.destroy_qp(eb.qp.qp);
            c[0].status
        };
        let none = |_: &End, _: &End| {};
        // Remote region lacks REMOTE_WRITE.
        let s = run(
            &|l, r| wr(1, RdmaOp::Write, (pa, l), 8, (pb, r), true),
            &none,
        );
        assert_eq!(s, WcStatus::REM_ACCESS_ERR);
        // Unknown rkey.
        let s = run(
            &|l, r| wr(1, RdmaOp::Read, (pa, l), 8, (pb, r ^ 1), true),
            &none,
        );
        assert_eq!(s, WcStatus::REM_ACCESS_ERR);
        // Local range outside the lkey's region.
        let s = run(
            &|l, r| wr(1, RdmaOp::Read, (pa + 250, l), 8, (pb, r), true),
            &none,
        );
        assert_eq!(s, WcStatus::LOC_PROT_ERR);
        // A good READ works.
        let s = run(
            &|l, r| wr(1, RdmaOp::Read, (pa, l), 8, (pb, r), true),
            &none,
        );
        assert_eq!(s, WcStatus::SUCCESS);
        // Peer QP gone.
        let s = run(
            &|l, r| wr(1, RdmaOp::Read, (pa, l), 8, (pb, r), true),
            &|_, eb| b.destroy_qp(eb.qp.qp).unwrap(),
        );
        assert_eq!(s, WcStatus::RETRY_EXC_ERR);
        // Peer QP in error.
        let s = run(
            &|l, r| wr(1, RdmaOp::Read, (pa, l), 8, (pb, r), true),
            &|_, eb| b.break_qp(eb.qp.qp).unwrap(),
        );
        assert_eq!(s, WcStatus::REM_OP_ERR);
        // Our QP broken asynchronously: flush.
        let s = run(
            &|l, r| wr(1, RdmaOp::Read, (pa, l), 8, (pb, r), true),
            &|ea, _| a.break_qp(ea.qp.qp).unwrap(),
        );
        assert_eq!(s, WcStatus::WR_FLUSH_ERR);
        // Injected status.
        a.fail_next(WcStatus::GENERAL_ERR);
        let s = run(
            &|l, r| wr(1, RdmaOp::Read, (pa, l), 8, (pb, r), true),
            &none,
        );
        assert_eq!(s, WcStatus::GENERAL_ERR);
        drop((a, b));
        let _ = std::fs::remove_dir_all(&f);
    }

    #[test]
    fn post_rules_state_and_queue_depth() {
        let f = fabric("post");
        let a = SimVerbs::new(&f, &["sim0"]).unwrap();
        let b = SimVerbs::new(&f, &["sim0"]).unwrap();
        let (ea, eb) = (end(&a, 2), end(&b, 2));
        let mut la = vec![0u8; 64];
        let pa = la.as_mut_ptr() as u64;
        // SAFETY: `la` outlives the MR.
        let ma = unsafe { a.reg_mr(ea.pd, pa, 64, Access::ALL_RDMA) }.unwrap();
        let w = |id, sig| wr(id, RdmaOp::Write, (pa, ma.lkey), 8, (pa + 8, ma.rkey), sig);
        // INIT: posting is refused.
        // SAFETY: local range inside `ma`.
        let e = unsafe { a.post_send(ea.qp.qp, &[w(1, true)]) }.unwrap_err();
        assert_eq!(
            e,
            VerbsError::Post {
                index: 0,
                errno: libc::EINVAL
            }
        );
        // Illegal transition.
        assert!(a.modify_qp(ea.qp.qp, Transition::Rts { psn: 0 }).is_err());
        connect(&a, &ea, eb.qp.qp_num);
        connect(&b, &eb, ea.qp.qp_num);
        // Depth 2: the third outstanding WR is refused until a completion is polled. (The
        // write targets our own MR through the peer QP: the rkey's owner must be the peer's
        // process, which it is in this single-process test.)
        // SAFETY: as above.
        let e = unsafe { a.post_send(ea.qp.qp, &[w(1, false), w(2, true), w(3, true)]) };
        assert_eq!(
            e.unwrap_err(),
            VerbsError::Post {
                index: 2,
                errno: libc::ENOMEM
            }
        );
        assert_eq!(poll_all(&a, ea.cq).len(), 1);
        // SAFETY: as above.
        unsafe { a.post_send(ea.qp.qp, &[w(3, true), w(4, true)]) }.unwrap();
        assert_eq!(poll_all(&a, ea.cq).len(), 2);
        a.dereg_mr(ma).unwrap();
        assert!(a.dealloc_pd(ea.pd).is_err(), "the QP still uses the PD");
        drop(la);
        let _ = std::fs::remove_dir_all(&f);
    }

    /// The child half of [`across_processes`]: run only when the parent re-executes this
    /// test binary with `MC_SIM_CHILD` set.
    #[test]
    fn sim_child_process() {
        let Ok(dir) = std::env::var("MC_SIM_CHILD") else {
            return;
        };
        let f = PathBuf::from(dir);
        let v = SimVerbs::new(&f, &["sim0"]).unwrap();
        let e = end(&v, 16);
        let mut mem = vec![0u8; 1 << 16];
        for (i, x) in mem.iter_mut().enumerate() {
            *x = (i % 251) as u8;
        }
        let addr = mem.as_mut_ptr() as u64;
        // SAFETY: `mem` lives until this function returns, after the parent is done.
        let mr = unsafe { v.reg_mr(e.pd, addr, mem.len() as u64, Access::ALL_RDMA) }.unwrap();
        let info = format!("{} {} {}", e.qp.qp_num, mr.rkey, addr);
        std::fs::write(f.join("child.tmp"), info).unwrap();
        std::fs::rename(f.join("child.tmp"), f.join("child.info")).unwrap();
        let parent_qpn: u32 = wait_file(&f.join("parent.info")).trim().parse().unwrap();
        connect(&v, &e, parent_qpn);
        std::fs::write(f.join("child.ready"), "").unwrap();
        wait_file(&f.join("parent.done"));
        // The parent wrote 0xAB over the first 4 KiB.
        // SAFETY: reading our own buffer after the parent signalled it is done.
        let got = unsafe { std::ptr::read_volatile(mem.as_ptr().cast::<[u8; 4096]>()) };
        assert!(got.iter().all(|&b| b == 0xAB));
        std::fs::write(f.join("child.ok"), "").unwrap();
    }

    fn wait_file(p: &Path) -> String {
        let t0 = Instant::now();
        loop {
            if let Ok(s) = std::fs::read_to_string(p) {
                return s;
            }
            assert!(
                t0.elapsed() < Duration::from_secs(20),
                "timed out waiting for {p:?}"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    #[test]
    fn across_processes() {
        let f = fabric("xproc");
        let exe = std::env::current_exe().unwrap();
        let mut child = std::process::Command::new(exe)
            .args([
                "--exact",
                "transport::rdma::sim::tests::sim_child_process",
                "--nocapture",
            ])
            .env("MC_SIM_CHILD", &f)
            .spawn()
            .unwrap();
        let info = wait_file(&f.join("child.info"));
        let parts: Vec<u64> = info.split(' ').map(|p| p.parse().unwrap()).collect();
        let (cqpn, rkey, raddr) = (parts[0] as u32, parts[1] as u32, parts[2]);
        let v = SimVerbs::new(&f, &["sim0"]).unwrap();
        let e = end(&v, 16);
        connect(&v, &e, cqpn);
        std::fs::write(f.join("parent.info"), e.qp.qp_num.to_string()).unwrap();
        wait_file(&f.join("child.ready"));
        let mut mine = vec![0xABu8; 8192];
        let la = mine.as_mut_ptr() as u64;
        // SAFETY: `mine` outlives the MR (deregistered below).
        let mr = unsafe { v.reg_mr(e.pd, la, 8192, Access::ALL_RDMA) }.unwrap();
        let wrs = [
            wr(
                1,
                RdmaOp::Read,
                (la + 4096, mr.lkey),
                4096,
                (raddr, rkey),
                false,
            ),
            wr(2, RdmaOp::Write, (la, mr.lkey), 4096, (raddr, rkey), true),
        ];
        // SAFETY: local ranges inside `mr`.
        unsafe { v.post_send(e.qp.qp, &wrs) }.unwrap();
        let c = poll_all(&v, e.cq);
        assert_eq!(c.len(), 1);
        assert!(c[0].status.is_ok(), "{c:?}");
        // The READ ran before the WRITE (ordered WRs): it saw the child's pattern.
        assert!(mine[4096..]
            .iter()
            .enumerate()
            .all(|(i, &b)| b == (i % 251) as u8));
        std::fs::write(f.join("parent.done"), "").unwrap();
        assert!(child.wait().unwrap().success());
        assert!(f.join("child.ok").exists());
        // The child is gone: its QP record was removed and its process is dead.
        let r = wr(3, RdmaOp::Read, (la, mr.lkey), 8, (raddr, rkey), true);
        // SAFETY: as above.
        unsafe { v.post_send(e.qp.qp, &[r]) }.unwrap();
        assert_eq!(poll_all(&v, e.cq)[0].status, WcStatus::RETRY_EXC_ERR);
        v.dereg_mr(mr).unwrap();
        drop(v);
        let _ = std::fs::remove_dir_all(&f);
    }
}
