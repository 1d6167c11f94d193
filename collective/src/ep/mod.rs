//! Expert-parallel dispatch and combine (`mooncake.mooncake_ep_buffer.Buffer`) on CPU.
//!
//! Every rank owns one EP buffer ([`seg::EpSegment`]); every other rank maps it and writes
//! into it. A call moves tokens by *one-sided writes*: the sender copies each row straight
//! into the receiver's buffer at the place [`layout::Shape`] gives it, then publishes a
//! counter (`posted`) in the receiver's header. The receiver polls only its own memory and,
//! when it has read a call's data, writes an `acked` counter back into the sender's header.
//!
//! - dispatch: source rank `s` writes, for each local expert `l` of rank `r`, the rows of the
//!   tokens routed to `r*L + l` into block `s` of `r`'s dispatch set, then `posted[s] = n`;
//!   `r` waits for every source, then packs the blocks into `recv_x` (sources ascending,
//!   tokens ascending inside a source), with `layout_range` and `src_info` saying where each
//!   row came from ([`dispatch`]);
//! - combine: the expert owner writes each expert output row back into its token's source
//!   rank at `(expert, token)` with a stamp naming the call; the source then reduces
//!   `sum_k w[t,k] * row(topk[t,k], t)` in f32 over live experts ([`combine`]).
//!
//! Invariants:
//! - double buffering: call `n` of a phase uses data set `n % 2`; a sender writes set `n % 2`
//!   of rank `r` only after `r` has acked call `n - 2` of that phase, so a set is never
//!   overwritten while it is read;
//! - a receiver waits at most `timeout_us` per call (from the call's start) for a source; a
//!   source that has not posted by then, or whose process died, is marked inactive in the
//!   caller's mask and counts as zero tokens; a source already marked inactive is not waited
//!   for, but its data is used if it has already arrived (upstream's rule);
//! - every read of data a peer wrote is preceded by a descriptor check, so calls with
//!   different shapes fail with a message instead of reading misplaced bytes; every write is
//!   bounds-checked against the target buffer's size;
//! - the runtime never reads a peer's memory, only writes it ([`EpPeer`]): the same-host
//!   peer is a mapped file ([`LocalPeer`]), a peer on another host a TCP link whose receive
//!   thread applies the writes to the peer's own buffer ([`net::RemotePeer`]).

pub mod combine;
pub mod dispatch;
pub mod fp8;
pub mod layout;
pub mod net;
pub mod seg;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

pub use layout::{size_hint, Shape};
pub use seg::{EpDesc, EpSegment, Phase};

pub use crate::limits::{
    EP_HEADER_BYTES, EP_MAX_LOCAL_EXPERTS, EP_MAX_RANKS, EP_MAX_TOKENS_PER_RANK,
};

/// Where a rank's writes to a peer go. The runtime only ever *writes* a peer (data, then a
/// counter with release semantics) and asks whether its process is alive; it never reads a
/// peer's memory. Same host: [`LocalPeer`]; another host: [`net::RemotePeer`].
pub trait EpPeer: Send + Sync {
    /// Bytes of the peer's data area.
    fn data_bytes(&self) -> usize;
    /// Copies `src` to `off` of the peer's data area; `off + src.len() <= data_bytes()`
    /// (callers check the whole layout against `data_bytes` first).
    fn write(&self, off: usize, src: &[u8]);
    /// Writes this rank's (`from`) descriptor of data set `set`.
    fn set_desc(&self, phase: Phase, set: usize, from: usize, d: EpDesc);
    /// Publishes that `from` finished writing call `seq` (after its data and descriptor).
    fn post(&self, phase: Phase, from: usize, seq: u64);
    /// Tells the peer that `from` finished reading the peer's call `seq`.
    fn ack(&self, phase: Phase, from: usize, seq: u64);
    /// Whether the peer's process is alive.
    fn alive(&self) -> bool;
}

/// A peer on this host: its buffer mapped here (or this rank's own buffer).
pub struct LocalPeer {
    seg: Arc<EpSegment>,
    is_self: bool,
}

impl LocalPeer {
    /// A writer into `seg`, a peer's buffer mapped here.
    pub fn new(seg: EpSegment) -> Self {
        LocalPeer {
            seg: Arc::new(seg),
            is_self: false,
        }
    }
}

impl EpPeer for LocalPeer {
    fn data_bytes(&self) -> usize {
        self.seg.data_bytes()
    }

