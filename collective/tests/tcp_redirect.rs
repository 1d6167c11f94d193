//! Ranks that each see the others on another host (TCP links, replicas), hammered with
//! all_to_all and the other ops that receive a remote peer's bytes straight into the caller's
//! tensor (`collective::redirect`): many iterations, sizes that are not multiples of a piece or
//! a slot (one phase, several chunks, a short last chunk), the output laid out as one flat
//! tensor (all_to_all_single) or as separate tensors in a shuffled order, random delays on every
//! rank so that a peer's phase arrives before, during or after the op registers it, and every
//! output byte checked. An output byte the op neither received nor copied still holds the
//! fill byte and fails the test.

use std::net::TcpListener;
use std::time::{Duration, Instant};

use collective::net::{LinkAuth, Net};
use collective::{CollOp, Comm, DType, ReduceOp, Segment};

/// xorshift64*: deterministic, so a failing seed replays.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// `n` communicators in this process, each linked to every other over TCP on loopback as if
/// on another host.
fn group(n: usize) -> Vec<Comm> {
    let listeners: Vec<TcpListener> = (0..n)
        .map(|_| TcpListener::bind("127.0.0.1:0").expect("bind"))
        .collect();
    let addrs: Vec<String> = listeners
        .iter()
        .map(|l| l.local_addr().expect("addr").to_string())
        .collect();
    // replicas[me][r]: (the collective's mapping, the receive thread's) of rank r's segment.
    let mut views: Vec<Vec<Option<Segment>>> = Vec::new();
    let mut rxs: Vec<Vec<(usize, Segment)>> = Vec::new();
    for me in 0..n {
        let (mut v, mut rx) = (Vec::new(), Vec::new());
        for r in 0..n {
            if r == me {
                v.push(None);
                continue;
            }
            let (a, b) = Segment::replica(n, r).expect("replica");
            v.push(Some(a));
            rx.push((r, b));
        }
        views.push(v);
        rxs.push(rx);
    }
    let nets: Vec<Net> = std::thread::scope(|sc| {
        let ts: Vec<_> = listeners
            .into_iter()
            .zip(rxs)
            .enumerate()
            .map(|(me, (l, rx))| {
                let remotes: Vec<(usize, String)> = (0..n)
                    .filter(|&r| r != me)
                    .map(|r| (r, addrs[r].clone()))
                    .collect();
                sc.spawn(move || {
                    Net::establish(l, me, n, &remotes, rx, &LinkAuth::open()).expect("net")
                })
            })
            .collect();
        ts.into_iter()
            .map(|t| t.join().expect("establish"))
            .collect()
    });
    nets.into_iter()
        .zip(views)
        .enumerate()
        .map(|(me, (net, peers))| {
            let path = format!(
                "/dev/shm/mc-pg-redirect-test-{}-{me}-{:?}",
                std::process::id(),
                Instant::now()
            );
            let own = Segment::create(&path, n, me).expect("segment");
            std::fs::remove_file(&path).expect("unlink");
            Comm::start_with_net(own, me, peers, Some(net), true).expect("comm")
        })
        .collect()
}

/// Byte `k` of what rank `from` sends rank `to` in iteration `it`.
fn byte(from: usize, to: usize, it: usize, k: usize) -> u8 {
    ((from * 31 + to * 7 + it * 13 + k) % 251) as u8
}

/// Bytes `0..len` of what rank `from` sends rank `to` in iteration `it`: the same as `byte`,
/// cut from one repeating pattern, so that making and checking a piece are a memcpy and a
/// memcmp even in a debug build (a byte at a time, the checks took most of the test's time).
fn piece(from: usize, to: usize, it: usize, len: usize) -> &'static [u8] {
    static PATTERN: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();
    let pattern = PATTERN.get_or_init(|| {
        let longest = SIZES[SIZES.len() - 1] + 251;
        (0..longest).map(|k| (k % 251) as u8).collect()
    });
    let start = (from * 31 + to * 7 + it * 13) % 251;
    &pattern[start..start + len]
}

const FILL: u8 = 0xEE;

/// Sizes around the layout's edges: tiny, one inline push, above a piece, several chunks with
/// a short last one (the piece is 2 MiB at 2 ranks, 1 MiB at 4; a slot is 4 MiB).
const SIZES: [usize; 9] = [
    1, 20, 4_100, 65_540, 300_004, 1_048_580, 2_097_164, 2_500_012, 4_800_004,
];

/// What one iteration runs, the same on every rank (drawn from the shared seed).
#[derive(Clone, Copy, Debug)]
enum Kind {
    /// all_to_all into one flat output (all_to_all_single).
    Single,
    /// all_to_all into separate outputs, listed in a shuffled memory order.
    List,
    AllGather,
    Broadcast(usize),
    AllReduce,
}

fn kind(rng: &mut Rng, n: usize) -> Kind {
    match rng.below(8) {
        0..=2 => Kind::Single,
        3 | 4 => Kind::List,
        5 => Kind::AllGather,
        6 => Kind::Broadcast(rng.below(n as u64) as usize),
        _ => Kind::AllReduce,
    }
}

