//! The cluster secret end to end, with real processes: a `mooncake_master` and storage nodes
//! (`mooncake_client`, io_uring and blocking data planes) started with `--auth_token_file`.
//!
//! The nodes joining at all shows the secret works between them (node -> master RPC, node ->
//! metadata PUT). Then a stranger (this test process, which has no secret of its own) tries
//! every door: it cannot read or write a node's segment (raw socket, or the real data-plane
//! client with no secret or a wrong one), cannot issue master RPCs, cannot write the
//! metadata; while a client that proves the secret can do all of it. A bad token file stops
//! either program at start-up.

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use client::dataplane::transport::client::{ClientConfig, TcpClient, TransferError};
use client::dataplane::transport::header::{
    Opcode, RequestHeader, ResponseHeader, RESPONSE_HEADER_BYTES,
};
use client::MasterClient;
use mooncake_tests::{bin_path, free_port, http, master_segments, Master, Node, NodeSegment};
use protocol::auth::{self, AuthError, Token};
use protocol::frame::{self, Kind};
use protocol::message::{Rpc, ServiceReady};
use protocol::wire::Wire;
use protocol::ErrorCode;

const SECRET: &str = "integration-test-cluster-secret";
/// `ERR_REJECT_HANDSHAKE` of the transfer engine.
const REJECT_HANDSHAKE: i32 = -104;

/// A token file in a fresh directory (removed with the returned guard).
struct TokenFile(PathBuf);

