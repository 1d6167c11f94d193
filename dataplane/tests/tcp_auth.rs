//! The cluster secret on the data plane, against both server backends over loopback: a
//! client with the secret reads and writes; a client with another secret, a client without
//! one, and a raw socket that sends requests straight away can neither read nor write a
//! byte; a peer that stops mid-handshake is dropped after the I/O timeout; and an
//! authenticating client refuses a server that cannot prove the secret.

#[macro_use]
mod common;

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{pattern, Backend};
use dataplane::mem::served::{ServedMemory, ServerConfig};
use dataplane::mem::{HugepagePolicy, Segment, SegmentOptions};
use dataplane::server::blocking::TcpServer;
use dataplane::server::uring::UringServer;
use dataplane::server::Server;
use dataplane::transport::client::{ClientConfig, TcpClient, TransferError};
use dataplane::transport::header::{Opcode, RequestHeader, ResponseHeader, RESPONSE_HEADER_BYTES};
use dataplane::TeError;
use protocol::auth::{self, Token};

const LEN: usize = 1 << 16;
const IO_TIMEOUT: Duration = Duration::from_millis(300);

fn token(s: &str) -> &'static Token {
    Box::leak(Box::new(Token::new(s.as_bytes()).unwrap()))
}

/// Fields drop in order: the server stops before its memory goes.
struct Fixture {
    server: Server,
    _memory: Arc<ServedMemory>,
    segment: Arc<Segment>,
}

impl Fixture {
    fn new(backend: Backend, secret: &'static Token) -> Fixture {
        let options = SegmentOptions {
            hugepages: HugepagePolicy::Never,
            prefault: false,
        };
        let segment = Arc::new(Segment::new(LEN, options).expect("segment"));
        for off in 0..LEN {
            // SAFETY: off < LEN, inside the live mapping; nothing else accesses it yet.
            unsafe { segment.as_ptr().add(off).write(pattern(off)) };
        }
        let memory = ServedMemory::new();
        memory.register_segment(segment.clone()).unwrap();
        let config = ServerConfig {
            auth: Some(secret),
            io_timeout: IO_TIMEOUT,
            ..Default::default()
        };
        let addr: SocketAddr = "127.0.0.1:0".parse().unwrap();
        let server = match backend {
            Backend::Blocking => Server::Blocking {
                server: TcpServer::bind(addr, memory.clone(), config).unwrap(),
                reason: "chosen by the test".into(),
            },
            Backend::Uring => {
                Server::Uring(UringServer::bind(addr, memory.clone(), config, None).unwrap())
            }
        };
        Fixture {
            server,
            _memory: memory,
            segment,
        }
    }

    fn base(&self) -> u64 {
        self.segment.addr() as u64
    }

    fn bytes(&self) -> Vec<u8> {
        let mut out = vec![0u8; LEN];
        // SAFETY: inside the live mapping; read while no request is in flight.
        unsafe { std::ptr::copy_nonoverlapping(self.segment.as_ptr(), out.as_mut_ptr(), LEN) };
        out
    }

    fn client(&self, secret: Option<&'static Token>) -> Result<TcpClient, TransferError> {
        let config = ClientConfig {
            auth: secret,
            lanes: 2,
            io_timeout: Duration::from_secs(5),
            ..Default::default()
        };
        TcpClient::connect(self.server.local_addr(), config)
    }

    fn unauthenticated(&self) -> u64 {
        self.server
            .stats()
            .connections_unauthenticated
            .load(Ordering::Relaxed)
    }
}

fn the_right_secret_reads_and_writes(backend: Backend) {
    let s = token("cluster-secret");
    let f = Fixture::new(backend, s);
    let c = f.client(Some(s)).expect("authenticated connect");
    c.write(f.base() + 100, b"hello").unwrap();
    let mut back = [0u8; 5];
    c.read(f.base() + 100, &mut back).unwrap();
    assert_eq!(&back, b"hello");
    let mut big = vec![0u8; LEN];
    c.read(f.base(), &mut big).unwrap();
    assert_eq!(big, f.bytes());
    assert_eq!(f.unauthenticated(), 0);
}

fn a_wrong_or_missing_secret_cannot_read_or_write(backend: Backend) {
    let f = Fixture::new(backend, token("cluster-secret"));
    let before = f.bytes();
    match f.client(Some(token("guess"))) {
        Err(TransferError::Connection { kind, message }) => {
            assert_eq!(kind, ErrorKind::PermissionDenied, "{message}");
            assert!(message.contains("refused our proof"), "{message}");
        }
        other => panic!("a wrong secret connected: {other:?}"),
    }
    // A client without a secret sends its requests at once: refused, nothing touched.
    let c = f
        .client(None)
        .expect("plain connect succeeds at the TCP level");
    let w = c.write(f.base(), &[0xee; 64]);
    assert!(w.is_err(), "an unauthenticated WRITE succeeded");
    let mut dst = [0u8; 64];
    let r = c.read(f.base(), &mut dst);
    assert!(r.is_err(), "an unauthenticated READ succeeded");
    assert_eq!(dst, [0u8; 64], "an unauthenticated READ got bytes");
    assert_eq!(f.bytes(), before, "memory changed");
    assert!(f.unauthenticated() >= 2, "{}", f.unauthenticated());
}

