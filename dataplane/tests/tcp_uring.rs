//! io_uring shard specifics: many connections, deep pipelines on one connection, peers that
//! vanish mid-payload or read slowly, I/O timeouts, and unregister waiting for in-flight
//! payloads. Each test prints why and passes when io_uring is unavailable here.

#[macro_use]
mod common;

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{eventually, pattern, Backend, Fixture};
use dataplane::mem::served::{ServedMemory, ServerConfig};
use dataplane::server::uring::UringServer;
use dataplane::transport::header::{Opcode, RequestHeader, ResponseHeader, RESPONSE_HEADER_BYTES};
use rand::{Rng, RngCore, SeedableRng};

const SEGMENT_BYTES: usize = 16 << 20;

/// The uring fixture, or `None` (with the reason printed) where io_uring is unavailable.
fn uring_fixture(len: usize) -> Option<Fixture> {
    if let Some(why) = common::unavailable(Backend::Uring) {
        println!("skipped: {why}");
        return None;
    }
    Some(Fixture::registered(Backend::Uring, len))
}

fn raw_connect(f: &Fixture) -> TcpStream {
    let s = TcpStream::connect(f.addr()).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.set_nodelay(true).unwrap();
    s
}

fn read_response(s: &mut TcpStream) -> ResponseHeader {
    let mut raw = [0u8; RESPONSE_HEADER_BYTES];
    s.read_exact(&mut raw).unwrap();
    ResponseHeader::decode(&raw).unwrap()
}

fn assert_still_serving(f: &Fixture, offset: usize) {
    let client = f.client(1);
    let data = [9u8, 8, 7];
    client.write(f.base() + offset as u64, &data).unwrap();
    let mut back = [0u8; 3];
    client.read(f.base() + offset as u64, &mut back).unwrap();
    assert_eq!(back, data);
}

#[test]
fn uring_many_connections_at_once() {
    let Some(f) = uring_fixture(SEGMENT_BYTES) else {
        return;
    };
    let conns = 64usize;
    let region = SEGMENT_BYTES / conns;
    let clients: Vec<_> = (0..conns).map(|_| f.client(1)).collect();
    eventually("all connections accepted", || {
        f.server.connection_count() == conns
    });
    std::thread::scope(|s| {
        for (i, client) in clients.iter().enumerate() {
            let f = &f;
            s.spawn(move || {
                let mut rng = rand::rngs::StdRng::seed_from_u64(i as u64);
                for _ in 0..10 {
                    let len = rng.gen_range(1..=region);
                    let off = i * region + rng.gen_range(0..=region - len);
                    let mut data = vec![0u8; len];
                    rng.fill_bytes(&mut data);
                    client.write(f.base() + off as u64, &data).unwrap();
                    let mut back = vec![0u8; len];
                    client.read(f.base() + off as u64, &mut back).unwrap();
                    assert_eq!(back, data);
                }
            });
        }
    });
    let stats = f.server.stats();
    // Counted when the shard sees its send complete, which may trail the client's read.
    eventually("every request counted", || {
        stats.requests_ok.load(Ordering::Relaxed) == conns as u64 * 20
    });
    assert!(stats.loop_iterations.load(Ordering::Relaxed) > 0);
    drop(clients);
    eventually("all connections closed", || {
        f.server.connection_count() == 0
    });
    assert_eq!(stats.connections_aborted.load(Ordering::Relaxed), 0);
}

