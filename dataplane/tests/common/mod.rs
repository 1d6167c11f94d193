//! Shared fixtures of the loopback transport tests: a served segment with a known pattern,
//! served by either backend.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use dataplane::mem::served::{ServedMemory, ServerConfig};
use dataplane::mem::{HugepagePolicy, Segment, SegmentOptions};
use dataplane::server::blocking::TcpServer;
use dataplane::server::probe;
use dataplane::server::uring::UringServer;
use dataplane::server::Server;
use dataplane::transport::client::{ClientConfig, TcpClient};

/// Which server a test runs against.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    Blocking,
    Uring,
}

/// Why `backend` cannot run here (`None`: it can).
pub fn unavailable(backend: Backend) -> Option<String> {
    match backend {
        Backend::Blocking => None,
        Backend::Uring => {
            let status = probe::probe();
            (!status.is_available()).then(|| status.to_string())
        }
    }
}

/// Generates, for each `fn name(backend: Backend)`, a module `name` with the tests
/// `blocking` and `uring`; the latter prints why and passes when io_uring is unavailable.
#[allow(unused_macros)]
macro_rules! both_backends {
    ($($name:ident),* $(,)?) => {
        $(
            mod $name {
                #[test]
                fn blocking() {
                    super::$name($crate::common::Backend::Blocking)
                }

                #[test]
                fn uring() {
                    if let Some(why) = $crate::common::unavailable($crate::common::Backend::Uring) {
                        println!("skipped: {why}");
                        return;
                    }
                    super::$name($crate::common::Backend::Uring)
                }
            }
        )*
    };
}

/// Starts a server of `backend` on `addr`.
pub fn start(backend: Backend, addr: SocketAddr, memory: Arc<ServedMemory>) -> Server {
    let config = ServerConfig {
        io_timeout: Duration::from_secs(5),
        ..Default::default()
    };
    match backend {
        Backend::Blocking => Server::Blocking {
            server: TcpServer::bind(addr, memory, config).expect("bind"),
            reason: "chosen by the test".into(),
        },
        Backend::Uring => {
            Server::Uring(UringServer::bind(addr, memory, config, None).expect("uring bind"))
        }
    }
}

/// Fields drop in declaration order: the server stops before the memory it serves goes.
pub struct Fixture {
    pub server: Server,
    pub backend: Backend,
    pub memory: Arc<ServedMemory>,
    pub segment: Arc<Segment>,
}

/// The byte a fresh fixture holds at `offset`.
pub fn pattern(offset: usize) -> u8 {
    (offset.wrapping_mul(31) ^ (offset >> 8)) as u8
}

impl Fixture {
    /// A segment of `len` bytes filled with `pattern`, NOT registered, and a server on it.
    pub fn unregistered(backend: Backend, len: usize) -> Fixture {
        let options = SegmentOptions {
            hugepages: HugepagePolicy::Never,
            prefault: false,
        };
        let segment = Arc::new(Segment::new(len, options).expect("segment"));
        for off in 0..segment.len() {
            // SAFETY: off < len of the live mapping; nothing else accesses it yet.
            unsafe { segment.as_ptr().add(off).write(pattern(off)) };
        }
        let memory = ServedMemory::new();
        let server = start(backend, "127.0.0.1:0".parse().unwrap(), memory.clone());
        assert_eq!(
            server.backend(),
            match backend {
                Backend::Blocking => "blocking",
                Backend::Uring => "io_uring",
            }
        );
        Fixture {
            server,
            backend,
            memory,
            segment,
        }
    }

    /// A segment of `len` bytes, fully registered, filled with `pattern`.
    pub fn registered(backend: Backend, len: usize) -> Fixture {
        let f = Fixture::unregistered(backend, len);
        f.memory
            .register_segment(f.segment.clone())
            .expect("register");
        f
    }

    pub fn addr(&self) -> SocketAddr {
        self.server.local_addr()
    }

    pub fn base(&self) -> u64 {
        self.segment.addr() as u64
    }

