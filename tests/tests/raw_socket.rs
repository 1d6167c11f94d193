//! Raw-socket abuse of the real `mooncake_master` RPC port and a real storage node's data port:
//! garbage, truncated frames, lengths near 2^32 and 2^64, unknown opcodes, random bodies, and
//! 10,000 idle connections. Each server must refuse the bad stream (close it, or answer an
//! error), keep its memory bounded, and keep answering a well-behaved client, which is checked
//! with a real request after every case.
//!
//! Everything is time-bound: every socket has a 5 s timeout and the whole file runs in well
//! under a minute.

use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use client::dataplane::transport::client::{ClientConfig, TcpClient};
use client::dataplane::transport::header::{
    Opcode, RequestHeader, ResponseHeader, REQUEST_HEADER_BYTES, REQUEST_MAGIC,
    RESPONSE_HEADER_BYTES,
};
use client::MasterClient;
use mooncake_tests::{Master, Node, NodeSegment};
use protocol::frame::{self, Kind};
use protocol::message::{Ping, Request, Rpc, ServiceReady, OPCODES};
use protocol::Uuid;

/// How long a server may take to answer or close a bad stream.
const VERDICT_TIMEOUT: Duration = Duration::from_secs(5);
/// Idle connections held against each server.
const IDLE_CONNECTIONS: usize = 10_000;
/// The bound asserted on a server's resident memory while it holds the idle connections.
const RSS_BOUND_BYTES: u64 = 512 << 20;

/// A small deterministic generator for "random" bytes (the tests crate has no `rand`).
struct XorShift(u64);

impl XorShift {
    fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n)
            .map(|_| {
                self.0 ^= self.0 << 13;
                self.0 ^= self.0 >> 7;
                self.0 ^= self.0 << 17;
                self.0 as u8
            })
            .collect()
    }
}

/// What a server did with a stream after the bad bytes were sent.
#[derive(Debug)]
enum Verdict {
    /// EOF or reset, with whatever it answered before.
    Closed(Vec<u8>),
    /// Still open after [`VERDICT_TIMEOUT`], with what it answered.
    Open(Vec<u8>),
}

fn connect(addr: SocketAddr) -> TcpStream {
    let s = TcpStream::connect_timeout(&addr, VERDICT_TIMEOUT).expect("connect");
    s.set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    s.set_write_timeout(Some(VERDICT_TIMEOUT)).unwrap();
    s
}

/// Sends `bytes` (a write error means the server already closed), optionally half-closes, and
/// reads until the server closes or `VERDICT_TIMEOUT` passes.
fn send_and_watch(addr: SocketAddr, bytes: &[u8], half_close: bool) -> Verdict {
    let mut s = connect(addr);
    let _ = s.write_all(bytes);
    if half_close {
        let _ = s.shutdown(Shutdown::Write);
    }
    let deadline = Instant::now() + VERDICT_TIMEOUT;
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while Instant::now() < deadline {
        match s.read(&mut buf) {
            Ok(0) => return Verdict::Closed(got),
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e)
                if matches!(
                    e.kind(),
                    ErrorKind::WouldBlock | ErrorKind::TimedOut | ErrorKind::Interrupted
                ) => {}
            Err(_) => return Verdict::Closed(got),
        }
    }
    Verdict::Open(got)
}

/// Every frame in `answer` is a well-formed response.
fn assert_master_answers_are_frames(case: &str, answer: &[u8]) {
    let mut rest = answer;
    while !rest.is_empty() {
        match frame::split_frame(rest) {
            Ok(Some((f, used))) => {
                assert_eq!(f.header.kind, Kind::Response, "{case}: {f:?}");
                rest = &rest[used..];
            }
            other => panic!("{case}: the master answered a malformed frame: {other:?}"),
        }
    }
}

fn assert_master_serves(m: &mut Master, case: &str) {
    assert!(
        m.child.try_wait().unwrap().is_none(),
        "{case}: the master exited"
    );
    let c = MasterClient::new(&m.rpc_addr()).expect("a well-behaved client connects");
    let ready = c.call(&ServiceReady {}).expect("the master answers");
    assert!(ready.is_ok(), "{case}: ServiceReady -> {ready:?}");
    let ping = c
        .call(&Ping {
            client_id: Uuid::from_parts(7, 7),
        })
        .expect("the master answers a ping");
    // An unknown client may be told so; what matters is a well-formed answer.
    let _ = ping;
}

