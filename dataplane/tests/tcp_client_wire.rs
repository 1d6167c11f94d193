//! The TCP client against scripted peers that speak the frames by hand: responses out of
//! order, a lane that stalls mid-payload (timeout, then recovery on a new connection), the
//! bound on requests in flight per lane, and which requests share a lane.

use dataplane::mem::{Dst, Src};
use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use dataplane::limits::CLIENT_LANE_REQUESTS_IN_FLIGHT_MAX;
use dataplane::transport::client::{ClientConfig, TcpClient, TransferError, TransferOp};
use dataplane::transport::header::{Opcode, RequestHeader, ResponseHeader, REQUEST_HEADER_BYTES};

/// The bytes a scripted peer serves for a READ of `addr`: a function of the address.
fn served(addr: u64, len: u64) -> Vec<u8> {
    (0..len).map(|i| (addr + i).wrapping_mul(7) as u8).collect()
}

/// A peer that runs `script(connection_number, stream)` on a thread per accepted connection.
fn scripted_peer(script: impl Fn(usize, TcpStream) + Send + Sync + 'static) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let script = Arc::new(script);
    std::thread::spawn(move || {
        for (n, stream) in listener.incoming().enumerate() {
            let Ok(stream) = stream else { return };
            let script = Arc::clone(&script);
            std::thread::spawn(move || script(n, stream));
        }
    });
    addr
}

/// A request and, for a WRITE or a CATALOG_PUT, its payload.
struct Request {
    header: RequestHeader,
    payload: Vec<u8>,
}

/// Reads one request; `None` at end of stream or when nothing arrives within the stream's
/// read timeout.
fn read_request(s: &mut TcpStream) -> Option<Request> {
    let mut raw = [0u8; REQUEST_HEADER_BYTES];
    s.read_exact(&mut raw).ok()?;
    let header = RequestHeader::decode(&raw).expect("the client sends valid headers");
    let mut payload = vec![
        0u8;
        if header.opcode.has_payload() {
            header.len as usize
        } else {
            0
        }
    ];
    s.read_exact(&mut payload).expect("payload");
    Some(Request { header, payload })
}

/// The correct answer to `req`, header and payload in one buffer. A WRITE is accepted only
/// when its payload is `served(addr, len)`, so a test sees a payload out of frame.
fn answer(req: &Request) -> Vec<u8> {
    let bad_write = req.header.opcode == Opcode::Write
        && req.payload != served(req.header.addr, req.header.len);
    let req = &req.header;
    let (status, body) = if req.addr == REFUSED_ADDR {
        (-3, Vec::new())
    } else if bad_write {
        (-1, Vec::new())
    } else if req.opcode == Opcode::Read {
        (0, served(req.addr, req.len))
    } else {
        (0, Vec::new())
    };
    let mut out = ResponseHeader {
        status,
        request_id: req.request_id,
        len: body.len() as u64,
    }
    .encode()
    .to_vec();
    out.extend_from_slice(&body);
    out
}

/// Requests at this address are refused with -3 by the scripted peers.
const REFUSED_ADDR: u64 = 0xdead_0000;

/// Serves requests one at a time, in order, until the client goes away.
fn serve_in_order(mut s: TcpStream) {
    while let Some(req) = read_request(&mut s) {
        if s.write_all(&answer(&req)).is_err() {
            return;
        }
    }
}

/// Collects every request that arrives until the client is quiet for `quiet`, answers them
/// in REVERSE order (each response written in small pieces), and records how many it held.
fn serve_reversed(mut s: TcpStream, quiet: Duration, held: &Mutex<Vec<usize>>) {
    s.set_read_timeout(Some(quiet)).unwrap();
    loop {
        let mut pending = Vec::new();
        while let Some(req) = read_request(&mut s) {
            pending.push(req);
        }
        if pending.is_empty() {
            // Quiet with nothing pending: keep waiting unless the client is gone.
            let mut probe = [0u8; 1];
            match s.peek(&mut probe) {
                Ok(0) => return,
                Err(e) if !matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                    return
                }
                _ => continue,
            }
        }
        held.lock().unwrap().push(pending.len());
        for req in pending.iter().rev() {
            let bytes = answer(req);
            for piece in bytes.chunks(7) {
                if s.write_all(piece).is_err() {
                    return;
                }
            }
        }
    }
}