    pub fn client(&self, lanes: usize) -> TcpClient {
        let config = ClientConfig {
            lanes,
            io_timeout: Duration::from_secs(5),
            ..Default::default()
        };
        TcpClient::connect(self.addr(), config).expect("connect")
    }

    /// A copy of the segment's bytes `[offset, offset + len)`.
    pub fn snapshot(&self, offset: usize, len: usize) -> Vec<u8> {
        assert!(offset + len <= self.segment.len());
        let mut out = vec![0u8; len];
        // SAFETY: the range is inside the live mapping; tests read it only while no request
        // is in flight.
        unsafe {
            std::ptr::copy_nonoverlapping(self.segment.as_ptr().add(offset), out.as_mut_ptr(), len)
        };
        out
    }

    /// Asserts every byte outside `[offset, offset + len)` still holds the pattern.
    pub fn assert_pattern_outside(&self, offset: usize, len: usize) {
        self.assert_pattern_outside_all(&[(offset, len)]);
    }

    /// Asserts every byte outside all of the `(offset, len)` ranges still holds the pattern.
    pub fn assert_pattern_outside_all(&self, ranges: &[(usize, usize)]) {
        let all = self.snapshot(0, self.segment.len());
        for (i, &b) in all.iter().enumerate() {
            if !ranges.iter().any(|&(o, l)| o <= i && i < o + l) && b != pattern(i) {
                panic!("byte {i} outside {ranges:?} changed: {b} != {}", pattern(i));
            }
        }
    }
}

/// A mapped buffer that transfer engines may register. Rust never holds a reference into it:
/// it is filled and inspected through raw copies between transfers.
pub struct Buf {
    seg: Segment,
    len: usize,
}

impl Buf {
    pub fn new(len: usize, fill: u8) -> Buf {
        let opts = SegmentOptions {
            hugepages: HugepagePolicy::Never,
            prefault: false,
        };
        let seg = Segment::new(len, opts).unwrap();
        // SAFETY: inside the fresh mapping; nothing else uses it yet.
        unsafe { std::ptr::write_bytes(seg.as_ptr(), fill, len) };
        Buf { seg, len }
    }

    pub fn addr(&self) -> u64 {
        self.seg.addr() as u64
    }

    /// A copy of the contents (call only while no transfer touches the buffer).
    pub fn bytes(&self) -> Vec<u8> {
        let mut v = vec![0u8; self.len];
        // SAFETY: inside the live mapping; the tests copy only between transfers.
        unsafe { std::ptr::copy_nonoverlapping(self.seg.as_ptr(), v.as_mut_ptr(), self.len) };
        v
    }

    /// Writes `data` at `at` (call only while no transfer touches the buffer).
    pub fn fill(&self, at: usize, data: &[u8]) {
        assert!(at + data.len() <= self.len);
        // SAFETY: inside the live mapping (checked above); no transfer is running.
        unsafe {
            std::ptr::copy_nonoverlapping(data.as_ptr(), self.seg.as_ptr().add(at), data.len())
        };
    }

    pub fn register(&self, e: &dataplane::engine::TransferEngine) {
        // SAFETY: the mapping lives until the Buf drops, which the tests do after the engines
        // (or after unregistering).
        unsafe { e.register_memory(self.addr(), self.len as u64, "cpu:0") }.unwrap();
    }
}

/// A random generator whose seed is printed, so a failing run can be replayed.
pub fn rng() -> rand::rngs::StdRng {
    use rand::{Rng, SeedableRng};
    let seed = rand::thread_rng().gen();
    println!("seed {seed}");
    rand::rngs::StdRng::seed_from_u64(seed)
}

// Not every test binary that includes this module takes the lock.
#[allow(unused_imports)]
pub use dataplane::test_env::{env_lock, EnvGuard};

/// Polls until `cond` holds, up to 5 s (server threads notice a closed socket asynchronously).
pub fn eventually(what: &str, cond: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for: {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}
