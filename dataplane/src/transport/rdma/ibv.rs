//! The real [`Verbs`]: libibverbs loaded with `dlopen("libibverbs.so.1")` at run time, so a
//! build needs no RDMA headers or libraries and a machine without them runs everything else.
//!
//! Exported functions are looked up with `dlsym`. `ibv_post_send` and `ibv_poll_cq` are
//! `static inline` in `<infiniband/verbs.h>`: they call through the context's ops table,
//! `qp->context->ops.post_send` and `cq->context->ops.poll_cq`. This file does the same,
//! relying on these layouts (x86-64 and aarch64 LP64, rdma-core's stable ABI, unchanged since
//! libibverbs 1.1):
//!
//! ```text
//! struct ibv_context   { ibv_device *device @0; ibv_context_ops ops @8; ... }
//! struct ibv_context_ops: 8-byte function pointers; poll_cq is slot 11, post_send slot 25
//!   (0 query_device, 1 query_port, 2 alloc_pd, 3 dealloc_pd, 4 reg_mr, 5 rereg_mr,
//!    6 dereg_mr, 7 alloc_mw, 8 bind_mw, 9 dealloc_mw, 10 create_cq, 11 poll_cq,
//!    12 req_notify_cq, 13 cq_event, 14 resize_cq, 15 destroy_cq, 16..19 srq, 20 post_srq_recv,
//!    21 create_qp, 22 query_qp, 23 modify_qp, 24 destroy_qp, 25 post_send, 26 post_recv)
//! struct ibv_qp        { ibv_context *context @0; ...; u32 handle @48; u32 qp_num @52; ... }
//! struct ibv_cq        { ibv_context *context @0; ... }
//! struct ibv_mr        { context @0; pd @8; addr @16; length @24; u32 handle @32;
//!                        u32 lkey @36; u32 rkey @40 }
//! struct ibv_sge       { u64 addr; u32 length; u32 lkey }                      16 bytes
//! struct ibv_send_wr   { u64 wr_id @0; next @8; sg_list @16; i32 num_sge @24; u32 opcode @28;
//!                        u32 send_flags @32; u32 imm @36; wr.rdma { u64 remote_addr @40;
//!                        u32 rkey @48 } (union of 32); qp_type @72; bind_mw/tso @80 (48) } 128
//! struct ibv_wc        { u64 wr_id @0; u32 status @8; u32 opcode @12; u32 vendor_err @16;
//!                        u32 byte_len @20; u32 imm @24; u32 qp_num @28; ... }          48
//! struct ibv_qp_init_attr { qp_context; send_cq; recv_cq; srq; cap (5 x u32) @32;
//!                        u32 qp_type @52; i32 sq_sig_all @56 }                        64
//! struct ibv_qp_attr   (see `QpAttr`)                                                  144
//! ```
//!
//! The sizes are asserted at compile time; the ops slots are checked against a real library
//! by the runbook in `docs/rdma.md` (there is no RDMA hardware in CI).
//! `ibv_query_port` is called through its exported (compat) symbol, which fills the first 48
//! bytes of `struct ibv_port_attr`; the buffer passed is zeroed and larger.

use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::sync::{Arc, OnceLock};

use super::verbs::{
    Access, Completion, Cq, Ctx, Gid, Mr, Pd, PortInfo, Qp, QpCaps, QpInfo, RdmaOp, SendWr,
    Transition, Verbs, VerbsError, WcStatus,
};

/// The soname loaded.
pub const LIBRARY: &str = "libibverbs.so.1";

const OPS_OFFSET: usize = 8;
const OPS_POLL_CQ: usize = 11;
const OPS_POST_SEND: usize = 25;
const QP_NUM_OFFSET: usize = 52;
const MR_LKEY_OFFSET: usize = 36;
const MR_RKEY_OFFSET: usize = 40;
const IBV_QPT_RC: u32 = 2;
const IBV_WR_RDMA_WRITE: u32 = 0;
const IBV_WR_RDMA_READ: u32 = 4;
const IBV_SEND_SIGNALED: u32 = 2;

