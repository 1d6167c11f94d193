//! The narrow verbs interface the RDMA transport is written against, and its value types.
//!
//! Two implementations: [`super::ibv::IbVerbs`] (libibverbs, loaded with `dlopen` at run time)
//! and [`super::sim::SimVerbs`] (a software model of RC queue pairs across processes). Every
//! object is named by an opaque handle (`u64`): a pointer for the real library, a table index
//! for the model. Handles are only meaningful to the [`Verbs`] value that made them.
//!
//! The numbers of [`WcStatus`], [`QpState`] and [`Access`] are libibverbs' (`verbs.h`), so a
//! completion status reads the same in logs whichever implementation produced it.

use std::fmt;

/// An opened device context (`struct ibv_context *`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Ctx(pub u64);
/// A protection domain (`struct ibv_pd *`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Pd(pub u64);
/// A completion queue (`struct ibv_cq *`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Cq(pub u64);
/// A queue pair (`struct ibv_qp *`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Qp(pub u64);

/// A registered memory region: its handle and keys.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Mr {
    pub handle: u64,
    pub lkey: u32,
    pub rkey: u32,
}

/// A created queue pair: handle and number (`qp->qp_num`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QpInfo {
    pub qp: Qp,
    pub qp_num: u32,
}

pub use crate::metadata::rdma_desc::Gid;

/// What `ibv_query_port` tells the transport.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PortInfo {
    /// `IBV_PORT_ACTIVE` is 4.
    pub state: u32,
    /// `enum ibv_mtu` (1 = 256 .. 5 = 4096).
    pub active_mtu: u32,
    pub lid: u16,
    /// 1 InfiniBand, 2 Ethernet (RoCE).
    pub link_layer: u8,
    pub gid_table_len: i32,
}

/// `IBV_PORT_ACTIVE`.
pub const PORT_ACTIVE: u32 = 4;
/// `IBV_LINK_LAYER_ETHERNET`.
pub const LINK_LAYER_ETHERNET: u8 = 2;

/// Memory-region access flags (`enum ibv_access_flags`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Access(pub u32);

impl Access {
    pub const LOCAL_WRITE: Access = Access(1);
    pub const REMOTE_WRITE: Access = Access(1 << 1);
    pub const REMOTE_READ: Access = Access(1 << 2);
    /// What the transport registers buffers with.
    pub const ALL_RDMA: Access = Access(1 | (1 << 1) | (1 << 2));

    pub fn contains(self, other: Access) -> bool {
        self.0 & other.0 == other.0
    }
}

/// QP states (`enum ibv_qp_state`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum QpState {
    Reset = 0,
    Init = 1,
    Rtr = 2,
    Rts = 3,
    Sqd = 4,
    Sqe = 5,
    Err = 6,
}

impl QpState {
    pub fn from_u32(v: u32) -> Option<QpState> {
        Some(match v {
            0 => QpState::Reset,
            1 => QpState::Init,
            2 => QpState::Rtr,
            3 => QpState::Rts,
            4 => QpState::Sqd,
            5 => QpState::Sqe,
            6 => QpState::Err,
            _ => return None,
        })
    }
}

/// The remote end an RC QP is connected to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RemoteEnd {
    pub qp_num: u32,
    pub lid: u16,
    pub gid: Gid,
    /// The peer's starting send PSN (our receive PSN).
    pub psn: u32,
}

/// One step of the RC connection state machine, with what that step needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transition {
    /// RESET -> INIT on `port` with remote access rights.
    Init { port: u8 },
    /// INIT -> RTR towards `remote`, path MTU (`enum ibv_mtu`), the local GID index.
    Rtr {
        remote: RemoteEnd,
        mtu: u32,
        gid_index: u8,
        port: u8,
    },
    /// RTR -> RTS with our send PSN.
    Rts { psn: u32 },
    /// Any -> ERR (flushes outstanding work requests).
    Err,
}

impl Transition {
    /// The state this step leaves from and the one it reaches.
    pub fn states(&self) -> (Option<QpState>, QpState) {
        match self {
            Transition::Init { .. } => (Some(QpState::Reset), QpState::Init),
            Transition::Rtr { .. } => (Some(QpState::Init), QpState::Rtr),
            Transition::Rts { .. } => (Some(QpState::Rtr), QpState::Rts),
            Transition::Err => (None, QpState::Err),
        }
    }
}

