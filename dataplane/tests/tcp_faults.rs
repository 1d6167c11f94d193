//! Faults on the TCP data plane: refused ranges, malformed and truncated frames, dropped
//! connections. Each must fail only its own request or connection and change no memory
//! outside the target range.

#[macro_use]
mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use common::{eventually, pattern, Backend, Fixture};
use dataplane::limits::REQUEST_PAYLOAD_MAX_BYTES;
use dataplane::transport::client::TcpClient;
use dataplane::transport::header::{
    Opcode, RequestHeader, ResponseHeader, REQUEST_HEADER_BYTES, RESPONSE_HEADER_BYTES,
};

const SEGMENT_BYTES: usize = 1 << 20;

fn raw_connect(f: &Fixture) -> TcpStream {
    let s = TcpStream::connect(f.addr()).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s
}

fn read_response(s: &mut TcpStream) -> ResponseHeader {
    let mut raw = [0u8; RESPONSE_HEADER_BYTES];
    s.read_exact(&mut raw).unwrap();
    ResponseHeader::decode(&raw).unwrap()
}

fn assert_closed_by_server(s: &mut TcpStream) {
    let mut byte = [0u8; 1];
    loop {
        match s.read(&mut byte) {
            Ok(0) => return,
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return,
            // io_uring task work landing on this thread interrupts a read with a timeout.
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            other => panic!("expected the server to close the connection, got {other:?}"),
        }
    }
}

/// A healthy client still gets served: write then read back a few bytes.
fn assert_still_serving(f: &Fixture, offset: usize) {
    let client = f.client(1);
    let data = [1u8, 2, 3, 4, 5];
    client.write(f.base() + offset as u64, &data).unwrap();
    let mut back = [0u8; 5];
    client.read(f.base() + offset as u64, &mut back).unwrap();
    assert_eq!(back, data);
}

/// Registers `[offset, offset + len)` of the fixture's segment.
fn register(f: &Fixture, offset: usize, len: usize) {
    assert!(offset + len <= f.segment.len());
    // SAFETY: the range is inside the fixture's segment, which outlives the server (both are
    // fields of the fixture and the server is dropped first).
    unsafe {
        f.memory
            .register(f.base() + offset as u64, len as u64)
            .unwrap()
    };
}

fn tcp_write_outside_registered_memory_is_refused_and_neighbours_unchanged(backend: Backend) {
    let f = Fixture::unregistered(backend, SEGMENT_BYTES);
    register(&f, 4096, 4096);
    register(&f, 8192, 4096); // adjacent but separate buffer
    let client = f.client(1);
    let data = vec![0xEEu8; 200];
    for offset in [0usize, 4000, 8100, 12200, 4096 * 3, 16384] {
        let err = client.write(f.base() + offset as u64, &data).unwrap_err();
        assert_eq!(err.code(), -3, "write at {offset}");
    }
    let err = client.write(u64::MAX - 10, &data).unwrap_err();
    assert_eq!(err.code(), -3);
    // Refused payloads were drained: the same single-lane connection still works.
    client.write(f.base() + 4096, &data).unwrap();
    f.assert_pattern_outside(4096, 200);
    assert_eq!(f.snapshot(4096, 200), data);
    assert_eq!(
        f.server.stats().requests_rejected.load(Ordering::Relaxed),
        7
    );
    assert_eq!(
        f.server.stats().connections_aborted.load(Ordering::Relaxed),
        0
    );
}

fn tcp_read_outside_registered_memory_is_refused(backend: Backend) {
    let f = Fixture::unregistered(backend, SEGMENT_BYTES);
    register(&f, 4096, 4096);
    let client = f.client(1);
    let mut buf = vec![0u8; 100];
    assert_eq!(client.read(f.base(), &mut buf).unwrap_err().code(), -3);
    assert_eq!(
        client.read(f.base() + 8150, &mut buf).unwrap_err().code(),
        -3
    );
    assert!(
        buf.iter().all(|&b| b == 0),
        "a refused read wrote into the buffer"
    );
    client.read(f.base() + 4096, &mut buf).unwrap();
    assert_eq!(buf, (4096..4196).map(pattern).collect::<Vec<_>>());
}