// ibv_qp_attr_mask bits.
const QP_STATE: c_int = 1;
const QP_ACCESS_FLAGS: c_int = 1 << 3;
const QP_PKEY_INDEX: c_int = 1 << 4;
const QP_PORT: c_int = 1 << 5;
const QP_AV: c_int = 1 << 7;
const QP_PATH_MTU: c_int = 1 << 8;
const QP_TIMEOUT: c_int = 1 << 9;
const QP_RETRY_CNT: c_int = 1 << 10;
const QP_RNR_RETRY: c_int = 1 << 11;
const QP_RQ_PSN: c_int = 1 << 12;
const QP_MAX_QP_RD_ATOMIC: c_int = 1 << 13;
const QP_MIN_RNR_TIMER: c_int = 1 << 15;
const QP_SQ_PSN: c_int = 1 << 16;
const QP_MAX_DEST_RD_ATOMIC: c_int = 1 << 17;
const QP_DEST_QPN: c_int = 1 << 20;

#[repr(C)]
struct Sge {
    addr: u64,
    length: u32,
    lkey: u32,
}

#[repr(C)]
struct SendWrC {
    wr_id: u64,
    next: *mut SendWrC,
    sg_list: *mut Sge,
    num_sge: c_int,
    opcode: u32,
    send_flags: u32,
    imm_data: u32,
    remote_addr: u64,
    rkey: u32,
    _wr_rest: [u32; 5],
    _qp_type: u32,
    _pad: u32,
    _bind_mw: [u64; 6],
}

#[repr(C)]
struct WcC {
    wr_id: u64,
    status: u32,
    opcode: u32,
    vendor_err: u32,
    byte_len: u32,
    imm_data: u32,
    qp_num: u32,
    src_qp: u32,
    wc_flags: u32,
    pkey_index: u16,
    slid: u16,
    sl: u8,
    dlid_path_bits: u8,
}

#[repr(C)]
#[derive(Default)]
struct QpCapC {
    max_send_wr: u32,
    max_recv_wr: u32,
    max_send_sge: u32,
    max_recv_sge: u32,
    max_inline_data: u32,
}

#[repr(C)]
struct QpInitAttr {
    qp_context: *mut c_void,
    send_cq: *mut c_void,
    recv_cq: *mut c_void,
    srq: *mut c_void,
    cap: QpCapC,
    qp_type: u32,
    sq_sig_all: c_int,
}

#[repr(C, align(8))]
#[derive(Default, Clone, Copy)]
struct RawGid([u8; 16]);

#[repr(C)]
#[derive(Default)]
struct GlobalRoute {
    dgid: RawGid,
    flow_label: u32,
    sgid_index: u8,
    hop_limit: u8,
    traffic_class: u8,
}

#[repr(C)]
#[derive(Default)]
struct AhAttr {
    grh: GlobalRoute,
    dlid: u16,
    sl: u8,
    src_path_bits: u8,
    static_rate: u8,
    is_global: u8,
    port_num: u8,
}

#[repr(C)]
#[derive(Default)]
struct QpAttr {
    qp_state: u32,
    cur_qp_state: u32,
    path_mtu: u32,
    path_mig_state: u32,
    qkey: u32,
    rq_psn: u32,
    sq_psn: u32,
    dest_qp_num: u32,
    qp_access_flags: u32,
    cap: QpCapC,
    ah_attr: AhAttr,
    alt_ah_attr: AhAttr,
    pkey_index: u16,
    alt_pkey_index: u16,
    en_sqd_async_notify: u8,
    sq_draining: u8,
    max_rd_atomic: u8,
    max_dest_rd_atomic: u8,
    min_rnr_timer: u8,
    port_num: u8,
    timeout: u8,
    retry_cnt: u8,
    rnr_retry: u8,
    alt_port_num: u8,
    alt_timeout: u8,
    rate_limit: u32,
}