fn config(lanes: usize, io_timeout: Duration) -> ClientConfig {
    ClientConfig {
        lanes,
        io_timeout,
        ..Default::default()
    }
}

#[test]
fn tcp_client_matches_out_of_order_responses_by_id() {
    let held = Arc::new(Mutex::new(Vec::new()));
    let peer_held = Arc::clone(&held);
    let addr = scripted_peer(move |_, s| serve_reversed(s, Duration::from_millis(100), &peer_held));
    for lanes in [1, 3] {
        let client = TcpClient::connect(addr, config(lanes, Duration::from_secs(5))).unwrap();
        let lens = [1usize, 24, 25, 4096, 100_000, 3, 65536, 777];
        let mut dsts: Vec<Vec<u8>> = lens.iter().map(|&l| vec![0u8; l]).collect();
        let src = served(0x5000, 5000);
        let mut refused_dst = [0u8; 10];
        let mut ops: Vec<TransferOp<'_>> = dsts
            .iter_mut()
            .enumerate()
            .map(|(i, d)| TransferOp::Read {
                remote_addr: 0x1000_0000 * (i as u64 + 1),
                dst: Dst::from(&mut d[..]),
            })
            .collect();
        ops.insert(
            3,
            TransferOp::Write {
                remote_addr: 0x5000,
                src: Src::from(&src[..]),
            },
        );
        ops.push(TransferOp::Read {
            remote_addr: REFUSED_ADDR,
            dst: Dst::from(&mut refused_dst[..]),
        });
        let results = client.submit(&mut ops);
        drop(ops);
        assert_eq!(results.len(), lens.len() + 2);
        let refused = results.last().unwrap();
        assert_eq!(refused, &Err(TransferError::Refused { status: -3 }));
        assert!(
            results[..results.len() - 1].iter().all(Result::is_ok),
            "{results:?}"
        );
        for (i, d) in dsts.iter().enumerate() {
            assert_eq!(
                d,
                &served(0x1000_0000 * (i as u64 + 1), d.len() as u64),
                "read {i}"
            );
        }
    }
    assert!(
        held.lock().unwrap().iter().any(|&n| n > 1),
        "the peer never held several requests, so nothing was out of order: {:?}",
        held.lock().unwrap()
    );
}

#[test]
fn tcp_client_keeps_at_most_the_limit_in_flight_per_lane() {
    let held = Arc::new(Mutex::new(Vec::new()));
    let peer_held = Arc::clone(&held);
    let addr = scripted_peer(move |_, s| serve_reversed(s, Duration::from_millis(100), &peer_held));
    let client = TcpClient::connect(addr, config(1, Duration::from_secs(10))).unwrap();
    let count = CLIENT_LANE_REQUESTS_IN_FLIGHT_MAX * 2 + 5;
    let mut dsts: Vec<Vec<u8>> = (0..count).map(|_| vec![0u8; 16]).collect();
    let mut ops: Vec<TransferOp<'_>> = dsts
        .iter_mut()
        .enumerate()
        .map(|(i, d)| TransferOp::Read {
            remote_addr: 64 * i as u64,
            dst: Dst::from(&mut d[..]),
        })
        .collect();
    let results = client.submit(&mut ops);
    drop(ops);
    assert!(results.iter().all(Result::is_ok), "{results:?}");
    for (i, d) in dsts.iter().enumerate() {
        assert_eq!(d, &served(64 * i as u64, 16));
    }
    let held = held.lock().unwrap().clone();
    assert_eq!(held.iter().sum::<usize>(), count, "{held:?}");
    assert!(
        held.iter()
            .all(|&n| n <= CLIENT_LANE_REQUESTS_IN_FLIGHT_MAX),
        "more than {CLIENT_LANE_REQUESTS_IN_FLIGHT_MAX} in flight: {held:?}"
    );
    assert_eq!(held[0], CLIENT_LANE_REQUESTS_IN_FLIGHT_MAX, "{held:?}");
}