fn tcp_unregistered_buffer_is_refused_afterwards(backend: Backend) {
    let f = Fixture::registered(backend, SEGMENT_BYTES);
    let client = f.client(1);
    client.write(f.base(), &[9u8; 10]).unwrap();
    assert_eq!(f.memory.unregister(f.base()).unwrap(), SEGMENT_BYTES as u64);
    assert_eq!(client.write(f.base(), &[7u8; 10]).unwrap_err().code(), -3);
    assert_eq!(f.snapshot(0, 10), vec![9u8; 10]);
    assert_eq!(f.memory.unregister(f.base()).unwrap_err().code(), -3);
}

fn tcp_truncated_header_only_closes_its_connection(backend: Backend) {
    let f = Fixture::registered(backend, SEGMENT_BYTES);
    let keep = f.client(1);
    let mut s = raw_connect(&f);
    let header = RequestHeader {
        opcode: Opcode::Write,
        request_id: 1,
        addr: f.base(),
        len: 8,
    };
    s.write_all(&header.encode()[..10]).unwrap();
    drop(s);
    eventually("the truncated connection is counted", || {
        f.server.stats().connections_aborted.load(Ordering::Relaxed) == 1
    });
    assert_still_serving(&f, 100);
    keep.write(f.base() + 200, &[1]).unwrap();
    f.assert_pattern_outside_all(&[(100, 5), (200, 1)]);
}

fn tcp_disconnect_mid_payload_changes_nothing_outside_the_target(backend: Backend) {
    let f = Fixture::registered(backend, SEGMENT_BYTES);
    let target = (65536usize, 256 * 1024usize);
    let mut s = raw_connect(&f);
    let header = RequestHeader {
        opcode: Opcode::Write,
        request_id: 7,
        addr: f.base() + target.0 as u64,
        len: target.1 as u64,
    };
    s.write_all(&header.encode()).unwrap();
    s.write_all(&vec![0x55u8; 10_000]).unwrap();
    drop(s);
    eventually("the dropped connection is counted", || {
        f.server.stats().connections_aborted.load(Ordering::Relaxed) == 1
    });
    assert_still_serving(&f, 0);
    f.assert_pattern_outside_all(&[target, (0, 5)]);
    // What did arrive landed in the target's first bytes, and nothing past what was sent.
    assert_eq!(f.snapshot(target.0, 10_000), vec![0x55u8; 10_000]);
    assert_eq!(
        f.snapshot(target.0 + 10_000, 100),
        (target.0 + 10_000..target.0 + 10_100)
            .map(pattern)
            .collect::<Vec<_>>()
    );
}

fn tcp_stalled_connection_does_not_block_others(backend: Backend) {
    let f = Fixture::registered(backend, SEGMENT_BYTES);
    let mut s = raw_connect(&f);
    let header = RequestHeader {
        opcode: Opcode::Write,
        request_id: 1,
        addr: f.base(),
        len: 4096,
    };
    s.write_all(&header.encode()).unwrap();
    s.write_all(&[0u8; 100]).unwrap(); // and then nothing: the server waits mid-payload
    std::thread::sleep(Duration::from_millis(50));
    assert_still_serving(&f, 8192);
    drop(s);
}

fn tcp_malformed_headers_get_an_error_and_a_close(backend: Backend) {
    let f = Fixture::registered(backend, SEGMENT_BYTES);
    let good = RequestHeader {
        opcode: Opcode::Read,
        request_id: 42,
        addr: f.base(),
        len: 8,
    };
    let mut cases: Vec<(&str, [u8; REQUEST_HEADER_BYTES], u64)> = Vec::new();
    let mut b = good.encode();
    b[0] = b'X';
    cases.push(("bad magic", b, u64::MAX));
    let mut b = good.encode();
    b[4] = 9;
    cases.push(("bad version", b, 42));
    let mut b = good.encode();
    b[5] = 7;
    cases.push(("bad opcode", b, 42));
    let mut b = good.encode();
    b[6] = 1;
    cases.push(("bad flags", b, 42));
    let b = RequestHeader {
        len: REQUEST_PAYLOAD_MAX_BYTES + 1,
        ..good
    }
    .encode();
    cases.push(("oversized length", b, 42));
    for (what, bytes, id) in cases {
        let mut s = raw_connect(&f);
        s.write_all(&bytes).unwrap();
        let resp = read_response(&mut s);
        assert_eq!(
            (resp.status, resp.request_id, resp.len),
            (-1, id, 0),
            "{what}"
        );
        assert_closed_by_server(&mut s);
    }
    assert_eq!(f.server.stats().frames_malformed.load(Ordering::Relaxed), 5);
    assert_still_serving(&f, 0);
    f.assert_pattern_outside(0, 5);
}