    fn write(&self, off: usize, src: &[u8]) {
        assert!(
            off.checked_add(src.len())
                .is_some_and(|end| end <= self.seg.data_bytes()),
            "EP write of {} bytes at {off} outside a data area of {}",
            src.len(),
            self.seg.data_bytes()
        );
        // SAFETY: the range is inside the peer's data area (asserted above); the protocol
        // (module docs) guarantees nobody reads it until the following `post`, and `src` is
        // this process's memory, which cannot overlap a shared mapping's pages.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), self.seg.data().add(off), src.len()) }
    }

    fn set_desc(&self, phase: Phase, set: usize, from: usize, d: EpDesc) {
        self.seg.set_desc(phase, set, from, d)
    }

    fn post(&self, phase: Phase, from: usize, seq: u64) {
        self.seg.set_posted(phase, from, seq)
    }

    fn ack(&self, phase: Phase, from: usize, seq: u64) {
        self.seg.set_acked(phase, from, seq)
    }

    fn alive(&self) -> bool {
        self.is_self || self.seg.owner_alive()
    }
}

/// How waiting for a peer ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Waited {
    /// The condition holds.
    Ready,
    /// The peer is marked inactive and had not answered: zero tokens, no new mark.
    Inactive,
    /// The peer did not answer in time, or died: mark it inactive.
    Failed,
}

/// Waits for `cond`, spinning, then yielding, then sleeping; gives up at once when the peer
/// is inactive, when its process is gone, or at `deadline`.
pub(crate) fn wait_peer(
    cond: impl Fn() -> bool,
    active: bool,
    peer: &dyn EpPeer,
    deadline: Option<Instant>,
) -> Waited {
    let mut i = 0u32;
    let mut next_probe = Instant::now();
    loop {
        if cond() {
            return Waited::Ready;
        }
        if !active {
            return Waited::Inactive;
        }
        i = i.saturating_add(1);
        if i < 256 {
            std::hint::spin_loop();
            continue;
        }
        if i < 2048 {
            std::thread::yield_now();
        } else {
            std::thread::sleep(Duration::from_micros(if i < 4096 { 20 } else { 100 }));
        }
        let now = Instant::now();
        if deadline.is_some_and(|d| now >= d) {
            return if cond() {
                Waited::Ready
            } else {
                Waited::Failed
            };
        }
        if now >= next_probe {
            next_probe = now + Duration::from_millis(1);
            if !peer.alive() {
                return if cond() {
                    Waited::Ready
                } else {
                    Waited::Failed
                };
            }
        }
    }
}

/// A call's deadline from `timeout_us` (-1 = none).
pub(crate) fn deadline(timeout_us: i64) -> Result<Option<Instant>, String> {
    match timeout_us {
        -1 => Ok(None),
        t if t >= 0 => Ok(Some(Instant::now() + Duration::from_micros(t as u64))),
        t => Err(format!(
            "timeout_us must be -1 (wait forever) or >= 0, got {t}"
        )),
    }
}

/// `len` elements at a caller-supplied address; empty for `len == 0` (an empty tensor's
/// address may be null, which `from_raw_parts` does not allow).
///
/// # Safety
/// For `len > 0`, `addr` points to `len` initialised, aligned `T`s valid for `'a`.
pub(crate) unsafe fn slice<'a, T>(addr: usize, len: usize) -> &'a [T] {
    if len == 0 {
        return &[];
    }
    // SAFETY: the caller's contract.
    unsafe { std::slice::from_raw_parts(addr as *const T, len) }
}

/// As [`slice`], writable.
///
/// # Safety
/// As [`slice`], and nobody else accesses the range during `'a`.
pub(crate) unsafe fn slice_mut<'a, T>(addr: usize, len: usize) -> &'a mut [T] {
    if len == 0 {
        return &mut [];
    }
    // SAFETY: the caller's contract.
    unsafe { std::slice::from_raw_parts_mut(addr as *mut T, len) }
}

fn bit(mask: u64, r: usize) -> bool {
    mask >> r & 1 == 1
}

/// One rank's EP runtime: its own buffer and a writer per rank (itself included).
pub struct EpRuntime {
    rank: usize,
    ranks: usize,
    own: Arc<EpSegment>,
    peers: Vec<Box<dyn EpPeer>>,
    dispatch_seq: AtomicU64,
    combine_seq: AtomicU64,
    /// Calls run one at a time (a hook may run on another thread than its dispatch).
    lock: Mutex<()>,
    /// The TCP links to peers on other hosts (closed when the runtime is dropped).
    _net: Option<net::EpNet>,
}

