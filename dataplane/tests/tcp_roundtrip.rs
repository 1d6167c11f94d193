//! Loopback round trips through the TCP data plane: every byte checked, batches with many
//! requests in flight, concurrent clients.

#[macro_use]
mod common;

use common::{pattern, Backend, Fixture};
use dataplane::mem::{Dst, Src};
use dataplane::transport::client::TransferOp;
use rand::{Rng, RngCore, SeedableRng};

const SEGMENT_BYTES: usize = 16 * 1024 * 1024;

fn rng() -> rand::rngs::StdRng {
    let seed = rand::thread_rng().gen();
    println!("seed {seed}");
    rand::rngs::StdRng::seed_from_u64(seed)
}

fn tcp_random_sizes_round_trip_every_byte(backend: Backend) {
    let f = Fixture::registered(backend, SEGMENT_BYTES);
    let client = f.client(2);
    let mut rng = rng();
    let mut sizes = vec![
        1usize,
        2,
        31,
        4095,
        4096,
        4097,
        65536,
        65537,
        1 << 20,
        (2 << 20) + 3,
    ];
    sizes.extend((0..30).map(|_| rng.gen_range(1..=256 * 1024)));
    for len in sizes {
        let offset = rng.gen_range(0..=SEGMENT_BYTES - len);
        let mut data = vec![0u8; len];
        rng.fill_bytes(&mut data);
        client.write(f.base() + offset as u64, &data).unwrap();
        assert_eq!(
            f.snapshot(offset, len),
            data,
            "segment after write of {len} at {offset}"
        );
        let mut back = vec![0u8; len];
        client.read(f.base() + offset as u64, &mut back).unwrap();
        assert_eq!(back, data, "read back of {len} at {offset}");
    }
}

fn tcp_read_sees_the_served_pattern(backend: Backend) {
    let f = Fixture::registered(backend, SEGMENT_BYTES);
    let client = f.client(1);
    let mut buf = vec![0u8; 3 << 20];
    client.read(f.base() + 12345, &mut buf).unwrap();
    for (i, &b) in buf.iter().enumerate() {
        assert_eq!(b, pattern(12345 + i), "byte {i}");
    }
}

fn tcp_batch_with_many_requests_in_flight(backend: Backend) {
    let f = Fixture::registered(backend, SEGMENT_BYTES);
    let client = f.client(4);
    let mut rng = rng();
    // 512 disjoint slots of 32 KiB, each written with random bytes of a random length.
    let slot = 32 * 1024;
    let datas: Vec<Vec<u8>> = (0..512)
        .map(|_| {
            let mut d = vec![0u8; rng.gen_range(1..=slot)];
            rng.fill_bytes(&mut d);
            d
        })
        .collect();
    let mut writes: Vec<TransferOp<'_>> = datas
        .iter()
        .enumerate()
        .map(|(i, d)| TransferOp::Write {
            remote_addr: f.base() + (i * slot) as u64,
            src: Src::from(&d[..]),
        })
        .collect();
    let results = client.submit(&mut writes);
    assert!(results.iter().all(|r| r.is_ok()), "{results:?}");
    let mut backs: Vec<Vec<u8>> = datas.iter().map(|d| vec![0u8; d.len()]).collect();
    let mut reads: Vec<TransferOp<'_>> = backs
        .iter_mut()
        .enumerate()
        .map(|(i, b)| TransferOp::Read {
            remote_addr: f.base() + (i * slot) as u64,
            dst: Dst::from(&mut b[..]),
        })
        .collect();
    let results = client.submit(&mut reads);
    assert!(results.iter().all(|r| r.is_ok()), "{results:?}");
    assert_eq!(backs, datas);
}

fn tcp_batch_reports_a_status_per_request(backend: Backend) {
    let f = Fixture::registered(backend, 1 << 20);
    let client = f.client(3);
    let data = vec![0xABu8; 1000];
    let mut sink = vec![0u8; 1000];
    let mut empty: [u8; 0] = [];
    let beyond = f.base() + f.segment.len() as u64 - 10;
    let mut ops = vec![
        TransferOp::Write {
            remote_addr: f.base(),
            src: Src::from(&data[..]),
        },
        TransferOp::Write {
            remote_addr: beyond,
            src: Src::from(&data[..]),
        },
        // Requests of one batch are unordered, so read a range no write of it touches.
        TransferOp::Read {
            remote_addr: f.base() + 200_000,
            dst: Dst::from(&mut sink[..]),
        },
        TransferOp::Read {
            remote_addr: 16,
            dst: Dst::from(&mut empty[..]),
        },
        TransferOp::Write {
            remote_addr: f.base() + 5000,
            src: Src::from(&data[..]),
        },
    ];
    let results = client.submit(&mut ops);
    drop(ops);
    assert!(results[0].is_ok());
    assert_eq!(results[1].as_ref().unwrap_err().code(), -3);
    assert!(
        results[2].is_ok() && results[3].is_ok() && results[4].is_ok(),
        "{results:?}"
    );
    assert_eq!(sink, (200_000..201_000).map(pattern).collect::<Vec<_>>());
    assert_eq!(f.snapshot(0, 1000), data);
    assert_eq!(f.snapshot(5000, 1000), data);
    f.assert_pattern_outside_all(&[(0, 1000), (5000, 1000)]);
}

fn tcp_concurrent_clients_and_threads(backend: Backend) {
    let f = Fixture::registered(backend, SEGMENT_BYTES);
    let shared_client = f.client(4);
    let region = SEGMENT_BYTES / 8;
    std::thread::scope(|s| {
        for t in 0..8usize {
            let (f, shared_client) = (&f, &shared_client);
            s.spawn(move || {
                let own = f.client(2);
                let client = if t % 2 == 0 { shared_client } else { &own };
                let mut rng = rand::rngs::StdRng::seed_from_u64(t as u64);
                for _ in 0..20 {
                    let len = rng.gen_range(1..=64 * 1024);
                    let off = t * region + rng.gen_range(0..=region - len);
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
}

fn tcp_zero_length_requests_complete_without_io(backend: Backend) {
    let f = Fixture::registered(backend, 1 << 20);
    let client = f.client(1);
    // Address 1 is not registered, yet a zero-length request succeeds (upstream semantics).
    client.write(1, &[]).unwrap();
    client.read(1, &mut []).unwrap();
    assert_eq!(
        f.server
            .stats()
            .requests_ok
            .load(std::sync::atomic::Ordering::Relaxed),
        0
    );
}

both_backends!(
    tcp_random_sizes_round_trip_every_byte,
    tcp_read_sees_the_served_pattern,
    tcp_batch_with_many_requests_in_flight,
    tcp_batch_reports_a_status_per_request,
    tcp_concurrent_clients_and_threads,
    tcp_zero_length_requests_complete_without_io,
);