fn frame_bytes(opcode: u16, body: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    frame::write_header(&mut out, Kind::Request, opcode, 42, body.len());
    out.extend_from_slice(body);
    out
}

#[test]
fn master_refuses_bad_frames_and_keeps_serving() {
    let started = Instant::now();
    let mut m = Master::start(&[]);
    let addr: SocketAddr = m.rpc_addr().parse().unwrap();
    let mut rng = XorShift(0x9e37_79b9_7f4a_7c15);

    let mut huge = Vec::new();
    huge.extend_from_slice(&u32::MAX.to_le_bytes());
    huge.extend_from_slice(&[frame::VERSION, 0, 1, 0]);
    huge.extend_from_slice(&7u64.to_le_bytes());
    let valid_ping = {
        let mut out = Vec::new();
        let ping = Request::Ping(Ping {
            client_id: Uuid::from_parts(1, 2),
        });
        frame::encode_with(&mut out, Kind::Request, ping.opcode(), 1, |b| {
            ping.encode_body(b)
        })
        .unwrap();
        out
    };
    // (case, bytes, half-close after sending, must the server close on its own?)
    let mut cases: Vec<(String, Vec<u8>, bool, bool)> = vec![
        ("garbage".into(), rng.bytes(4096), true, false),
        ("length u32::MAX".into(), huge, false, true),
        (
            "bad version".into(),
            {
                let mut f = frame_bytes(6, &[]);
                f[4] = 99;
                f
            },
            false,
            true,
        ),
        (
            "bad kind".into(),
            {
                let mut f = frame_bytes(6, &[]);
                f[5] = 7;
                f
            },
            false,
            true,
        ),
        (
            "truncated header".into(),
            frame_bytes(6, &[])[..7].to_vec(),
            true,
            false,
        ),
        (
            "truncated body".into(),
            frame_bytes(1, &[0u8; 100])[..60].to_vec(),
            true,
            false,
        ),
        (
            "unknown opcode".into(),
            frame_bytes(0xfff0, &rng.bytes(32)),
            true,
            false,
        ),
        (
            "response kind from a client".into(),
            {
                let mut f = frame_bytes(6, &[]);
                f[5] = Kind::Response as u8;
                f
            },
            true,
            false,
        ),
        (
            "valid ping then garbage".into(),
            [valid_ping.clone(), rng.bytes(64)].concat(),
            true,
            false,
        ),
    ];
    for &(op, name) in OPCODES {
        for len in [0usize, 1, 17, 300] {
            cases.push((
                format!("{name} with a random {len}-byte body"),
                frame_bytes(op, &rng.bytes(len)),
                true,
                false,
            ));
        }
    }
    for (case, bytes, half_close, closes_alone) in &cases {
        let verdict = send_and_watch(addr, bytes, *half_close);
        match &verdict {
            Verdict::Closed(answer) => assert_master_answers_are_frames(case, answer),
            Verdict::Open(answer) if !*closes_alone && !*half_close => {
                assert_master_answers_are_frames(case, answer)
            }
            Verdict::Open(_) => {
                panic!("{case}: the master neither answered-and-closed nor closed: {verdict:?}")
            }
        }
        assert_master_serves(&mut m, case);
    }
    println!(
        "master: {} bad streams refused, still serving ({:.1} s)",
        cases.len(),
        started.elapsed().as_secs_f64()
    );
}

/// What the master gives a frame of 1 MiB to arrive whole once it waits for its rest
/// (`controlplane::limits::RPC_FRAME_TIMEOUT_MIN`: the minimum, as 1 MiB at the slowest rate
/// allowed takes 1 s).
const FRAME_TIMEOUT: Duration = Duration::from_secs(5);

