//! The TCP client under sharing and restarts, against both real servers: many threads
//! submitting through one `TcpClient` (single requests and batches at once), and a server
//! that goes away and comes back on the same port.

#[macro_use]
mod common;

use common::{Backend, Fixture};
use dataplane::mem::{Dst, Src};
use dataplane::transport::client::{TransferError, TransferOp};
use rand::{Rng, RngCore, SeedableRng};

const SEGMENT_BYTES: usize = 16 * 1024 * 1024;

fn seed() -> u64 {
    let seed = rand::thread_rng().gen();
    println!("seed {seed}");
    seed
}

/// Eight threads share one 4-lane client; each owns a region and mixes single writes and
/// reads with batches of up to 40 requests (sizes up to 256 KiB), checking every byte.
fn tcp_client_many_threads_share_one_client(backend: Backend) {
    let f = Fixture::registered(backend, SEGMENT_BYTES);
    let client = f.client(4);
    let threads = 8usize;
    let region = SEGMENT_BYTES / threads;
    let seed = seed();
    std::thread::scope(|s| {
        for t in 0..threads {
            let (f, client) = (&f, &client);
            s.spawn(move || {
                let mut rng = rand::rngs::StdRng::seed_from_u64(seed ^ t as u64);
                let base = f.base() + (t * region) as u64;
                for round in 0..12 {
                    if round % 3 == 0 {
                        let len = rng.gen_range(1..=region.min(256 * 1024));
                        let off = rng.gen_range(0..=region - len) as u64;
                        let mut data = vec![0u8; len];
                        rng.fill_bytes(&mut data);
                        client.write(base + off, &data).unwrap();
                        let mut back = vec![0u8; len];
                        client.read(base + off, &mut back).unwrap();
                        assert_eq!(back, data, "thread {t} round {round}");
                        continue;
                    }
                    // A batch over disjoint slots of the region: write them all, read them back.
                    let n = rng.gen_range(1..=40usize);
                    let slot = region / n;
                    let datas: Vec<Vec<u8>> = (0..n)
                        .map(|_| {
                            let mut d = vec![0u8; rng.gen_range(1..=slot.min(256 * 1024))];
                            rng.fill_bytes(&mut d);
                            d
                        })
                        .collect();
                    let mut writes: Vec<TransferOp<'_>> = datas
                        .iter()
                        .enumerate()
                        .map(|(i, d)| TransferOp::Write {
                            remote_addr: base + (i * slot) as u64,
                            src: Src::from(&d[..]),
                        })
                        .collect();
                    let results = client.submit(&mut writes);
                    assert!(results.iter().all(Result::is_ok), "{results:?}");
                    let mut backs: Vec<Vec<u8>> =
                        datas.iter().map(|d| vec![0u8; d.len()]).collect();
                    let mut reads: Vec<TransferOp<'_>> = backs
                        .iter_mut()
                        .enumerate()
                        .map(|(i, b)| TransferOp::Read {
                            remote_addr: base + (i * slot) as u64,
                            dst: Dst::from(&mut b[..]),
                        })
                        .collect();
                    let results = client.submit(&mut reads);
                    assert!(results.iter().all(Result::is_ok), "{results:?}");
                    assert_eq!(backs, datas, "thread {t} round {round}");
                }
            });
        }
    });
}