impl EpRuntime {
    /// A runtime over this rank's buffer `own` and every peer's (`peers[rank]` is `None`).
    pub fn new(own: EpSegment, rank: usize, peers: Vec<Option<EpSegment>>) -> Self {
        let peers = peers
            .into_iter()
            .map(|p| p.map(|seg| Box::new(LocalPeer::new(seg)) as Box<dyn EpPeer>))
            .collect();
        Self::with_peers(Arc::new(own), rank, peers, None)
    }

    /// A runtime over this rank's buffer `own` and a writer per peer (`peers[rank]` and any
    /// other `None` write into `own`), keeping `net` (the TCP links of remote peers) alive.
    pub fn with_peers(
        own: Arc<EpSegment>,
        rank: usize,
        peers: Vec<Option<Box<dyn EpPeer>>>,
        net: Option<net::EpNet>,
    ) -> Self {
        let ranks = peers.len();
        let peers = peers
            .into_iter()
            .enumerate()
            .map(|(r, p)| -> Box<dyn EpPeer> {
                match p {
                    Some(p) if r != rank => p,
                    _ => Box::new(LocalPeer {
                        seg: own.clone(),
                        is_self: true,
                    }),
                }
            })
            .collect();
        EpRuntime {
            rank,
            ranks,
            own,
            peers,
            dispatch_seq: AtomicU64::new(0),
            combine_seq: AtomicU64::new(0),
            lock: Mutex::new(()),
            _net: net,
        }
    }

    fn serial(&self) -> MutexGuard<'_, ()> {
        self.lock.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Group size.
    pub fn ranks(&self) -> usize {
        self.ranks
    }

    /// Bytes of this rank's data area.
    pub fn data_bytes(&self) -> usize {
        self.own.data_bytes()
    }

    /// Checks `shape` and that it fits in this rank's buffer and every peer's.
    fn check_shape(&self, shape: &Shape) -> Result<(), String> {
        shape.check()?;
        if shape.ranks != self.ranks {
            return Err(format!(
                "shape for {} ranks, the group has {}",
                shape.ranks, self.ranks
            ));
        }
        let need = shape.need_bytes();
        if let Some((r, have)) = self
            .peers
            .iter()
            .map(|p| p.data_bytes())
            .enumerate()
            .find(|(_, b)| *b < need)
        {
            return Err(format!(
                "the EP buffer of rank {r} has {have} bytes, this call (T={}, hidden={}, \
                 experts={}) needs {need}; size it with Buffer.get_ep_buffer_size_hint",
                shape.tokens_max, shape.hidden, shape.experts
            ));
        }
        Ok(())
    }

    /// Waits until peer `r` has acked call `seq - 2` of `phase` (so set `seq % 2` is free).
    /// Returns whether to write to it, clearing `r` in `mask` if it failed.
    fn wait_free(
        &self,
        phase: Phase,
        r: usize,
        seq: u64,
        mask: &mut u64,
        deadline: Option<Instant>,
    ) -> bool {
        if seq <= 2 {
            return true;
        }
        let w = wait_peer(
            || self.own.acked(phase, r) >= seq - 2,
            bit(*mask, r),
            self.peers[r].as_ref(),
            deadline,
        );
        if w == Waited::Failed {
            *mask &= !(1u64 << r);
        }
        w == Waited::Ready
    }

    /// Waits until source `s` has posted call `seq` of `phase` and checks its descriptor.
    /// `Ok(true)`: its data is there; `Ok(false)`: zero tokens (mask updated on failure).
    fn wait_posted(
        &self,
        phase: Phase,
        s: usize,
        seq: u64,
        want: EpDesc,
        mask: &mut u64,
        deadline: Option<Instant>,
    ) -> Result<bool, String> {
        let w = wait_peer(
            || self.own.posted(phase, s) >= seq,
            bit(*mask, s),
            self.peers[s].as_ref(),
            deadline,
        );
        match w {
            Waited::Ready => {
                let got = self.own.desc(phase, (seq & 1) as usize, s);
                if got != want {
                    return Err(format!(
                        "rank {s}'s {phase:?} call differs from this rank's: it sent \
                         {got:?}, this rank expects {want:?}"
                    ));
                }
                Ok(true)
            }
            Waited::Inactive => Ok(false),
            Waited::Failed => {
                *mask &= !(1u64 << s);
                Ok(false)
            }
        }
    }

    /// Tells every source this rank finished reading call `seq` of `phase`.
    fn ack_all(&self, phase: Phase, seq: u64) {
        for p in &self.peers {
            p.ack(phase, self.rank, seq);
        }
    }

    fn next_seq(counter: &AtomicU64) -> u64 {
        counter.fetch_add(1, Ordering::AcqRel) + 1
    }