impl TokenFile {
    fn new(tag: &str, contents: &str) -> TokenFile {
        let dir = std::env::temp_dir().join(format!("mc-auth-{}-{tag}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("token");
        std::fs::write(&path, contents).unwrap();
        TokenFile(path)
    }

    fn flag(&self) -> String {
        format!("--auth_token_file={}", self.0.display())
    }
}

impl Drop for TokenFile {
    fn drop(&mut self) {
        if let Some(dir) = self.0.parent() {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

fn leak(secret: &str) -> &'static Token {
    Box::leak(Box::new(Token::new(secret.as_bytes()).unwrap()))
}

fn data_client(
    seg: &NodeSegment,
    secret: Option<&'static Token>,
) -> Result<TcpClient, TransferError> {
    let addr: SocketAddr = seg.te_endpoint.parse().expect("te_endpoint is ip:port");
    let config = ClientConfig {
        auth: secret,
        lanes: 1,
        io_timeout: Duration::from_secs(5),
        ..Default::default()
    };
    TcpClient::connect(addr, config)
}

/// One HTTP request with an optional `Authorization` header; returns the status.
fn http_status(method: &str, port: u16, path: &str, authorization: Option<&str>) -> u16 {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let auth = authorization
        .map(|a| format!("Authorization: {a}\r\n"))
        .unwrap_or_default();
    let body = br#"{"x":1}"#;
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n{auth}Content-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes()).unwrap();
    s.write_all(body).unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).unwrap();
    String::from_utf8_lossy(&raw)
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .expect("status")
}

/// A ServiceReady request frame.
fn service_ready_frame(id: u64) -> Vec<u8> {
    let mut out = Vec::new();
    frame::encode_with(&mut out, Kind::Request, ServiceReady::OP, id, |b| {
        ServiceReady {}.encode(b)
    })
    .unwrap();
    out
}

/// Reads one response frame; returns its request id and status.
fn read_answer(s: &mut TcpStream) -> (u64, i32) {
    let mut head = [0u8; frame::HEADER_BYTES];
    s.read_exact(&mut head).unwrap();
    let h = frame::Header::parse(&head).unwrap();
    assert_eq!(h.kind, Kind::Response);
    let mut body = vec![0u8; h.body_len];
    s.read_exact(&mut body).unwrap();
    (
        h.request_id,
        i32::from_le_bytes(body[..4].try_into().unwrap()),
    )
}

fn assert_stranger_cannot_touch(seg: &NodeSegment, right: &'static Token) {
    let owner = data_client(seg, Some(right)).expect("the right secret connects");
    let at = seg.base + 8192;
    let original = b"written by a member of the cluster";
    owner.write(at, original).expect("member write");

    // The real client with a wrong secret is refused at connect.
    match data_client(seg, Some(leak("a-guess"))) {
        Err(TransferError::Connection { kind, message }) => {
            assert_eq!(kind, ErrorKind::PermissionDenied, "{message}")
        }
        other => panic!("{}: a wrong secret connected: {other:?}", seg.backend),
    }
    // The real client without a secret: every request refused, no byte read or written.
    let stranger = data_client(seg, None).expect("TCP connect");
    assert!(stranger.write(at, &[0xee; 34]).is_err(), "{}", seg.backend);
    let mut dst = [0u8; 34];
    assert!(stranger.read(at, &mut dst).is_err(), "{}", seg.backend);
    assert_eq!(dst, [0u8; 34], "{}: the stranger read bytes", seg.backend);

    // Raw socket, READ first: ERR_REJECT_HANDSHAKE, no payload, closed.
    let mut s = TcpStream::connect(&seg.te_endpoint).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let read = RequestHeader {
        opcode: Opcode::Read,
        request_id: 5,
        addr: at,
        len: original.len() as u64,
    };
    s.write_all(&read.encode()).unwrap();
    let mut answer = Vec::new();
    let _ = s.read_to_end(&mut answer);
    assert_eq!(
        answer.len(),
        RESPONSE_HEADER_BYTES,
        "{}: {answer:?}",
        seg.backend
    );
    let h = ResponseHeader::decode(&answer).unwrap();
    assert_eq!((h.status, h.request_id, h.len), (REJECT_HANDSHAKE, 5, 0));

    // Raw socket, WRITE first with its payload.
    let mut s = TcpStream::connect(&seg.te_endpoint).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let write = RequestHeader {
        opcode: Opcode::Write,
        request_id: 6,
        addr: at,
        len: original.len() as u64,
    };
    let _ = s.write_all(&write.encode());
    let _ = s.write_all(&[0xab; 34]);
    let mut answer = Vec::new();
    let _ = s.read_to_end(&mut answer);

    let mut back = vec![0u8; original.len()];
    owner.read(at, &mut back).expect("member read");
    assert_eq!(
        &back[..],
        &original[..],
        "{}: a stranger changed the segment",
        seg.backend
    );
}

#[test]
fn a_stranger_cannot_use_a_cluster_with_a_secret() {
    let file = TokenFile::new("cluster", &format!("{SECRET}\n"));
    let right = leak(SECRET);
    let master = Master::start(&[&file.flag()]);
    let uring_node = Node::start(&master, &[&file.flag(), "--global_segment_size=16 MB"]);
    let blocking_node = Node::start_with_env(
        &master,
        &[&file.flag(), "--global_segment_size=16 MB"],
        &[("MC_DISABLE_IO_URING", "1")],
    );
    // Both nodes authenticated to the master (RPC) and to the metadata server (PUT).
    let segments = master_segments(&master);
    for n in [&uring_node, &blocking_node] {
        assert!(
            segments.contains(&n.segments[0].name),
            "{segments:?} lacks {}",
            n.segments[0].name
        );
    }
    assert_eq!(blocking_node.segments[0].backend, "blocking");

    for n in [&uring_node, &blocking_node] {
        assert_stranger_cannot_touch(&n.segments[0], right);
    }

    // Master RPC, the real client without a secret: its request is answered ILLEGAL_CLIENT.
    let c = MasterClient::new(&master.rpc_addr()).unwrap();
    match c.call(&ServiceReady {}) {
        Ok(Err(code)) => assert_eq!(code, ErrorCode::IllegalClient),
        Err(e) => panic!("expected an ILLEGAL_CLIENT answer, got the error {e}"),
        Ok(Ok(_)) => panic!("a stranger's RPC was served"),
    }
    // Raw: a request first gets the same answer, then the connection closes.
    let mut s = TcpStream::connect(master.rpc_addr()).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.write_all(&service_ready_frame(9)).unwrap();
    assert_eq!(read_answer(&mut s), (9, ErrorCode::IllegalClient.code()));
    let mut rest = Vec::new();
    let _ = s.read_to_end(&mut rest);
    assert!(rest.is_empty(), "more after the refusal: {rest:?}");
    // A wrong secret is refused in the handshake.
    let mut s = TcpStream::connect(master.rpc_addr()).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    assert_eq!(
        auth::client_handshake(&mut s, leak("a-guess")),
        Err(AuthError::Refused)
    );
    // The right secret is served, and the master proved itself.
    let mut s = TcpStream::connect(master.rpc_addr()).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    auth::client_handshake(&mut s, right).expect("the right secret authenticates");
    s.write_all(&service_ready_frame(10)).unwrap();
    assert_eq!(read_answer(&mut s), (10, 0));

    // Metadata: reads and writes need the derived bearer (descriptors carry addresses and
    // RDMA keys); /health stays open.
    let port = master.http_metadata_port;
    let path = "/metadata?key=auth_test";
    assert_eq!(http_status("PUT", port, path, None), 401);
    assert_eq!(
        http_status("PUT", port, path, Some(&format!("Bearer {SECRET}"))),
        401
    );
    let bearer = format!("Bearer {}", right.http_bearer());
    assert_eq!(http_status("PUT", port, path, Some(&bearer)), 200);
    assert_eq!(http_status("GET", port, path, None), 401);
    assert_eq!(http_status("GET", port, path, Some(&bearer)), 200);
    assert_eq!(http_status("GET", port, "/health", None), 200);
    assert_eq!(http_status("DELETE", port, path, None), 401);
    assert_eq!(http_status("DELETE", port, path, Some(&bearer)), 200);
    // The admin server's writes (tenant quotas) need the bearer; its reads stay open.
    let quota = "/api/v1/tenant_quotas?tenant=intruder";
    for method in ["PUT", "DELETE"] {
        assert_eq!(http_status(method, master.metrics_port, quota, None), 401);
        let wrong = Some("Bearer 00");
        assert_eq!(http_status(method, master.metrics_port, quota, wrong), 401);
        let with = http_status(method, master.metrics_port, quota, Some(&bearer));
        assert_ne!(with, 401, "{method} with the bearer");
    }
    assert_eq!(http("GET", master.metrics_port, "/health", b"").status, 200);
}

/// Runs `bin` with `args` and returns its exit code and stderr (at most 20 s).
fn run_briefly(bin: &str, args: &[String]) -> (Option<i32>, String) {
    let mut child = Command::new(bin_path(bin))
        .args(args)
        .env_remove(auth::ENV_TOKEN)
        .env_remove(auth::ENV_TOKEN_FILE)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            let mut err = String::new();
            child
                .stderr
                .take()
                .unwrap()
                .read_to_string(&mut err)
                .unwrap();
            return (status.code(), err);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{bin} {args:?} still running after 20 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn bad_token_files_stop_the_start() {
    let empty = TokenFile::new("empty", "\n");
    for bin in ["mooncake_master", "mooncake_client"] {
        let port = free_port();
        let mut args = vec![
            empty.flag(),
            format!("--port={port}"),
            format!("--rpc_port={port}"),
        ];
        if bin == "mooncake_client" {
            args.pop();
        }
        let (code, err) = run_briefly(bin, &args);
        assert_eq!(code, Some(2), "{bin}: {err}");
        assert!(err.contains("empty"), "{bin}: {err}");
        args[0] = "--auth_token_file=/nonexistent/mc-token".into();
        let (code, err) = run_briefly(bin, &args);
        assert_eq!(code, Some(2), "{bin}: {err}");
        assert!(err.contains("/nonexistent/mc-token"), "{bin}: {err}");
    }
}

#[test]
fn a_node_with_another_secret_cannot_join() {
    let file = TokenFile::new("join", SECRET);
    let other = TokenFile::new("join-other", "not-the-cluster-secret");
    let master = Master::start(&[&file.flag()]);
    let args = vec![
        other.flag(),
        "--host=127.0.0.1".to_string(),
        format!("--port={}", free_port()),
        format!("--master_server_address={}", master.rpc_addr()),
        format!(
            "--metadata_server=http://127.0.0.1:{}/metadata",
            master.http_metadata_port
        ),
        "--global_segment_size=16 MB".to_string(),
    ];
    let (code, err) = run_briefly("mooncake_client", &args);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("refused our proof"), "{err}");
    assert!(master_segments(&master).is_empty());
}

#[test]
fn the_master_drops_a_peer_that_does_not_authenticate() {
    let file = TokenFile::new("silent", SECRET);
    let master = Master::start(&[&file.flag()]);
    // One peer says nothing, one stops after half a HELLO: both are closed by the master's
    // handshake timeout (10 s), and neither holds the master up for others meanwhile.
    let mut quiet = TcpStream::connect(master.rpc_addr()).unwrap();
    let mut half = TcpStream::connect(master.rpc_addr()).unwrap();
    half.write_all(&auth::MAGIC).unwrap();
    let mut s = TcpStream::connect(master.rpc_addr()).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    auth::client_handshake(&mut s, leak(SECRET)).expect("others are served meanwhile");
    let started = Instant::now();
    for peer in [&mut quiet, &mut half] {
        peer.set_read_timeout(Some(Duration::from_secs(15)))
            .unwrap();
        let mut b = [0u8; 64];
        loop {
            match peer.read(&mut b) {
                Ok(0) => break,
                Err(e) if e.kind() == ErrorKind::ConnectionReset => break,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                other => panic!("expected the master to close, got {other:?}"),
            }
        }
    }
    assert!(
        started.elapsed() < Duration::from_secs(12),
        "{:?}",
        started.elapsed()
    );
}