const _: () = assert!(std::mem::size_of::<Sge>() == 16);
const _: () = assert!(std::mem::size_of::<SendWrC>() == 128);
const _: () = assert!(std::mem::offset_of!(SendWrC, remote_addr) == 40);
const _: () = assert!(std::mem::offset_of!(SendWrC, rkey) == 48);
const _: () = assert!(std::mem::offset_of!(SendWrC, _qp_type) == 72);
const _: () = assert!(std::mem::size_of::<WcC>() == 48);
const _: () = assert!(std::mem::offset_of!(WcC, qp_num) == 28);
const _: () = assert!(std::mem::size_of::<QpInitAttr>() == 64);
const _: () = assert!(std::mem::offset_of!(QpInitAttr, qp_type) == 52);
const _: () = assert!(std::mem::size_of::<AhAttr>() == 32);
const _: () = assert!(std::mem::offset_of!(QpAttr, ah_attr) == 56);
const _: () = assert!(std::mem::offset_of!(QpAttr, pkey_index) == 120);
const _: () = assert!(std::mem::offset_of!(QpAttr, rate_limit) == 136);
const _: () = assert!(std::mem::size_of::<QpAttr>() == 144);

type PostSendFn = unsafe extern "C" fn(*mut c_void, *mut SendWrC, *mut *mut SendWrC) -> c_int;
type PollCqFn = unsafe extern "C" fn(*mut c_void, c_int, *mut WcC) -> c_int;

/// The exported functions used, resolved once.
struct Fns {
    get_device_list: unsafe extern "C" fn(*mut c_int) -> *mut *mut c_void,
    free_device_list: unsafe extern "C" fn(*mut *mut c_void),
    get_device_name: unsafe extern "C" fn(*mut c_void) -> *const c_char,
    open_device: unsafe extern "C" fn(*mut c_void) -> *mut c_void,
    close_device: unsafe extern "C" fn(*mut c_void) -> c_int,
    query_port: unsafe extern "C" fn(*mut c_void, u8, *mut c_void) -> c_int,
    query_gid: unsafe extern "C" fn(*mut c_void, u8, c_int, *mut RawGid) -> c_int,
    alloc_pd: unsafe extern "C" fn(*mut c_void) -> *mut c_void,
    dealloc_pd: unsafe extern "C" fn(*mut c_void) -> c_int,
    reg_mr: unsafe extern "C" fn(*mut c_void, *mut c_void, usize, c_int) -> *mut c_void,
    dereg_mr: unsafe extern "C" fn(*mut c_void) -> c_int,
    create_cq:
        unsafe extern "C" fn(*mut c_void, c_int, *mut c_void, *mut c_void, c_int) -> *mut c_void,
    destroy_cq: unsafe extern "C" fn(*mut c_void) -> c_int,
    create_qp: unsafe extern "C" fn(*mut c_void, *mut QpInitAttr) -> *mut c_void,
    modify_qp: unsafe extern "C" fn(*mut c_void, *mut QpAttr, c_int) -> c_int,
    destroy_qp: unsafe extern "C" fn(*mut c_void) -> c_int,
}

/// libibverbs through `dlopen`; see the module docs.
pub struct IbVerbs {
    fns: Fns,
}

fn dl_error() -> String {
    // SAFETY: dlerror returns a thread-local C string or null.
    let p = unsafe { libc::dlerror() };
    if p.is_null() {
        "unknown dlopen error".into()
    } else {
        // SAFETY: non-null, NUL-terminated, valid until the next dl* call on this thread.
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    }
}

fn errno() -> i32 {
    std::io::Error::last_os_error()
        .raw_os_error()
        .unwrap_or(libc::EIO)
}

static LOADED: OnceLock<Result<Arc<IbVerbs>, VerbsError>> = OnceLock::new();

impl IbVerbs {
    /// Loads the library once per process (it is never unloaded). Errors name the soname
    /// and what `dlopen`/`dlsym` said.
    pub fn load() -> Result<Arc<IbVerbs>, VerbsError> {
        LOADED
            .get_or_init(|| IbVerbs::load_from(LIBRARY).map(Arc::new))
            .clone()
    }

