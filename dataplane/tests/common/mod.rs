//! Shared fixtures of the loopback transport tests: a served segment with a known pattern.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use dataplane::mem::{HugepagePolicy, Segment, SegmentOptions};
use dataplane::transport::client::{ClientConfig, TcpClient};
use dataplane::transport::server::{ServedMemory, ServerConfig, TcpServer};

/// Fields drop in declaration order: the server stops before the memory it serves goes.
pub struct Fixture {
    pub server: TcpServer,
    pub memory: Arc<ServedMemory>,
    pub segment: Arc<Segment>,
}

/// The byte a fresh fixture holds at `offset`.
pub fn pattern(offset: usize) -> u8 {
    (offset.wrapping_mul(31) ^ (offset >> 8)) as u8
}

impl Fixture {
    /// A segment of `len` bytes filled with `pattern`, NOT registered, and a server on it.
    pub fn unregistered(len: usize) -> Fixture {
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
        let config = ServerConfig {
            io_timeout: Duration::from_secs(5),
            ..Default::default()
        };
        let server =
            TcpServer::bind("127.0.0.1:0".parse().unwrap(), memory.clone(), config).expect("bind");
        Fixture {
            server,
            memory,
            segment,
        }
    }

    /// A segment of `len` bytes, fully registered, filled with `pattern`.
    pub fn registered(len: usize) -> Fixture {
        let f = Fixture::unregistered(len);
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