/// The server stops and a new one starts on the same port with the same memory. While it is
/// down requests fail fast with a connection error; afterwards each stale lane fails at most
/// once, is reconnected, and then every request succeeds.
fn tcp_client_survives_a_server_restart(backend: Backend) {
    let f = Fixture::registered(backend, SEGMENT_BYTES);
    let client = f.client(3);
    client.write(f.base(), &[1, 2, 3]).unwrap();
    let Fixture {
        server,
        memory,
        segment,
        ..
    } = f;
    let base = segment.addr() as u64;
    let addr = server.local_addr();
    drop(server);

    // Down: every lane is found dead (or refused on reconnect); nothing hangs. Single requests
    // take the lanes in turn, so six of them close all three.
    let started = std::time::Instant::now();
    for _ in 0..6 {
        let err = client.write(base, &[4, 5, 6]).unwrap_err();
        assert!(
            matches!(err, TransferError::Connection { .. }),
            "while down: {err:?}"
        );
    }
    assert!(started.elapsed() < std::time::Duration::from_secs(3));

    let server = common::start(backend, addr, memory);
    let data: Vec<Vec<u8>> = (0..12u8).map(|i| vec![i; 1000 + i as usize]).collect();
    let mut writes: Vec<TransferOp<'_>> = data
        .iter()
        .enumerate()
        .map(|(i, d)| TransferOp::Write {
            remote_addr: base + (i * 4096) as u64,
            src: Src::from(&d[..]),
        })
        .collect();
    // The failures above closed the lanes, so this batch reconnects them and succeeds.
    let results = client.submit(&mut writes);
    assert!(results.iter().all(Result::is_ok), "{results:?}");
    let mut backs: Vec<Vec<u8>> = data.iter().map(|d| vec![0u8; d.len()]).collect();
    let mut reads: Vec<TransferOp<'_>> = backs
        .iter_mut()
        .enumerate()
        .map(|(i, b)| TransferOp::Read {
            remote_addr: base + (i * 4096) as u64,
            dst: Dst::from(&mut b[..]),
        })
        .collect();
    let results = client.submit(&mut reads);
    assert!(results.iter().all(Result::is_ok), "{results:?}");
    assert_eq!(backs, data);

    drop(server);
}

/// Lanes connected to a server that restarts: a batch spread over all of them fails at most
/// the requests of stale lanes, and the next batch succeeds entirely.
fn tcp_client_stale_lanes_fail_once_then_reconnect(backend: Backend) {
    let f = Fixture::registered(backend, SEGMENT_BYTES);
    let client = f.client(4);
    let Fixture {
        server,
        memory,
        segment,
        ..
    } = f;
    let base = segment.addr() as u64;
    let addr = server.local_addr();
    // Touch every lane so all four are connected to the first server.
    let bufs = [[7u8; 64]; 8];
    let mut ops: Vec<TransferOp<'_>> = bufs
        .iter()
        .enumerate()
        .map(|(i, b)| TransferOp::Write {
            remote_addr: base + (i * 64) as u64,
            src: Src::from(&b[..]),
        })
        .collect();
    assert!(client.submit(&mut ops).iter().all(Result::is_ok));
    drop(server);
    let server = common::start(backend, addr, memory);
    let first = client.submit(&mut ops);
    for r in &first {
        if let Err(e) = r {
            assert!(matches!(e, TransferError::Connection { .. }), "{e:?}");
        }
    }
    let second = client.submit(&mut ops);
    assert!(second.iter().all(Result::is_ok), "{second:?}");
    drop(server);
}

/// A 4-lane client dials lanes as its traffic needs them: one for small requests sent one
/// at a time, however many; all four for a batch that can use them; the bytes arrive either
/// way.
fn tcp_client_dials_lanes_only_when_used(backend: Backend) {
    let f = Fixture::registered(backend, SEGMENT_BYTES);
    let client = f.client(4);
    common::eventually("the first lane", || f.server.connection_count() == 1);
    for i in 0..32u8 {
        client
            .write(f.base() + u64::from(i) * 4096, &[i; 64])
            .unwrap();
    }
    assert_eq!(
        f.server.connection_count(),
        1,
        "small requests one at a time"
    );
    let datas: Vec<Vec<u8>> = (0..8u8).map(|i| vec![i ^ 0x5a; 256 * 1024]).collect();
    let mut writes: Vec<TransferOp<'_>> = datas
        .iter()
        .enumerate()
        .map(|(i, d)| TransferOp::Write {
            remote_addr: f.base() + (i * d.len()) as u64,
            src: Src::from(d.as_slice()),
        })
        .collect();
    assert!(client.submit(&mut writes).iter().all(Result::is_ok));
    common::eventually("every lane", || f.server.connection_count() == 4);
    for (i, d) in datas.iter().enumerate() {
        assert_eq!(&f.snapshot(i * d.len(), d.len()), d, "piece {i}");
    }
}

both_backends!(
    tcp_client_dials_lanes_only_when_used,
    tcp_client_many_threads_share_one_client,
    tcp_client_survives_a_server_restart,
    tcp_client_stale_lanes_fail_once_then_reconnect,
);