    /// Loads `soname` (tests pass a missing name to check the error).
    // Each transmute's target is the `Fns` field it initialises, which names the prototype.
    #[allow(clippy::missing_transmute_annotations)]
    pub fn load_from(soname: &str) -> Result<IbVerbs, VerbsError> {
        let c = CString::new(soname).map_err(|_| VerbsError::Unavailable("bad soname".into()))?;
        // SAFETY: a valid C string; RTLD_NOW resolves everything before returning.
        let h = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        if h.is_null() {
            return Err(VerbsError::Unavailable(format!(
                "cannot load {soname}: {} (install rdma-core / libibverbs1)",
                dl_error()
            )));
        }
        macro_rules! sym {
            ($name:literal) => {{
                let n = CString::new($name).unwrap_or_default();
                // SAFETY: `h` is a live handle from dlopen; `n` is a valid C string.
                let p = unsafe { libc::dlsym(h, n.as_ptr()) };
                if p.is_null() {
                    return Err(VerbsError::Unavailable(format!(
                        "{soname} has no symbol {}: {}",
                        $name,
                        dl_error()
                    )));
                }
                // SAFETY: the symbol is libibverbs' exported function of that name, whose C
                // prototype the field type mirrors (verbs.h).
                unsafe { std::mem::transmute::<*mut c_void, _>(p) }
            }};
        }
        let fns = Fns {
            get_device_list: sym!("ibv_get_device_list"),
            free_device_list: sym!("ibv_free_device_list"),
            get_device_name: sym!("ibv_get_device_name"),
            open_device: sym!("ibv_open_device"),
            close_device: sym!("ibv_close_device"),
            query_port: sym!("ibv_query_port"),
            query_gid: sym!("ibv_query_gid"),
            alloc_pd: sym!("ibv_alloc_pd"),
            dealloc_pd: sym!("ibv_dealloc_pd"),
            reg_mr: sym!("ibv_reg_mr"),
            dereg_mr: sym!("ibv_dereg_mr"),
            create_cq: sym!("ibv_create_cq"),
            destroy_cq: sym!("ibv_destroy_cq"),
            create_qp: sym!("ibv_create_qp"),
            modify_qp: sym!("ibv_modify_qp"),
            destroy_qp: sym!("ibv_destroy_qp"),
        };
        Ok(IbVerbs { fns })
    }

    /// Opens the device list and finds `name` (or lists all when `name` is None).
    fn with_devices<T>(
        &self,
        f: impl FnOnce(&[(*mut c_void, String)]) -> Result<T, VerbsError>,
    ) -> Result<T, VerbsError> {
        let mut n: c_int = 0;
        // SAFETY: `n` is a live int the library writes the count into.
        let list = unsafe { (self.fns.get_device_list)(&mut n) };
        if list.is_null() {
            return Err(VerbsError::call("ibv_get_device_list", errno()));
        }
        let mut devs = Vec::new();
        for i in 0..n.max(0) as usize {
            // SAFETY: the list holds `n` device pointers.
            let d = unsafe { *list.add(i) };
            // SAFETY: `d` is a device of the list; the name is a C string owned by it.
            let name = unsafe { (self.fns.get_device_name)(d) };
            let name = if name.is_null() {
                String::new()
            } else {
                // SAFETY: non-null NUL-terminated string owned by the device.
                unsafe { CStr::from_ptr(name) }
                    .to_string_lossy()
                    .into_owned()
            };
            devs.push((d, name));
        }
        let r = f(&devs);
        // SAFETY: `list` came from ibv_get_device_list; opened contexts stay valid after it
        // is freed (verbs.h).
        unsafe { (self.fns.free_device_list)(list) };
        r
    }
}

/// A work-request chain in libibverbs' layout: one SGE per WR, WR `i` linked to `i + 1`.
/// The vectors are never resized after linking, so the pointers stay valid while it lives.
struct Chain {
    sges: Vec<Sge>,
    wrs: Vec<SendWrC>,
}