fn tcp_zero_length_on_the_wire_is_invalid_argument_and_keeps_the_connection(backend: Backend) {
    let f = Fixture::registered(backend, SEGMENT_BYTES);
    let mut s = raw_connect(&f);
    let zero = RequestHeader {
        opcode: Opcode::Write,
        request_id: 3,
        addr: f.base(),
        len: 0,
    };
    let read = RequestHeader {
        opcode: Opcode::Read,
        request_id: 4,
        addr: f.base() + 10,
        len: 3,
    };
    // Pipelined: both headers at once, responses matched by id.
    let mut bytes = zero.encode().to_vec();
    bytes.extend_from_slice(&read.encode());
    s.write_all(&bytes).unwrap();
    let r1 = read_response(&mut s);
    assert_eq!((r1.status, r1.request_id, r1.len), (-1, 3, 0));
    let r2 = read_response(&mut s);
    assert_eq!((r2.status, r2.request_id, r2.len), (0, 4, 3));
    let mut payload = [0u8; 3];
    s.read_exact(&mut payload).unwrap();
    assert_eq!(payload, [pattern(10), pattern(11), pattern(12)]);
}

#[test]
fn tcp_client_connect_to_a_closed_port_fails_with_socket_error() {
    let dead = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let err = TcpClient::connect(dead, Default::default()).unwrap_err();
    assert_eq!(err.code(), -102);
}

fn tcp_client_reconnects_a_lane_the_server_dropped(backend: Backend) {
    let f = Fixture::registered(backend, SEGMENT_BYTES);
    let client = f.client(1);
    client.write(f.base(), &[1, 2, 3]).unwrap();
    let common::Fixture {
        server,
        memory,
        segment,
        ..
    } = f;
    let addr = server.local_addr();
    drop(server);
    // A new server on the same port (std listeners set SO_REUSEADDR) serving the same memory.
    let server = common::start(backend, addr, memory);
    assert!(
        client.write(segment.addr() as u64, &[4, 5, 6]).is_err(),
        "old lane is dead"
    );
    client.write(segment.addr() as u64, &[7, 8, 9]).unwrap();
    let mut back = [0u8; 3];
    client.read(segment.addr() as u64, &mut back).unwrap();
    assert_eq!(back, [7, 8, 9]);
    drop(server);
}

fn tcp_server_drop_closes_open_connections(backend: Backend) {
    let f = Fixture::registered(backend, SEGMENT_BYTES);
    let client = f.client(2);
    client.write(f.base(), &[1, 2, 3]).unwrap();
    let mut idle = raw_connect(&f);
    // The client's one small write used one lane: its other lane is never dialed.
    eventually("two connections served", || {
        f.server.connection_count() == 2
    });
    let started = Instant::now();
    let common::Fixture { server, .. } = f;
    drop(server);
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "drop took {:?}",
        started.elapsed()
    );
    assert_closed_by_server(&mut idle);
    assert!(client.write(0, &[1]).is_err());
}

both_backends!(
    tcp_write_outside_registered_memory_is_refused_and_neighbours_unchanged,
    tcp_read_outside_registered_memory_is_refused,
    tcp_unregistered_buffer_is_refused_afterwards,
    tcp_truncated_header_only_closes_its_connection,
    tcp_disconnect_mid_payload_changes_nothing_outside_the_target,
    tcp_stalled_connection_does_not_block_others,
    tcp_malformed_headers_get_an_error_and_a_close,
    tcp_zero_length_on_the_wire_is_invalid_argument_and_keeps_the_connection,
    tcp_client_reconnects_a_lane_the_server_dropped,
    tcp_server_drop_closes_open_connections,
);