    fn check_seq(counter: &AtomicU64, seq: u64, what: &str) -> Result<(), String> {
        let last = counter.load(Ordering::Acquire);
        if seq == 0 || seq > last || seq + 2 <= last {
            return Err(format!(
                "{what} receive for call {seq}: the last call sent was {last}, and only the \
                 last two can be received (double buffering)"
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::dispatch::DispatchOut;
    use super::*;
    use crate::reduce::{bf16_to_f32, f32_to_bf16};

    /// A group of `n` runtimes in this process, over fresh /dev/shm files.
    fn group(n: usize, shape: &Shape, tag: &str) -> Vec<EpRuntime> {
        let bytes = shape.need_bytes();
        let paths: Vec<String> = (0..n)
            .map(|r| format!("/dev/shm/mc-ep-test-{}-{tag}-{r}", std::process::id()))
            .collect();
        let mut own: Vec<Option<EpSegment>> = paths
            .iter()
            .enumerate()
            .map(|(r, p)| Some(EpSegment::create(p, n, r, bytes).unwrap()))
            .collect();
        let rts = (0..n)
            .map(|r| {
                let peers = (0..n)
                    .map(|p| (p != r).then(|| EpSegment::open(&paths[p], n, p).unwrap()))
                    .collect();
                EpRuntime::new(own[r].take().unwrap(), r, peers)
            })
            .collect();
        for p in &paths {
            let _ = std::fs::remove_file(p);
        }
        rts
    }

    const SHAPE: Shape = Shape {
        tokens_max: 4,
        hidden: 128,
        experts: 4,
        ranks: 2,
    };

    /// Rank r's tokens: token t is the constant r*10 + t; routed to experts t%4 and (t+1)%4.
    fn tokens(r: usize) -> (Vec<u16>, Vec<i64>) {
        let h = SHAPE.hidden;
        let x = (0..SHAPE.tokens_max * h)
            .map(|i| f32_to_bf16((r * 10 + i / h) as f32))
            .collect();
        let topk = (0..SHAPE.tokens_max as i64)
            .flat_map(|t| [t % 4, (t + 1) % 4])
            .collect();
        (x, topk)
    }

    #[test]
    fn dispatch_and_combine_between_two_ranks() {
        roundtrips(&group(2, &SHAPE, "roundtrip"));
    }

    /// Two runtimes in this process that see each other as on other hosts (TCP links).
    fn tcp_group(tag: &str) -> Vec<EpRuntime> {
        let bytes = SHAPE.need_bytes();
        let own: Vec<Arc<EpSegment>> = (0..2)
            .map(|r| {
                let p = format!("/dev/shm/mc-ep-test-{}-{tag}-{r}", std::process::id());
                let s = EpSegment::create(&p, 2, r, bytes).unwrap();
                std::fs::remove_file(&p).unwrap();
                Arc::new(s)
            })
            .collect();
        let ls: Vec<std::net::TcpListener> = (0..2)
            .map(|_| std::net::TcpListener::bind("127.0.0.1:0").unwrap())
            .collect();
        let eps: Vec<String> = ls
            .iter()
            .map(|l| l.local_addr().unwrap().to_string())
            .collect();
        let nets: Vec<_> = ls
            .into_iter()
            .enumerate()
            .map(|(r, l)| {
                let remote = [net::Remote {
                    rank: 1 - r,
                    endpoint: eps[1 - r].clone(),
                    data_bytes: bytes,
                }];
                let o = own[r].clone();
                std::thread::spawn(move || {
                    net::EpNet::establish(l, o, r, 2, &remote, &crate::net::LinkAuth::open())
                        .unwrap()
                })
            })
            .collect();
        nets.into_iter()
            .enumerate()
            .map(|(r, t)| {
                let (n, mut p) = t.join().unwrap();
                let (q, peer) = p.remove(0);
                let mut peers: Vec<Option<Box<dyn EpPeer>>> = vec![None, None];
                peers[q] = Some(Box::new(peer));
                EpRuntime::with_peers(own[r].clone(), r, peers, Some(n))
            })
            .collect()
    }

    #[test]
    fn dispatch_and_combine_over_tcp() {
        roundtrips(&tcp_group("tcp"));
    }

    /// Three rounds of dispatch and combine on every runtime of `rts` (two ranks).
    fn roundtrips(rts: &[EpRuntime]) {
        std::thread::scope(|sc| {
            for rt in rts {
                sc.spawn(move || {
                    let r = rt.rank();
                    let (t, h, lo) = (SHAPE.tokens_max, SHAPE.hidden, SHAPE.local());
                    let n = 2 * t;
                    let (x, topk) = tokens(r);
                    for round in 0..3 {
                        let mut recv = vec![0u16; lo * n * h];
                        let mut count = vec![0i32; lo];
                        let mut src = vec![0i32; lo * n];
                        let mut layout = vec![0i64; lo * 2];
                        let out = DispatchOut {
                            recv_x: recv.as_mut_ptr() as usize,
                            scales: 0,
                            count: count.as_mut_ptr() as usize,
                            src_info: src.as_mut_ptr() as usize,
                            layout: layout.as_mut_ptr() as usize,
                        };
                        // SAFETY: every address is a live Vec of the documented size.
                        let mask = unsafe {
                            let (seq, m) = rt
                                .dispatch_send(
                                    x.as_ptr() as usize,
                                    t,
                                    topk.as_ptr() as usize,
                                    2,
                                    SHAPE,
                                    false,
                                    3,
                                    1_000_000,
                                )
                                .unwrap();
                            rt.dispatch_recv(seq, out, SHAPE, false, m, 1_000_000)
                                .unwrap()
                        };
                        assert_eq!(mask, 3, "round {round}");
                        // expert e gets tokens t with t%4 == e or (t+1)%4 == e: two per source
                        assert_eq!(count, vec![4, 4]);
                        for l in 0..lo {
                            assert_eq!(layout[l * 2], 2, "from rank 0: begin 0, 2 rows");
                            assert_eq!(layout[l * 2 + 1], 2 << 32 | 2, "from rank 1");
                            for i in 0..4 {
                                let (s, tok) = (i / 2, src[l * n + i] as usize);
                                let want = (s * 10 + tok) as f32;
                                assert_eq!(bf16_to_f32(recv[(l * n + i) * h]), want);
                            }
                            assert!(src[l * n + 4..(l + 1) * n].iter().all(|&v| v == -1));
                        }
                        // combine with weights 0.25 and 0.75: the token comes back whole
                        let w: Vec<f32> = (0..t).flat_map(|_| [0.25f32, 0.75]).collect();
                        let mut comb = vec![0u16; t * h];
                        // SAFETY: as above.
                        unsafe {
                            let (seq, m) = rt
                                .combine_send(
                                    recv.as_ptr() as usize,
                                    src.as_ptr() as usize,
                                    layout.as_ptr() as usize,
                                    topk.as_ptr() as usize,
                                    t,
                                    2,
                                    SHAPE,
                                    3,
                                    1_000_000,
                                )
                                .unwrap();
                            rt.combine_recv(
                                seq,
                                topk.as_ptr() as usize,
                                w.as_ptr() as usize,
                                t,
                                2,
                                comb.as_mut_ptr() as usize,
                                SHAPE,
                                m,
                                1_000_000,
                            )
                            .unwrap();
                        }
                        assert_eq!(comb, x, "rank {r} round {round}");
                    }
                });
            }
        });
    }

    #[test]
    fn a_silent_peer_is_marked_after_the_timeout() {
        let rts = group(2, &SHAPE, "silent");
        let rt = &rts[0];
        let (x, topk) = tokens(0);
        let lo = SHAPE.local();
        let n = 2 * SHAPE.tokens_max;
        let mut recv = vec![0u16; lo * n * SHAPE.hidden];
        let mut count = vec![0i32; lo];
        let mut src = vec![0i32; lo * n];
        let mut layout = vec![0i64; lo * 2];
        let out = DispatchOut {
            recv_x: recv.as_mut_ptr() as usize,
            scales: 0,
            count: count.as_mut_ptr() as usize,
            src_info: src.as_mut_ptr() as usize,
            layout: layout.as_mut_ptr() as usize,
        };
        let start = Instant::now();
        // SAFETY: every address is a live Vec of the documented size.
        let mask = unsafe {
            let (seq, m) = rt
                .dispatch_send(
                    x.as_ptr() as usize,
                    4,
                    topk.as_ptr() as usize,
                    2,
                    SHAPE,
                    false,
                    3,
                    50_000,
                )
                .unwrap();
            rt.dispatch_recv(seq, out, SHAPE, false, m, 50_000).unwrap()
        };
        assert!(start.elapsed() >= Duration::from_millis(50));
        assert_eq!(mask, 1, "rank 1 marked inactive");
        assert_eq!(count, vec![2, 2], "only rank 0's own tokens");
        assert!(layout.iter().skip(1).step_by(2).all(|&v| v == 0));
        // a mismatched receive call is refused, not read
        // SAFETY: as above.
        let e = unsafe { rt.dispatch_recv(7, out, SHAPE, false, 1, 0) }.unwrap_err();
        assert!(e.contains("call 7"), "{e}");
    }
}