impl Chain {
    fn new(wrs: &[SendWr]) -> Chain {
        let sges: Vec<Sge> = wrs
            .iter()
            .map(|w| Sge {
                addr: w.local_addr,
                length: w.len,
                lkey: w.lkey,
            })
            .collect();
        let cw: Vec<SendWrC> = wrs
            .iter()
            .map(|w| SendWrC {
                wr_id: w.wr_id,
                next: std::ptr::null_mut(),
                sg_list: std::ptr::null_mut(),
                num_sge: 1,
                opcode: match w.op {
                    RdmaOp::Write => IBV_WR_RDMA_WRITE,
                    RdmaOp::Read => IBV_WR_RDMA_READ,
                },
                send_flags: if w.signaled { IBV_SEND_SIGNALED } else { 0 },
                imm_data: 0,
                remote_addr: w.remote_addr,
                rkey: w.rkey,
                _wr_rest: [0; 5],
                _qp_type: 0,
                _pad: 0,
                _bind_mw: [0; 6],
            })
            .collect();
        let mut c = Chain { sges, wrs: cw };
        let n = c.wrs.len();
        let base = c.wrs.as_mut_ptr();
        let sg = c.sges.as_mut_ptr();
        for i in 0..n {
            // SAFETY: `i` (and `i + 1` when linked) index the two vectors of length `n`.
            unsafe {
                (*base.add(i)).sg_list = sg.add(i);
                if i + 1 < n {
                    (*base.add(i)).next = base.add(i + 1);
                }
            }
        }
        c
    }

    fn head(&mut self) -> *mut SendWrC {
        self.wrs.as_mut_ptr()
    }
}

fn ptr<T>(h: u64) -> *mut T {
    h as usize as *mut T
}

fn check(call: &'static str, rc: c_int) -> Result<(), VerbsError> {
    if rc == 0 {
        Ok(())
    } else {
        // Most verbs return an errno value; some return -1 and set errno.
        Err(VerbsError::call(call, if rc > 0 { rc } else { errno() }))
    }
}

fn non_null(call: &'static str, p: *mut c_void) -> Result<u64, VerbsError> {
    if p.is_null() {
        Err(VerbsError::call(call, errno()))
    } else {
        Ok(p as usize as u64)
    }
}

/// Reads the function pointer in ops slot `slot` of the context `obj` points to (its first
/// field).
///
/// # Safety
/// `obj` must be a live `ibv_qp` or `ibv_cq` from this library.
unsafe fn op_slot(obj: *mut c_void, slot: usize) -> *const c_void {
    // SAFETY: per the contract, the first field of `obj` is `struct ibv_context *`, and the
    // context's ops table starts at OPS_OFFSET with one pointer per slot (module docs).
    unsafe {
        let ctx = *(obj as *const *const u8);
        *(ctx.add(OPS_OFFSET + slot * 8) as *const *const c_void)
    }
}

/// `ibv_mtu` for a byte size (clamped to 256..=4096).
pub fn mtu_enum(bytes: u32) -> u32 {
    match bytes {
        0..=256 => 1,
        257..=512 => 2,
        513..=1024 => 3,
        1025..=2048 => 4,
        _ => 5,
    }
}