#[test]
fn uring_256_requests_in_flight_on_one_connection() {
    let Some(f) = uring_fixture(SEGMENT_BYTES) else {
        return;
    };
    let mut s = raw_connect(&f);
    let mut rng = rand::rngs::StdRng::seed_from_u64(256);
    let slot = 16 * 1024usize;
    // Requests 0..128 write random bytes to slots 0..128; 128..256 read slots 128..256
    // (untouched pattern); every fourth read is out of range and must fail alone.
    let mut wire = Vec::new();
    let mut expect: HashMap<u64, (i32, Vec<u8>)> = HashMap::new();
    let mut written = Vec::new();
    for id in 0..256u64 {
        let off = id as usize * slot;
        let len = rng.gen_range(1..=slot);
        if id < 128 {
            let mut data = vec![0u8; len];
            rng.fill_bytes(&mut data);
            let h = RequestHeader {
                opcode: Opcode::Write,
                request_id: id,
                addr: f.base() + off as u64,
                len: len as u64,
            };
            wire.extend_from_slice(&h.encode());
            wire.extend_from_slice(&data);
            written.push((off, data));
            expect.insert(id, (0, Vec::new()));
        } else if id % 4 == 0 {
            let h = RequestHeader {
                opcode: Opcode::Read,
                request_id: id,
                addr: 8,
                len: len as u64,
            };
            wire.extend_from_slice(&h.encode());
            expect.insert(id, (-3, Vec::new()));
        } else {
            let h = RequestHeader {
                opcode: Opcode::Read,
                request_id: id,
                addr: f.base() + off as u64,
                len: len as u64,
            };
            wire.extend_from_slice(&h.encode());
            expect.insert(id, (0, (off..off + len).map(pattern).collect()));
        }
    }
    let mut writer = s.try_clone().unwrap();
    let sender = std::thread::spawn(move || writer.write_all(&wire).unwrap());
    for _ in 0..256 {
        let r = read_response(&mut s);
        let (status, payload) = expect
            .remove(&r.request_id)
            .unwrap_or_else(|| panic!("unexpected or repeated id {}", r.request_id));
        assert_eq!(r.status, status, "request {}", r.request_id);
        assert_eq!(r.len, payload.len() as u64, "request {}", r.request_id);
        let mut got = vec![0u8; payload.len()];
        s.read_exact(&mut got).unwrap();
        assert_eq!(got, payload, "request {}", r.request_id);
    }
    sender.join().unwrap();
    assert!(expect.is_empty());
    for (off, data) in &written {
        assert_eq!(&f.snapshot(*off, data.len()), data);
    }
    assert_eq!(
        f.server.stats().requests_rejected.load(Ordering::Relaxed),
        32
    );
}

#[test]
fn uring_peer_vanishing_mid_payload_with_a_read_in_flight() {
    let Some(f) = uring_fixture(SEGMENT_BYTES) else {
        return;
    };
    let target = (8usize << 20, 4usize << 20);
    let mut s = raw_connect(&f);
    // A large READ whose response the peer never reads, then a WRITE cut short.
    let read = RequestHeader {
        opcode: Opcode::Read,
        request_id: 1,
        addr: f.base(),
        len: 4 << 20,
    };
    let write = RequestHeader {
        opcode: Opcode::Write,
        request_id: 2,
        addr: f.base() + target.0 as u64,
        len: target.1 as u64,
    };
    s.write_all(&read.encode()).unwrap();
    s.write_all(&write.encode()).unwrap();
    s.write_all(&vec![0x5Au8; 100_000]).unwrap();
    std::thread::sleep(Duration::from_millis(50));
    drop(s);
    eventually("the connection is counted as aborted", || {
        f.server.stats().connections_aborted.load(Ordering::Relaxed) == 1
    });
    eventually("the connection is gone", || {
        f.server.connection_count() == 0
    });
    assert_still_serving(&f, 0);
    // Every lease was released: unregister returns at once.
    let started = Instant::now();
    f.memory.unregister(f.base()).unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "{:?}",
        started.elapsed()
    );
    f.assert_pattern_outside_all(&[target, (0, 3)]);
    assert_eq!(f.snapshot(target.0, 100_000), vec![0x5Au8; 100_000]);
}