fn raw_requests_before_the_handshake_are_refused(backend: Backend) {
    let f = Fixture::new(backend, token("cluster-secret"));
    let before = f.bytes();
    // READ first: answered ERR_REJECT_HANDSHAKE with no payload, then closed.
    let mut s = TcpStream::connect(f.server.local_addr()).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let read = RequestHeader {
        opcode: Opcode::Read,
        request_id: 77,
        addr: f.base(),
        len: 4096,
    };
    s.write_all(&read.encode()).unwrap();
    let mut answer = Vec::new();
    let _ = s.read_to_end(&mut answer);
    assert_eq!(answer.len(), RESPONSE_HEADER_BYTES, "{answer:?}");
    let h = ResponseHeader::decode(&answer).unwrap();
    assert_eq!(
        (h.status, h.request_id, h.len),
        (TeError::RejectHandshake.code(), 77, 0)
    );
    // WRITE first with its payload: refused (or reset), memory untouched.
    let mut s = TcpStream::connect(f.server.local_addr()).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let write = RequestHeader {
        opcode: Opcode::Write,
        request_id: 78,
        addr: f.base(),
        len: 4096,
    };
    let _ = s.write_all(&write.encode());
    let _ = s.write_all(&[0xab; 4096]);
    let mut answer = Vec::new();
    let _ = s.read_to_end(&mut answer);
    if !answer.is_empty() {
        let h = ResponseHeader::decode(&answer).unwrap();
        assert_eq!(h.status, TeError::RejectHandshake.code());
    }
    assert_eq!(f.bytes(), before, "memory changed");
}

fn a_forged_proof_is_refused(backend: Backend) {
    let f = Fixture::new(backend, token("cluster-secret"));
    let mut s = TcpStream::connect(f.server.local_addr()).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let hello = auth::Frame::new(auth::Step::Hello, [1; auth::VALUE_BYTES]);
    s.write_all(&hello.encode()).unwrap();
    let mut b = [0u8; auth::FRAME_BYTES];
    s.read_exact(&mut b).unwrap();
    assert_eq!(auth::Frame::decode(&b).unwrap().step, auth::Step::Challenge);
    let forged = auth::Frame::new(auth::Step::Proof, [0; auth::VALUE_BYTES]);
    s.write_all(&forged.encode()).unwrap();
    s.read_exact(&mut b).unwrap();
    assert_eq!(auth::Frame::decode(&b).unwrap().step, auth::Step::Refuse);
    assert_eq!(s.read(&mut b).unwrap_or(0), 0, "not closed after REFUSE");
}

fn a_silent_peer_is_dropped(backend: Backend) {
    let f = Fixture::new(backend, token("cluster-secret"));
    // Connected, said nothing; then half a HELLO.
    let mut quiet = TcpStream::connect(f.server.local_addr()).unwrap();
    let mut half = TcpStream::connect(f.server.local_addr()).unwrap();
    half.write_all(&auth::MAGIC).unwrap();
    let started = Instant::now();
    for s in [&mut quiet, &mut half] {
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut b = [0u8; 64];
        loop {
            match s.read(&mut b) {
                Ok(0) => break,
                Err(e) if e.kind() == ErrorKind::ConnectionReset => break,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                other => panic!("expected the server to close, got {other:?}"),
            }
        }
    }
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
}

/// An authenticating client must not hand data to a server that cannot prove the secret.
#[test]
fn a_client_refuses_an_impostor_server() {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let impostor = std::thread::spawn(move || {
        let (mut s, _) = l.accept().unwrap();
        let mut b = [0u8; auth::FRAME_BYTES];
        s.read_exact(&mut b).unwrap();
        s.write_all(&auth::Frame::new(auth::Step::Challenge, [3; 24]).encode())
            .unwrap();
        s.read_exact(&mut b).unwrap();
        s.write_all(&auth::Frame::new(auth::Step::Accept, [4; 24]).encode())
            .unwrap();
        // Anything after this would be a request handed to the impostor.
        let mut rest = Vec::new();
        let _ = s.read_to_end(&mut rest);
        rest
    });
    let config = ClientConfig {
        auth: Some(token("cluster-secret")),
        lanes: 1,
        ..Default::default()
    };
    match TcpClient::connect(addr, config) {
        Err(TransferError::Connection { kind, message }) => {
            assert_eq!(kind, ErrorKind::PermissionDenied, "{message}");
            assert!(message.contains("could not prove"), "{message}");
        }
        other => panic!("connected to an impostor: {other:?}"),
    }
    assert!(impostor.join().unwrap().is_empty());
}

both_backends!(
    the_right_secret_reads_and_writes,
    a_wrong_or_missing_secret_cannot_read_or_write,
    raw_requests_before_the_handshake_are_refused,
    a_forged_proof_is_refused,
    a_silent_peer_is_dropped,
);