impl Verbs for IbVerbs {
    fn kind(&self) -> &'static str {
        "libibverbs"
    }

    fn device_names(&self) -> Result<Vec<String>, VerbsError> {
        self.with_devices(|d| Ok(d.iter().map(|(_, n)| n.clone()).collect()))
    }

    fn open_device(&self, name: &str) -> Result<Ctx, VerbsError> {
        self.with_devices(|devs| {
            let (d, _) = devs
                .iter()
                .find(|(_, n)| n == name)
                .ok_or_else(|| VerbsError::NoDevice(name.to_string()))?;
            // SAFETY: `d` is a device of the live list.
            let ctx = unsafe { (self.fns.open_device)(*d) };
            non_null("ibv_open_device", ctx).map(Ctx)
        })
    }

    fn close_device(&self, ctx: Ctx) -> Result<(), VerbsError> {
        // SAFETY: `ctx` came from open_device and is closed once (the caller owns it).
        check("ibv_close_device", unsafe {
            (self.fns.close_device)(ptr(ctx.0))
        })
    }

    fn query_port(&self, ctx: Ctx, port: u8) -> Result<PortInfo, VerbsError> {
        let mut buf = [0u8; 128];
        // SAFETY: a live context; the buffer is larger than any ibv_port_attr version.
        let rc = unsafe { (self.fns.query_port)(ptr(ctx.0), port, buf.as_mut_ptr().cast()) };
        check("ibv_query_port", rc)?;
        let u32_at = |o: usize| u32::from_ne_bytes([buf[o], buf[o + 1], buf[o + 2], buf[o + 3]]);
        Ok(PortInfo {
            state: u32_at(0),
            active_mtu: u32_at(8),
            gid_table_len: u32_at(12) as i32,
            lid: u16::from_ne_bytes([buf[34], buf[35]]),
            link_layer: buf[46],
        })
    }

    fn query_gid(&self, ctx: Ctx, port: u8, index: u8) -> Result<Gid, VerbsError> {
        let mut g = RawGid::default();
        // SAFETY: a live context and a 16-byte out parameter.
        let rc = unsafe { (self.fns.query_gid)(ptr(ctx.0), port, c_int::from(index), &mut g) };
        check("ibv_query_gid", rc)?;
        Ok(Gid(g.0))
    }

    fn alloc_pd(&self, ctx: Ctx) -> Result<Pd, VerbsError> {
        // SAFETY: a live context.
        non_null("ibv_alloc_pd", unsafe { (self.fns.alloc_pd)(ptr(ctx.0)) }).map(Pd)
    }

    fn dealloc_pd(&self, pd: Pd) -> Result<(), VerbsError> {
        // SAFETY: a live PD, released once.
        check("ibv_dealloc_pd", unsafe {
            (self.fns.dealloc_pd)(ptr(pd.0))
        })
    }

    unsafe fn reg_mr(&self, pd: Pd, addr: u64, len: u64, access: Access) -> Result<Mr, VerbsError> {
        // SAFETY: a live PD; the range's validity is the caller's contract.
        let mr =
            unsafe { (self.fns.reg_mr)(ptr(pd.0), ptr(addr), len as usize, access.0 as c_int) };
        let h = non_null("ibv_reg_mr", mr)?;
        // SAFETY: `mr` is a live struct ibv_mr; lkey/rkey offsets per the module docs.
        let (lkey, rkey) = unsafe {
            let b = mr as *const u8;
            (
                *(b.add(MR_LKEY_OFFSET) as *const u32),
                *(b.add(MR_RKEY_OFFSET) as *const u32),
            )
        };
        Ok(Mr {
            handle: h,
            lkey,
            rkey,
        })
    }

    fn dereg_mr(&self, mr: Mr) -> Result<(), VerbsError> {
        // SAFETY: a live MR, released once.
        check("ibv_dereg_mr", unsafe {
            (self.fns.dereg_mr)(ptr(mr.handle))
        })
    }

    fn create_cq(&self, ctx: Ctx, depth: u32) -> Result<Cq, VerbsError> {
        // SAFETY: a live context; no completion channel.
        let cq = unsafe {
            (self.fns.create_cq)(
                ptr(ctx.0),
                depth as c_int,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                0,
            )
        };
        non_null("ibv_create_cq", cq).map(Cq)
    }

    fn destroy_cq(&self, cq: Cq) -> Result<(), VerbsError> {
        // SAFETY: a live CQ with no QP left on it, destroyed once.
        check("ibv_destroy_cq", unsafe {
            (self.fns.destroy_cq)(ptr(cq.0))
        })
    }

    fn create_qp(&self, pd: Pd, cq: Cq, caps: QpCaps) -> Result<QpInfo, VerbsError> {
        let mut attr = QpInitAttr {
            qp_context: std::ptr::null_mut(),
            send_cq: ptr(cq.0),
            recv_cq: ptr(cq.0),
            srq: std::ptr::null_mut(),
            cap: QpCapC {
                max_send_wr: caps.max_send_wr,
                max_recv_wr: caps.max_recv_wr,
                max_send_sge: caps.max_sge,
                max_recv_sge: caps.max_sge,
                max_inline_data: caps.max_inline,
            },
            qp_type: IBV_QPT_RC,
            sq_sig_all: 0,
        };
        // SAFETY: a live PD and CQ; `attr` is a valid ibv_qp_init_attr.
        let qp = unsafe { (self.fns.create_qp)(ptr(pd.0), &mut attr) };
        let h = non_null("ibv_create_qp", qp)?;
        // SAFETY: `qp` is a live struct ibv_qp; qp_num's offset per the module docs.
        let qp_num = unsafe { *((qp as *const u8).add(QP_NUM_OFFSET) as *const u32) };
        Ok(QpInfo { qp: Qp(h), qp_num })
    }

    fn modify_qp(&self, qp: Qp, step: Transition) -> Result<(), VerbsError> {
        let mut a = QpAttr {
            qp_state: step.states().1 as u32,
            ..Default::default()
        };
        let mask = match step {
            Transition::Init { port } => {
                a.port_num = port;
                a.qp_access_flags = Access::ALL_RDMA.0;
                QP_STATE | QP_PKEY_INDEX | QP_PORT | QP_ACCESS_FLAGS
            }
            Transition::Rtr {
                remote,
                mtu,
                gid_index,
                port,
            } => {
                a.path_mtu = mtu;
                a.dest_qp_num = remote.qp_num;
                a.rq_psn = remote.psn;
                a.max_dest_rd_atomic = 16;
                a.min_rnr_timer = 12;
                a.ah_attr.dlid = remote.lid;
                a.ah_attr.port_num = port;
                if !remote.gid.is_zero() {
                    a.ah_attr.is_global = 1;
                    a.ah_attr.grh.dgid = RawGid(remote.gid.0);
                    a.ah_attr.grh.sgid_index = gid_index;
                    a.ah_attr.grh.hop_limit = 0xff;
                }
                QP_STATE
                    | QP_AV
                    | QP_PATH_MTU
                    | QP_DEST_QPN
                    | QP_RQ_PSN
                    | QP_MAX_DEST_RD_ATOMIC
                    | QP_MIN_RNR_TIMER
            }
            Transition::Rts { psn } => {
                a.timeout = 14;
                a.retry_cnt = 7;
                a.rnr_retry = 7;
                a.sq_psn = psn;
                a.max_rd_atomic = 16;
                QP_STATE
                    | QP_TIMEOUT
                    | QP_RETRY_CNT
                    | QP_RNR_RETRY
                    | QP_SQ_PSN
                    | QP_MAX_QP_RD_ATOMIC
            }
            Transition::Err => QP_STATE,
        };
        // SAFETY: a live QP and a valid ibv_qp_attr for the mask.
        check("ibv_modify_qp", unsafe {
            (self.fns.modify_qp)(ptr(qp.0), &mut a, mask)
        })
    }

    fn destroy_qp(&self, qp: Qp) -> Result<(), VerbsError> {
        // SAFETY: a live QP, destroyed once.
        check("ibv_destroy_qp", unsafe {
            (self.fns.destroy_qp)(ptr(qp.0))
        })
    }

    unsafe fn post_send(&self, qp: Qp, wrs: &[SendWr]) -> Result<(), VerbsError> {
        if wrs.is_empty() {
            return Ok(());
        }
        let mut chain = Chain::new(wrs);
        let base = chain.head();
        let mut bad: *mut SendWrC = std::ptr::null_mut();
        // SAFETY: `qp` is a live ibv_qp; slot 25 is post_send (module docs), which copies the
        // chain into the send queue before returning (the vectors may drop afterwards).
        let rc = unsafe {
            let f =
                std::mem::transmute::<*const c_void, PostSendFn>(op_slot(ptr(qp.0), OPS_POST_SEND));
            f(ptr(qp.0), base, &mut bad)
        };
        if rc == 0 {
            return Ok(());
        }
        let index = if bad.is_null() {
            0
        } else {
            // SAFETY: `bad` points into `chain`'s WR vector when set.
            (unsafe { bad.offset_from(base) }).max(0) as usize
        };
        Err(VerbsError::Post { index, errno: rc })
    }

    fn poll_cq(&self, cq: Cq, max: usize, out: &mut Vec<Completion>) -> Result<usize, VerbsError> {
        let max = max.min(256);
        let mut wcs: Vec<WcC> = Vec::with_capacity(max);
        // SAFETY: `cq` is a live ibv_cq; slot 11 is poll_cq (module docs); it writes at most
        // `max` entries into the spare capacity.
        let n = unsafe {
            let f = std::mem::transmute::<*const c_void, PollCqFn>(op_slot(ptr(cq.0), OPS_POLL_CQ));
            f(ptr(cq.0), max as c_int, wcs.as_mut_ptr())
        };
        if n < 0 {
            return Err(VerbsError::call("ibv_poll_cq", -n));
        }
        // SAFETY: the library initialised the first `n` (<= max) entries.
        unsafe { wcs.set_len(n as usize) };
        out.extend(wcs.iter().map(|w| Completion {
            wr_id: w.wr_id,
            status: WcStatus(w.status),
            qp_num: w.qp_num,
            byte_len: w.byte_len,
        }));
        Ok(n as usize)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_library_is_a_clear_error() {
        let e = IbVerbs::load_from("libibverbs-does-not-exist.so.9")
            .err()
            .unwrap();
        let t = e.to_string();
        assert!(t.contains("libibverbs unavailable"), "{t}");
        assert!(t.contains("libibverbs-does-not-exist.so.9"), "{t}");
    }

    #[test]
    fn work_request_chain_layout() {
        let w = |id, op, sig| SendWr {
            wr_id: id,
            op,
            local_addr: 0x1000 * id,
            len: 64,
            lkey: 7,
            remote_addr: 0x9000 + id,
            rkey: 9,
            signaled: sig,
        };
        let mut c = Chain::new(&[w(1, RdmaOp::Write, false), w(2, RdmaOp::Read, true)]);
        let head = c.head();
        // SAFETY: reading the chain just built, while it lives.
        unsafe {
            let a = &*head;
            assert_eq!((a.wr_id, a.opcode, a.send_flags, a.num_sge), (1, 0, 0, 1));
            assert_eq!((a.remote_addr, a.rkey), (0x9001, 9));
            assert_eq!(
                ((*a.sg_list).addr, (*a.sg_list).length, (*a.sg_list).lkey),
                (0x1000, 64, 7)
            );
            let b = &*a.next;
            assert_eq!(
                (b.wr_id, b.opcode, b.send_flags),
                (2, IBV_WR_RDMA_READ, IBV_SEND_SIGNALED)
            );
            assert_eq!((*b.sg_list).addr, 0x2000);
            assert!(b.next.is_null());
        }
        assert!(Chain::new(&[]).wrs.is_empty());
    }

    #[test]
    fn mtu_enum_values() {
        assert_eq!(mtu_enum(256), 1);
        assert_eq!(mtu_enum(1024), 3);
        assert_eq!(mtu_enum(4096), 5);
        assert_eq!(mtu_enum(9000), 5);
    }

    /// Where libibverbs is installed (rdma-core without devices, as in CI), loading works
    /// and the device list is readable; the machine has no HCA, so it may be empty.
    #[test]
    fn loads_the_system_library_when_present() {
        match IbVerbs::load() {
            Ok(v) => {
                let names = v.device_names();
                // No kernel RDMA support: the list is empty or the call reports an errno.
                if let Ok(n) = names {
                    for d in &n {
                        assert!(!d.is_empty());
                    }
                }
                assert!(v.open_device("no-such-device").is_err());
            }
            Err(e) => {
                assert!(matches!(e, VerbsError::Unavailable(_)));
                let installed = [
                    "/usr/lib/x86_64-linux-gnu",
                    "/usr/lib/aarch64-linux-gnu",
                    "/usr/lib64",
                ]
                .iter()
                .any(|d| std::path::Path::new(d).join(LIBRARY).exists());
                assert!(!installed, "{LIBRARY} is installed but did not load: {e}");
            }
        }
    }
}