#[test]
fn uring_slow_reader_does_not_stall_others() {
    let Some(f) = uring_fixture(SEGMENT_BYTES) else {
        return;
    };
    let mut s = raw_connect(&f);
    // More pipelined READs than the shard queues per connection: it must stop reading this
    // peer's requests (backpressure) rather than queue without bound.
    let n = 3000u64;
    let len = 4096usize;
    let mut wire = Vec::new();
    for id in 0..n {
        let off = (id as usize * len) % (SEGMENT_BYTES - len);
        wire.extend_from_slice(
            &RequestHeader {
                opcode: Opcode::Read,
                request_id: id,
                addr: f.base() + off as u64,
                len: len as u64,
            }
            .encode(),
        );
    }
    let mut writer = s.try_clone().unwrap();
    let sender = std::thread::spawn(move || writer.write_all(&wire).unwrap());
    // While this peer reads nothing, others are served promptly.
    let other = f.client(1);
    for i in 0..20 {
        let started = Instant::now();
        let mut back = [0u8; 64];
        other.read(f.base() + i * 64, &mut back).unwrap();
        assert!(started.elapsed() < Duration::from_millis(500));
    }
    std::thread::sleep(Duration::from_millis(300));
    let mut payload = vec![0u8; len];
    for id in 0..n {
        let r = read_response(&mut s);
        assert_eq!((r.status, r.request_id, r.len), (0, id, len as u64));
        s.read_exact(&mut payload).unwrap();
        let off = (id as usize * len) % (SEGMENT_BYTES - len);
        assert_eq!(payload[0], pattern(off), "request {id}");
        assert_eq!(payload[len - 1], pattern(off + len - 1), "request {id}");
    }
    sender.join().unwrap();
    assert_eq!(
        f.server.stats().connections_aborted.load(Ordering::Relaxed),
        0
    );
}

#[test]
fn uring_peer_silent_mid_payload_is_closed_after_the_io_timeout() {
    if let Some(why) = common::unavailable(Backend::Uring) {
        println!("skipped: {why}");
        return;
    }
    let f = Fixture::registered(Backend::Uring, 1 << 20);
    let memory = f.memory.clone();
    let config = ServerConfig {
        io_timeout: Duration::from_millis(200),
        ..Default::default()
    };
    let server = UringServer::bind("127.0.0.1:0".parse().unwrap(), memory, config, None).unwrap();
    let mut s = TcpStream::connect(server.local_addr()).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let h = RequestHeader {
        opcode: Opcode::Write,
        request_id: 1,
        addr: f.base(),
        len: 4096,
    };
    s.write_all(&h.encode()).unwrap();
    s.write_all(&[0u8; 10]).unwrap();
    let started = Instant::now();
    let mut byte = [0u8; 1];
    // A read with a timeout returns EINTR when io_uring task work lands on this thread (the
    // probe's ring being torn down does that): not a close, read again.
    let r = loop {
        match s.read(&mut byte) {
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            other => break other,
        }
    };
    let closed = matches!(r, Ok(0) | Err(_));
    assert!(
        closed,
        "the server should close a connection silent mid-payload"
    );
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_millis(150) && waited < Duration::from_secs(3),
        "{waited:?}"
    );
    assert_eq!(
        server.stats().connections_aborted.load(Ordering::Relaxed),
        1
    );
    // An idle connection (between frames) is not timed out.
    let idle = TcpStream::connect(server.local_addr()).unwrap();
    std::thread::sleep(Duration::from_millis(400));
    assert_eq!(server.connection_count(), 1);
    drop(idle);
}

#[test]
fn uring_unregister_waits_for_a_payload_in_flight() {
    let Some(f) = uring_fixture(1 << 20) else {
        return;
    };
    let mut s = raw_connect(&f);
    let h = RequestHeader {
        opcode: Opcode::Write,
        request_id: 1,
        addr: f.base() + 4096,
        len: 8192,
    };
    s.write_all(&h.encode()).unwrap();
    s.write_all(&[1u8; 100]).unwrap();
    eventually("the payload is being received", || {
        f.snapshot(4096, 100) == vec![1u8; 100]
    });
    let memory: Arc<ServedMemory> = f.memory.clone();
    let base = f.base();
    let unregister = std::thread::spawn(move || memory.unregister(base));
    std::thread::sleep(Duration::from_millis(100));
    assert!(
        !unregister.is_finished(),
        "unregister returned while a payload was landing in the buffer"
    );
    s.write_all(&[2u8; 8092]).unwrap();
    let r = read_response(&mut s);
    assert_eq!((r.status, r.request_id), (0, 1));
    assert_eq!(unregister.join().unwrap(), Ok(1 << 20));
    // Now refused.
    let h2 = RequestHeader { request_id: 2, ..h };
    s.write_all(&h2.encode()).unwrap();
    s.write_all(&[3u8; 8192]).unwrap();
    let r = read_response(&mut s);
    assert_eq!((r.status, r.request_id), (-3, 2));
    assert_eq!(f.snapshot(4096 + 100, 10), vec![2u8; 10]);
}