/// One-sided operations.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RdmaOp {
    /// `IBV_WR_RDMA_WRITE` (0): local bytes to remote memory.
    Write,
    /// `IBV_WR_RDMA_READ` (4): remote bytes to local memory.
    Read,
}

/// One send work request with one scatter/gather element.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SendWr {
    pub wr_id: u64,
    pub op: RdmaOp,
    pub local_addr: u64,
    pub len: u32,
    pub lkey: u32,
    pub remote_addr: u64,
    pub rkey: u32,
    /// `IBV_SEND_SIGNALED`: a completion is generated on success (errors always complete).
    pub signaled: bool,
}

/// Completion statuses (`enum ibv_wc_status`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WcStatus(pub u32);

impl WcStatus {
    pub const SUCCESS: WcStatus = WcStatus(0);
    pub const LOC_LEN_ERR: WcStatus = WcStatus(1);
    pub const LOC_QP_OP_ERR: WcStatus = WcStatus(2);
    pub const LOC_PROT_ERR: WcStatus = WcStatus(4);
    pub const WR_FLUSH_ERR: WcStatus = WcStatus(5);
    pub const LOC_ACCESS_ERR: WcStatus = WcStatus(8);
    pub const REM_INV_REQ_ERR: WcStatus = WcStatus(9);
    pub const REM_ACCESS_ERR: WcStatus = WcStatus(10);
    pub const REM_OP_ERR: WcStatus = WcStatus(11);
    pub const RETRY_EXC_ERR: WcStatus = WcStatus(12);
    pub const GENERAL_ERR: WcStatus = WcStatus(21);

    pub fn is_ok(self) -> bool {
        self == WcStatus::SUCCESS
    }

    /// libibverbs' `ibv_wc_status_str` names.
    pub fn name(self) -> &'static str {
        match self.0 {
            0 => "success",
            1 => "local length error",
            2 => "local QP operation error",
            4 => "local protection error",
            5 => "Work Request Flushed Error",
            8 => "local access error",
            9 => "remote invalid request error",
            10 => "remote access error",
            11 => "remote operation error",
            12 => "transport retry counter exceeded",
            13 => "RNR retry counter exceeded",
            21 => "general error",
            _ => "other error",
        }
    }
}

impl fmt::Display for WcStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.name(), self.0)
    }
}

/// One work completion.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Completion {
    pub wr_id: u64,
    pub status: WcStatus,
    pub qp_num: u32,
    pub byte_len: u32,
}

/// Queue sizes of a new QP.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QpCaps {
    pub max_send_wr: u32,
    pub max_recv_wr: u32,
    pub max_sge: u32,
    pub max_inline: u32,
}

/// Why a verbs call failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VerbsError {
    /// libibverbs could not be loaded or lacks a symbol.
    #[error("libibverbs unavailable: {0}")]
    Unavailable(String),
    /// No device of that name.
    #[error("no RDMA device named {0:?}")]
    NoDevice(String),
    /// A call returned an error; `errno` as the library reported it.
    #[error("{call} failed: errno {errno} ({why})")]
    Call {
        call: &'static str,
        errno: i32,
        why: String,
    },
    /// `post_send` refused work request `index` of the batch (the ones before it were posted).
    #[error("post_send refused work request {index}: errno {errno}")]
    Post { index: usize, errno: i32 },
    /// A handle this implementation never made (or already destroyed).
    #[error("unknown {0} handle")]
    BadHandle(&'static str),
}

impl VerbsError {
    pub(crate) fn call(call: &'static str, errno: i32) -> VerbsError {
        VerbsError::Call {
            call,
            errno,
            why: std::io::Error::from_raw_os_error(errno.abs()).to_string(),
        }
    }
}