/// A frame whose header promises 1 MiB, followed by silence, is closed once its deadline has
/// passed, while other clients are served; a connection silent between frames is not closed.
#[test]
fn master_closes_a_frame_left_half_sent_but_not_an_idle_connection() {
    let mut m = Master::start(&[]);
    let addr: SocketAddr = m.rpc_addr().parse().unwrap();
    let mut idle = connect(addr);
    let mut stalled = connect(addr);
    let mut head = Vec::new();
    frame::write_header(&mut head, Kind::Request, ServiceReady::OP, 9, 1 << 20);
    head.extend_from_slice(&[0; 100]);
    stalled.write_all(&head).unwrap();
    let sent = Instant::now();
    assert_master_serves(&mut m, "with a frame half-sent");
    let give_up = FRAME_TIMEOUT + VERDICT_TIMEOUT;
    let mut buf = [0u8; 64];
    let answer = loop {
        assert!(
            sent.elapsed() < give_up,
            "a half-sent frame still open after {give_up:?}"
        );
        match stalled.read(&mut buf) {
            Ok(n) => break n,
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(_) => break 0,
        }
    };
    assert_eq!(answer, 0, "the master answered a frame it never got whole");
    // The idle connection outlived the half-sent frame's deadline and is answered.
    assert!(sent.elapsed() >= FRAME_TIMEOUT.saturating_sub(Duration::from_millis(500)));
    idle.write_all(&frame_bytes(ServiceReady::OP, &[])).unwrap();
    idle.set_read_timeout(Some(VERDICT_TIMEOUT)).unwrap();
    let mut got = vec![0u8; frame::HEADER_BYTES];
    idle.read_exact(&mut got)
        .expect("the idle connection is answered");
    let header = frame::Header::parse(got[..].try_into().unwrap()).unwrap();
    assert_eq!((header.kind, header.request_id), (Kind::Response, 42));
}

fn data_client(seg: &NodeSegment) -> TcpClient {
    let addr: SocketAddr = seg.te_endpoint.parse().expect("te_endpoint is ip:port");
    let config = ClientConfig {
        lanes: 1,
        io_timeout: VERDICT_TIMEOUT,
        ..Default::default()
    };
    TcpClient::connect(addr, config).expect("connect to the data port")
}

fn assert_node_serves(node: &mut Node, seg: &NodeSegment, case: &str) {
    assert!(
        node.child.try_wait().unwrap().is_none(),
        "{case}: the node exited"
    );
    let c = data_client(seg);
    let data = case.as_bytes();
    c.write(seg.base + 4096, data)
        .unwrap_or_else(|e| panic!("{case}: well-behaved write failed: {e:?}"));
    let mut back = vec![0u8; data.len()];
    c.read(seg.base + 4096, &mut back)
        .unwrap_or_else(|e| panic!("{case}: well-behaved read failed: {e:?}"));
    assert_eq!(back, data, "{case}");
}

fn request(opcode: Opcode, id: u64, addr: u64, len: u64) -> Vec<u8> {
    RequestHeader {
        opcode,
        request_id: id,
        addr,
        len,
    }
    .encode()
    .to_vec()
}

/// A request header with raw fields, for values `RequestHeader` cannot hold.
fn raw_request(opcode: u8, flags: u16, id: u64, addr: u64, len: u64) -> Vec<u8> {
    let mut b = Vec::with_capacity(REQUEST_HEADER_BYTES);
    b.extend_from_slice(&REQUEST_MAGIC.to_le_bytes());
    b.push(1);
    b.push(opcode);
    b.extend_from_slice(&flags.to_le_bytes());
    b.extend_from_slice(&id.to_le_bytes());
    b.extend_from_slice(&addr.to_le_bytes());
    b.extend_from_slice(&len.to_le_bytes());
    b
}

/// Every answer is a response header with a non-zero status and no payload.
fn assert_node_answers_are_errors(case: &str, answer: &[u8]) {
    for chunk in answer.chunks(RESPONSE_HEADER_BYTES) {
        let h = ResponseHeader::decode(chunk)
            .unwrap_or_else(|e| panic!("{case}: malformed answer {answer:?}: {e}"));
        assert_ne!(h.status, 0, "{case}: a bad request succeeded: {h:?}");
        assert_eq!(h.len, 0, "{case}: an error carries no payload: {h:?}");
    }
}