/// Connection 0 answers the first READ with its header and half the payload, then stalls;
/// every later connection serves properly.
fn stall_first_connection_mid_read(n: usize, mut s: TcpStream) {
    if n != 0 {
        return serve_in_order(s);
    }
    let Some(req) = read_request(&mut s) else {
        return;
    };
    let bytes = answer(&req);
    let half = bytes.len() / 2;
    let _ = s.write_all(&bytes[..half]);
    // Hold the connection open and silent well past the client's I/O timeout.
    std::thread::sleep(Duration::from_secs(5));
}

#[test]
fn tcp_client_lane_times_out_mid_read_then_recovers() {
    let addr = scripted_peer(stall_first_connection_mid_read);
    let io_timeout = Duration::from_millis(300);
    let client = TcpClient::connect(addr, config(1, io_timeout)).unwrap();
    let mut buf = vec![0u8; 256 * 1024];
    let started = Instant::now();
    assert_eq!(client.read(0x4000, &mut buf), Err(TransferError::Timeout));
    let took = started.elapsed();
    assert!(
        took >= io_timeout && took < Duration::from_secs(3),
        "timed out after {took:?}"
    );
    // The lane was dropped; the next request reconnects and succeeds.
    client.read(0x8000, &mut buf).unwrap();
    assert_eq!(buf, served(0x8000, buf.len() as u64));
    client.write(0x8000, &buf).unwrap();
    assert_eq!(
        client.write(0x9001, &buf),
        Err(TransferError::Refused { status: -1 }),
        "the peer checks WRITE payloads"
    );
}

#[test]
fn tcp_client_one_lane_timing_out_does_not_fail_the_others() {
    let addr = scripted_peer(stall_first_connection_mid_read);
    let io_timeout = Duration::from_millis(300);
    // Connection 0 (the stalling one) is lane 0, connection 1 lane 1.
    let client = TcpClient::connect(addr, config(2, io_timeout)).unwrap();
    let mut a = vec![0u8; 200_000];
    let mut b = vec![0u8; 200_000];
    let mut ops = [
        TransferOp::Read {
            remote_addr: 0x10_0000,
            dst: Dst::from(&mut a[..]),
        },
        TransferOp::Read {
            remote_addr: 0x20_0000,
            dst: Dst::from(&mut b[..]),
        },
    ];
    let started = Instant::now();
    let results = client.submit(&mut ops);
    assert!(started.elapsed() < Duration::from_secs(3));
    let timed_out: Vec<usize> = (0..2).filter(|&i| results[i].is_err()).collect();
    assert_eq!(timed_out.len(), 1, "{results:?}");
    assert_eq!(results[timed_out[0]], Err(TransferError::Timeout));
    let ok = 1 - timed_out[0];
    let (buf, addr) = if ok == 0 {
        (&a, 0x10_0000)
    } else {
        (&b, 0x20_0000)
    };
    assert_eq!(buf, &served(addr, buf.len() as u64));
    // The stalled lane reconnects; a batch over both lanes now succeeds.
    let mut ops = [
        TransferOp::Read {
            remote_addr: 0x10_0000,
            dst: Dst::from(&mut a[..]),
        },
        TransferOp::Read {
            remote_addr: 0x20_0000,
            dst: Dst::from(&mut b[..]),
        },
    ];
    let results = client.submit(&mut ops);
    assert!(results.iter().all(Result::is_ok), "{results:?}");
    assert_eq!(a, served(0x10_0000, a.len() as u64));
    assert_eq!(b, served(0x20_0000, b.len() as u64));
}