/// Runs `kind` on `bytes` bytes per piece at rank `me` of `n`, checks every output byte, and
/// returns a description of the first wrong one.
fn run_one(
    c: &Comm,
    me: usize,
    n: usize,
    it: usize,
    kind: Kind,
    bytes: usize,
) -> Result<(), String> {
    let submit = |op: CollOp| {
        // SAFETY: every buffer the op names lives until the wait below returns.
        let o = unsafe { c.submit(op) }.wait(Some(Duration::from_secs(60)));
        let o = o.ok_or("op timed out")?;
        if o.error.is_some() || o.failed != 0 {
            return Err(format!("op failed: {:?} failed {:#b}", o.error, o.failed));
        }
        Ok::<(), String>(())
    };
    let check = |what: &str, got: &[u8], from: usize, to: usize| {
        if got == piece(from, to, it, got.len()) {
            return Ok(());
        }
        for (k, &g) in got.iter().enumerate() {
            if g != byte(from, to, it, k) {
                let fill = got[k..].iter().take_while(|&&x| x == FILL).count();
                return Err(format!(
                    "iteration {it} {kind:?} {bytes} B: rank {me}'s {what} from rank {from}, byte {k}: \
                     {g:#x} want {:#x} ({fill} fill bytes from there)",
                    byte(from, to, it, k)
                ));
            }
        }
        Ok(())
    };
    match kind {
        Kind::Single | Kind::List => {
            let ins: Vec<Vec<u8>> = (0..n).map(|j| piece(me, j, it, bytes).to_vec()).collect();
            let mut flat = vec![FILL; n * bytes];
            let mut sep: Vec<Vec<u8>> = (0..n).map(|_| vec![FILL; bytes]).collect();
            let outs: Vec<usize> = match kind {
                Kind::Single => (0..n)
                    .map(|r| flat.as_mut_ptr() as usize + r * bytes)
                    .collect(),
                _ => {
                    // Rank r's piece goes to sep[(r + it) % n]: not in rank order in memory.
                    (0..n)
                        .map(|r| sep[(r + it) % n].as_mut_ptr() as usize)
                        .collect()
                }
            };
            submit(CollOp::AllToAll {
                ins: ins.iter().map(|v| v.as_ptr() as usize).collect(),
                outs,
                bytes,
                dtype: DType::Uint8,
            })?;
            for r in 0..n {
                let got = match kind {
                    Kind::Single => &flat[r * bytes..(r + 1) * bytes],
                    _ => &sep[(r + it) % n][..],
                };
                check("all_to_all piece", got, r, me)?;
            }
        }
        Kind::AllGather => {
            let input: Vec<u8> = piece(me, 0, it, bytes).to_vec();
            let mut flat = vec![FILL; n * bytes];
            submit(CollOp::AllGather {
                input: input.as_ptr() as usize,
                bytes,
                dtype: DType::Uint8,
                outs: (0..n)
                    .map(|r| flat.as_mut_ptr() as usize + r * bytes)
                    .collect(),
            })?;
            for r in 0..n {
                check("all_gather part", &flat[r * bytes..(r + 1) * bytes], r, 0)?;
            }
        }
        Kind::Broadcast(root) => {
            let mut buf: Vec<u8> = match me == root {
                true => piece(root, 0, it, bytes).to_vec(),
                false => vec![FILL; bytes],
            };
            submit(CollOp::Broadcast {
                buf: buf.as_mut_ptr() as usize,
                bytes,
                dtype: DType::Uint8,
                root,
            })?;
            check("broadcast", &buf, root, 0)?;
        }
        Kind::AllReduce => {
            // u8 max: every rank holds byte(r, ..) at odd positions of its own rank only,
            // 0 elsewhere, so the max is byte(k) from the rank that owns position k.
            let owner = |k: usize| k % n;
            let mut buf: Vec<u8> = (0..bytes)
                .map(|k| if owner(k) == me { byte(0, 0, it, k) } else { 0 })
                .collect();
            submit(CollOp::AllReduce {
                buf: buf.as_mut_ptr() as usize,
                bytes,
                dtype: DType::Uint8,
                op: ReduceOp::Max,
            })?;
            check("all_reduce", &buf, 0, 0)?;
        }
    }
    Ok(())
}

/// `iterations` ops on `n` ranks with random delays; every rank checks its outputs.
fn hammer(n: usize, iterations: usize, seed: u64) {
    let comms = group(n);
    let errors: Vec<String> = std::thread::scope(|sc| {
        let ts: Vec<_> = comms
            .iter()
            .enumerate()
            .map(|(me, c)| {
                sc.spawn(move || {
                    let mut plan = Rng::new(seed);
                    let mut jitter = Rng::new(seed ^ (0x1000 + me as u64));
                    let mut first = None;
                    for it in 0..iterations {
                        let k = kind(&mut plan, n);
                        let bytes = SIZES[plan.below(SIZES.len() as u64) as usize];
                        // A delay on some ranks some of the time: peers' phases then
                        // arrive before this rank registers, or long after.
                        if jitter.below(3) == 0 {
                            std::thread::sleep(Duration::from_micros(jitter.below(400)));
                        }
                        // The first wrong byte is reported; the rank runs on so that its
                        // peers do not wait for it.
                        if let Err(e) = run_one(c, me, n, it, k, bytes) {
                            first.get_or_insert(e);
                        }
                    }
                    first
                })
            })
            .collect();
        ts.into_iter()
            .filter_map(|t| t.join().expect("rank thread"))
            .collect()
    });
    assert!(errors.is_empty(), "seed {seed}: {errors:#?}");
}

#[test]
fn redirected_pieces_arrive_at_two_ranks() {
    for seed in 1..=3 {
        hammer(2, 100, seed);
    }
}

#[test]
fn redirected_pieces_arrive_at_four_ranks() {
    for seed in 1..=2 {
        hammer(4, 60, seed);
    }
}