#[test]
fn node_refuses_bad_headers_and_keeps_serving() {
    let started = Instant::now();
    let m = Master::start(&[]);
    let mut node = Node::start(&m, &["--global_segment_size=64 MB"]);
    let seg = node.segments[0].clone();
    let addr: SocketAddr = seg.te_endpoint.parse().unwrap();
    let mut rng = XorShift(0x2545_f491_4f6c_dd1d);
    let end = seg.base + seg.size;

    // (case, bytes, half-close after sending)
    let cases: Vec<(&str, Vec<u8>, bool)> = vec![
        ("garbage", rng.bytes(4096), true),
        (
            "truncated header",
            request(Opcode::Read, 1, seg.base, 8)[..20].to_vec(),
            true,
        ),
        (
            "read len 2^64-1",
            raw_request(0, 0, 2, seg.base, u64::MAX),
            false,
        ),
        (
            "write len 2^64-8",
            raw_request(1, 0, 3, seg.base, u64::MAX - 7),
            false,
        ),
        ("unknown opcode", raw_request(9, 0, 4, seg.base, 8), false),
        ("bad flags", raw_request(0, 0x8000, 5, seg.base, 8), false),
        (
            "bad version",
            {
                let mut b = request(Opcode::Read, 6, seg.base, 8);
                b[4] = 2;
                b
            },
            false,
        ),
        (
            "read of an unregistered address",
            request(Opcode::Read, 7, 0x1000, 8),
            true,
        ),
        (
            "read past the segment end",
            request(Opcode::Read, 8, end - 4, 8),
            true,
        ),
        (
            "read at addr 2^64-4",
            request(Opcode::Read, 9, u64::MAX - 3, 8),
            true,
        ),
        (
            "write into an unregistered address",
            {
                let mut b = request(Opcode::Write, 10, 0x1000, 16);
                b.extend_from_slice(&[0xaa; 16]);
                b
            },
            true,
        ),
        (
            "zero-length read",
            request(Opcode::Read, 11, seg.base, 0),
            true,
        ),
        (
            "truncated write payload",
            {
                let mut b = request(Opcode::Write, 12, seg.base, 1 << 20);
                b.extend_from_slice(&rng.bytes(1000));
                b
            },
            true,
        ),
        (
            "header then random body",
            {
                let mut b = request(Opcode::Write, 13, 0x1000, 512);
                b.extend_from_slice(&rng.bytes(512));
                b
            },
            true,
        ),
    ];
    for (case, bytes, half_close) in &cases {
        let verdict = send_and_watch(addr, bytes, *half_close);
        match &verdict {
            Verdict::Closed(answer) => assert_node_answers_are_errors(case, answer),
            // An error answered on a connection that stays usable is fine too.
            Verdict::Open(answer) if !answer.is_empty() => {
                assert_node_answers_are_errors(case, answer)
            }
            Verdict::Open(_) => panic!("{case}: the node neither answered nor closed"),
        }
        assert_node_serves(&mut node, &seg, case);
    }
    println!(
        "node: {} bad streams refused, still serving ({:.1} s)",
        cases.len(),
        started.elapsed().as_secs_f64()
    );
}

/// Raises the soft `RLIMIT_NOFILE` towards `want` (children started later inherit it) and
/// returns the soft limit in force.
fn raise_nofile(want: u64) -> u64 {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit write/read the one struct passed; no other memory is touched.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) != 0 {
            return 1024;
        }
        if lim.rlim_cur < want {
            let raised = libc::rlimit {
                rlim_cur: want.min(lim.rlim_max),
                rlim_max: lim.rlim_max,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) == 0 {
                lim = raised;
            }
        }
    }
    lim.rlim_cur
}

fn vm_rss_bytes(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
        .map_or(0, |kib| kib * 1024)
}

/// Opens up to `n` idle connections to `addr`, stopping early when the deadline passes or the
/// system refuses more.
fn open_idle(addr: SocketAddr, n: usize, deadline: Instant) -> (Vec<TcpStream>, Option<String>) {
    let mut held = Vec::with_capacity(n);
    while held.len() < n {
        if Instant::now() > deadline {
            return (held, Some("time budget spent".into()));
        }
        match TcpStream::connect_timeout(&addr, Duration::from_secs(2)) {
            Ok(s) => held.push(s),
            Err(e) => return (held, Some(e.to_string())),
        }
    }
    (held, None)
}