/// The verbs calls the transport makes; see the module docs.
pub trait Verbs: Send + Sync {
    /// Implementation name for logs (`libibverbs`, `sim`).
    fn kind(&self) -> &'static str;
    /// Device names as `ibv_get_device_list` gives them.
    fn device_names(&self) -> Result<Vec<String>, VerbsError>;
    fn open_device(&self, name: &str) -> Result<Ctx, VerbsError>;
    fn close_device(&self, ctx: Ctx) -> Result<(), VerbsError>;
    fn query_port(&self, ctx: Ctx, port: u8) -> Result<PortInfo, VerbsError>;
    fn query_gid(&self, ctx: Ctx, port: u8, index: u8) -> Result<Gid, VerbsError>;
    fn alloc_pd(&self, ctx: Ctx) -> Result<Pd, VerbsError>;
    fn dealloc_pd(&self, pd: Pd) -> Result<(), VerbsError>;
    /// Registers `[addr, addr + len)` in `pd`.
    ///
    /// # Safety
    /// The range must stay mapped until [`Verbs::dereg_mr`]; remote peers may read and write
    /// it through the rkey at any time (as `access` allows).
    unsafe fn reg_mr(&self, pd: Pd, addr: u64, len: u64, access: Access) -> Result<Mr, VerbsError>;
    fn dereg_mr(&self, mr: Mr) -> Result<(), VerbsError>;
    fn create_cq(&self, ctx: Ctx, depth: u32) -> Result<Cq, VerbsError>;
    fn destroy_cq(&self, cq: Cq) -> Result<(), VerbsError>;
    /// An RC QP whose send and receive completions go to `cq`, with `sq_sig_all = 0`
    /// (selective signalling).
    fn create_qp(&self, pd: Pd, cq: Cq, caps: QpCaps) -> Result<QpInfo, VerbsError>;
    fn modify_qp(&self, qp: Qp, step: Transition) -> Result<(), VerbsError>;
    fn destroy_qp(&self, qp: Qp) -> Result<(), VerbsError>;
    /// Posts `wrs` as one chained list, in order.
    ///
    /// # Safety
    /// Every local range must be inside a memory region with that lkey and stay valid until
    /// the WR's completion (or a later signalled one) was polled or the QP was destroyed.
    unsafe fn post_send(&self, qp: Qp, wrs: &[SendWr]) -> Result<(), VerbsError>;
    /// Appends up to `max` completions of `cq` to `out`; returns how many.
    fn poll_cq(&self, cq: Cq, max: usize, out: &mut Vec<Completion>) -> Result<usize, VerbsError>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gid_text_round_trips_both_forms() {
        let mut raw = [0u8; 16];
        raw[0] = 0xfe;
        raw[1] = 0x80;
        raw[15] = 0x01;
        let g = Gid(raw);
        let t = g.to_text();
        assert_eq!(t, "fe:80:00:00:00:00:00:00:00:00:00:00:00:00:00:01");
        assert_eq!(Gid::parse(&t).unwrap(), g);
        assert_eq!(
            Gid::parse("fe80:0000:0000:0000:0000:0000:0000:0001").unwrap(),
            g
        );
        assert!(Gid::parse("").is_err());
        assert!(Gid::parse("fe:80").is_err());
        assert!(Gid::parse("zz:80:00:00:00:00:00:00:00:00:00:00:00:00:00:01").is_err());
        assert!(Gid::parse("fe80:0:0:0:0:0:0:1").is_err());
        assert!(Gid::parse("+e:80:00:00:00:00:00:00:00:00:00:00:00:00:00:01").is_err());
        assert!(Gid::default().is_zero() && !g.is_zero());
    }

    #[test]
    fn transitions_follow_the_rc_state_machine() {
        assert_eq!(
            Transition::Init { port: 1 }.states(),
            (Some(QpState::Reset), QpState::Init)
        );
        assert_eq!(
            Transition::Rts { psn: 0 }.states(),
            (Some(QpState::Rtr), QpState::Rts)
        );
        assert_eq!(Transition::Err.states(), (None, QpState::Err));
        for v in 0..7 {
            assert_eq!(QpState::from_u32(v).unwrap() as u32, v);
        }
        assert!(QpState::from_u32(7).is_none());
        assert!(Access::ALL_RDMA.contains(Access::REMOTE_READ));
        assert!(!Access::LOCAL_WRITE.contains(Access::REMOTE_WRITE));
        assert_eq!(
            WcStatus::WR_FLUSH_ERR.to_string(),
            "Work Request Flushed Error (5)"
        );
    }
}