/// A peer that answers with an id nobody asked for gets its lane dropped: a protocol error,
/// then a clean reconnect.
#[test]
fn tcp_client_unknown_response_id_is_a_protocol_error() {
    let addr = scripted_peer(|n, mut s| {
        if n != 0 {
            return serve_in_order(s);
        }
        if let Some(req) = read_request(&mut s) {
            let mut wrong = req;
            wrong.header.request_id = wrong.header.request_id.wrapping_add(1000);
            let _ = s.write_all(&answer(&wrong));
            std::thread::sleep(Duration::from_secs(2));
        }
    });
    let client = TcpClient::connect(addr, config(1, Duration::from_secs(5))).unwrap();
    let mut buf = [0u8; 8];
    let err = client.read(0x100, &mut buf).unwrap_err();
    assert!(matches!(err, TransferError::Protocol(_)), "{err:?}");
    client.read(0x100, &mut buf).unwrap();
    assert_eq!(buf.to_vec(), served(0x100, 8));
}

/// Over several lanes, each WRITE that follows an intent arrives on the intent's connection
/// right after it, and each CATALOG_PUT right after the WRITE before it: the server applies
/// an intent before the bytes it announces, and records an object after them.
#[test]
fn tcp_client_keeps_an_intent_its_write_and_its_record_together() {
    // (connection, opcode, addr, payload length), in arrival order.
    type Seen = Vec<(usize, Opcode, u64, usize)>;
    let seen: Arc<Mutex<Seen>> = Arc::default();
    let log = Arc::clone(&seen);
    let peer = scripted_peer(move |n, mut s| {
        while let Some(req) = read_request(&mut s) {
            let h = req.header;
            log.lock()
                .unwrap()
                .push((n, h.opcode, h.addr, req.payload.len()));
            if s.write_all(&answer(&req)).is_err() {
                return;
            }
        }
    });
    let client = TcpClient::connect(peer, config(4, Duration::from_secs(10))).unwrap();
    let n = 48u64;
    let data: Vec<Vec<u8>> = (0..n).map(|i| served(i << 20, 1000 + i)).collect();
    let marker = [0u8; 40];
    let mut ops = Vec::new();
    for (i, d) in data.iter().enumerate() {
        let addr = (i as u64) << 20;
        ops.push(TransferOp::CatalogIntent {
            remote_addr: addr,
            record: Src::from(&marker[..17 + i % 7]),
        });
        ops.push(TransferOp::Write {
            remote_addr: addr,
            src: Src::from(&d[..]),
        });
        if i % 2 == 0 {
            ops.push(TransferOp::CatalogPut {
                remote_addr: addr,
                record: Src::from(&marker[..]),
            });
        }
    }
    assert!(client.submit(&mut ops).iter().all(Result::is_ok));
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len(), ops.len());
    let connections: std::collections::BTreeSet<usize> = seen.iter().map(|r| r.0).collect();
    assert!(connections.len() > 1, "one lane only: {connections:?}");
    for i in 0..n as usize {
        let addr = (i as u64) << 20;
        let at = |op, len| {
            seen.iter()
                .position(|r| r.1 == op && r.2 == addr && r.3 == len)
                .unwrap_or_else(|| panic!("{op:?} at {addr:#x} missing"))
        };
        let intent = at(Opcode::CatalogPut, 17 + i % 7);
        let write = at(Opcode::Write, 1000 + i);
        // Its connection's next request.
        let next = |from: usize| {
            (from + 1..seen.len())
                .find(|&j| seen[j].0 == seen[from].0)
                .expect("a request after it")
        };
        assert_eq!(next(intent), write, "item {i}: {seen:?}");
        if i % 2 == 0 {
            assert_eq!(next(write), at(Opcode::CatalogPut, 40), "item {i}");
        }
    }
}