/// Serialises the idle-connection tests: each needs most of the descriptor limit.
static IDLE_TESTS: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// How many idle connections this process can hold, after raising `RLIMIT_NOFILE` (children
/// started afterwards inherit the raised limit).
fn idle_target() -> usize {
    let limit = raise_nofile(IDLE_CONNECTIONS as u64 + 1024);
    let target = IDLE_CONNECTIONS.min(limit.saturating_sub(1024) as usize);
    if target < IDLE_CONNECTIONS {
        println!(
            "RLIMIT_NOFILE is {limit} and cannot be raised further: holding {target} idle \
             connections instead of {IDLE_CONNECTIONS}"
        );
    }
    target
}

/// Holds up to `target` idle connections to `addr` while `serves` checks a well-behaved
/// client, and asserts the server's memory stays bounded.
fn hold_idle_connections(name: &str, addr: SocketAddr, pid: u32, target: usize, serves: impl Fn()) {
    let rss_before = vm_rss_bytes(pid);
    let opened_in = Instant::now();
    let (held, stopped) = open_idle(addr, target, Instant::now() + Duration::from_secs(30));
    let opened_in = opened_in.elapsed();
    if let Some(why) = &stopped {
        println!("{name}: stopped at {} idle connections: {why}", held.len());
    }
    // Let the server accept everything it is going to.
    std::thread::sleep(Duration::from_millis(500));
    let answered_in = Instant::now();
    serves();
    let answered_in = answered_in.elapsed();
    let rss = vm_rss_bytes(pid);
    println!(
        "{name}: {} idle connections opened in {:.1} s; VmRSS {:.1} MiB (before {:.1} MiB); a \
         good client answered in {:.1} ms",
        held.len(),
        opened_in.as_secs_f64(),
        rss as f64 / (1 << 20) as f64,
        rss_before as f64 / (1 << 20) as f64,
        answered_in.as_secs_f64() * 1e3
    );
    // The count is bounded by how fast the server accepts within the time budget; far fewer
    // than the target means the server stopped accepting.
    assert!(
        held.len() >= target.min(2000),
        "{name}: only {} connections opened",
        held.len()
    );
    assert!(answered_in < VERDICT_TIMEOUT, "{name}: answered too slowly");
    assert!(
        rss < RSS_BOUND_BYTES,
        "{name}: VmRSS {rss} bytes exceeds {RSS_BOUND_BYTES}"
    );
    drop(held);
    std::thread::sleep(Duration::from_millis(200));
    serves();
}

#[test]
fn master_keeps_serving_with_ten_thousand_idle_connections() {
    let _one_at_a_time = IDLE_TESTS.lock().unwrap_or_else(|e| e.into_inner());
    let started = Instant::now();
    let target = idle_target();
    let m = std::cell::RefCell::new(Master::start(&[]));
    let addr: SocketAddr = m.borrow().rpc_addr().parse().unwrap();
    let pid = m.borrow().child.id();
    hold_idle_connections("master", addr, pid, target, || {
        assert_master_serves(&mut m.borrow_mut(), "with idle connections held")
    });
    println!(
        "master idle connections: {:.1} s",
        started.elapsed().as_secs_f64()
    );
    assert!(started.elapsed() < Duration::from_secs(60));
}

/// An io_uring shard holds up to `SERVER_CONNECTIONS_MAX` (16k) connections, so 10k idle peers
/// do not lock a good client out. The blocking fallback (a thread per connection) stops at
/// 1024, so on a machine without io_uring this test says so and does not run.
#[test]
fn node_keeps_serving_with_ten_thousand_idle_connections() {
    let _one_at_a_time = IDLE_TESTS.lock().unwrap_or_else(|e| e.into_inner());
    let started = Instant::now();
    let target = idle_target();
    let m = Master::start(&[]);
    let node = std::cell::RefCell::new(Node::start(&m, &["--global_segment_size=64 MB"]));
    let seg = node.borrow().segments[0].clone();
    if seg.backend != "io_uring" {
        println!(
            "skipped: the node runs the blocking fallback ({} connections at most)",
            1024
        );
        return;
    }
    let addr: SocketAddr = seg.te_endpoint.parse().unwrap();
    let pid = node.borrow().child.id();
    hold_idle_connections("node", addr, pid, target, || {
        assert_node_serves(&mut node.borrow_mut(), &seg, "with idle connections held")
    });
    println!(
        "node idle connections: {:.1} s",
        started.elapsed().as_secs_f64()
    );
    assert!(started.elapsed() < Duration::from_secs(60));
}
