//! Two transfer engines in one process on loopback, with a real HTTP metadata server (a tiny
//! one written here on std::net: the master's lives in the control plane, which the data plane
//! must not depend on). Every byte is checked.

mod common;

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{rng, Buf};
use dataplane::engine::{
    EngineOptions, SegmentHandle, TransferEngine, TransferRequest, TransferStatus,
};
use dataplane::transport::header::Opcode;
use dataplane::TeError;
use rand::{Rng, RngCore};

type Store = Arc<Mutex<HashMap<String, Vec<u8>>>>;

/// A minimal HTTP metadata server: GET/PUT/DELETE /metadata?key=K, one request per
/// connection.
struct MetaServer {
    port: u16,
    store: Store,
}

fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' && i + 2 < b.len() {
            out.push(u8::from_str_radix(&s[i + 1..i + 3], 16).unwrap());
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).unwrap()
}

fn serve_one(mut s: TcpStream, store: &Store) {
    let mut raw = Vec::new();
    let mut buf = [0u8; 4096];
    let head_end = loop {
        let n = s.read(&mut buf).unwrap_or(0);
        if n == 0 {
            return;
        }
        raw.extend_from_slice(&buf[..n]);
        if let Some(p) = raw.windows(4).position(|w| w == b"\r\n\r\n") {
            break p;
        }
    };
    let head = String::from_utf8_lossy(&raw[..head_end]).into_owned();
    let len: usize = head
        .lines()
        .find_map(|l| {
            l.to_ascii_lowercase()
                .strip_prefix("content-length:")
                .map(|v| v.trim().parse().unwrap())
        })
        .unwrap_or(0);
    while raw.len() < head_end + 4 + len {
        let n = s.read(&mut buf).unwrap_or(0);
        if n == 0 {
            return;
        }
        raw.extend_from_slice(&buf[..n]);
    }
    let body = raw[head_end + 4..head_end + 4 + len].to_vec();
    let mut first = head.lines().next().unwrap().split_whitespace();
    let method = first.next().unwrap().to_string();
    let target = first.next().unwrap().to_string();
    let key = target
        .split_once("?key=")
        .map(|(_, k)| unescape(k))
        .unwrap_or_default();
    let (status, reply) = {
        let mut m = store.lock().unwrap();
        match method.as_str() {
            "GET" => match m.get(&key) {
                Some(v) => (200, v.clone()),
                None => (404, b"metadata not found".to_vec()),
            },
            "PUT" => {
                m.insert(key, body);
                (200, b"metadata updated".to_vec())
            }
            "DELETE" => match m.remove(&key) {
                Some(_) => (200, b"metadata deleted".to_vec()),
                None => (404, b"metadata not found".to_vec()),
            },
            _ => (405, Vec::new()),
        }
    };
    let _ = write!(
        s,
        "HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        reply.len()
    );
    let _ = s.write_all(&reply);
}

impl MetaServer {
    fn start() -> MetaServer {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let store: Store = Arc::default();
        let st = store.clone();
        std::thread::spawn(move || {
            for s in l.incoming().flatten() {
                let st = st.clone();
                std::thread::spawn(move || serve_one(s, &st));
            }
        });
        MetaServer { port, store }
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}/metadata", self.port)
    }

    fn get(&self, key: &str) -> Option<serde_json::Value> {
        self.store
            .lock()
            .unwrap()
            .get(key)
            .map(|v| serde_json::from_slice(v).unwrap())
    }
}

fn options() -> EngineOptions {
    EngineOptions {
        transfer_timeout: Duration::from_secs(10),
        ..EngineOptions::default()
    }
}

fn engine(meta: &MetaServer, name: &str) -> TransferEngine {
    let e = TransferEngine::with_options(options());
    e.initialize(name, &meta.url(), "tcp", "").unwrap();
    e
}

fn name(tag: u32) -> String {
    // Unique per test so parallel tests sharing nothing never collide on keys.
    format!(
        "127.0.0.1:{}",
        20000 + (std::process::id() % 4000) * 10 + tag
    )
}

#[test]
fn engine_http_random_round_trips_every_byte() {
    let _env = common::env_lock();
    let meta = MetaServer::start();
    let (na, nb) = (name(0), name(1));
    let a = engine(&meta, &na);
    let b = engine(&meta, &nb);
    const LEN: usize = 24 << 20;
    let local = Buf::new(LEN, 0);
    let remote = Buf::new(LEN, 0);
    local.register(&a);
    remote.register(&b);

    // Descriptors are where upstream keeps them, in upstream's shape.
    let d = meta.get(&format!("mooncake/ram/{nb}")).unwrap();
    assert_eq!(d["name"], nb.as_str());
    assert_eq!(d["protocol"], "tcp");
    assert_eq!(d["tcp_data_port"], b.data_port());
    assert_eq!(d["buffers"][0]["addr"], remote.addr());
    assert_eq!(d["buffers"][0]["length"], LEN as u64);
    let r = meta.get(&format!("mooncake/rpc_meta/{nb}")).unwrap();
    assert_eq!(r["ip_or_host_name"], "127.0.0.1");
    assert_eq!(r["rpc_port"], b.rpc_port());
    assert!((15000..=17000).contains(&b.rpc_port()));
    assert_eq!(a.get_first_buffer_address(&nb).unwrap(), remote.addr());

    let mut rng = rng();
    let mut sizes = vec![1usize, 7, 4095, 4096, 65537, (4 << 20) + 3, 9 << 20];
    sizes.extend((0..40).map(|_| rng.gen_range(1..=512 * 1024)));
    for len in sizes {
        let lo = rng.gen_range(0..=LEN / 2 - len);
        let ro = rng.gen_range(0..=LEN - len);
        let mut data = vec![0u8; len];
        rng.fill_bytes(&mut data);
        // SAFETY: inside the registered Vec; no transfer is running.
        unsafe {
            std::ptr::copy_nonoverlapping(data.as_ptr(), (local.addr() as *mut u8).add(lo), len)
        };
        a.transfer_sync(
            &nb,
            local.addr() + lo as u64,
            remote.addr() + ro as u64,
            len as u64,
            Opcode::Write,
        )
        .unwrap();
        assert!(
            remote.bytes()[ro..ro + len] == data[..],
            "peer bytes after write of {len}"
        );
        let back = LEN / 2 + rng.gen_range(0..=LEN / 2 - len);
        a.transfer_sync(
            &nb,
            local.addr() + back as u64,
            remote.addr() + ro as u64,
            len as u64,
            Opcode::Read,
        )
        .unwrap();
        assert!(
            local.bytes()[back..back + len] == data[..],
            "read back of {len}"
        );
    }
    drop(a);
    drop(b);
}

#[test]
fn engine_http_batch_reports_each_request() {
    let _env = common::env_lock();
    let meta = MetaServer::start();
    let (na, nb) = (name(2), name(3));
    let a = engine(&meta, &na);
    let b = engine(&meta, &nb);
    let local = Buf::new(1 << 20, 0xAB);
    let unregistered = Buf::new(4096, 0xCD);
    // The peer registers only the middle of its buffer.
    let remote = Buf::new(3 << 16, 0x11);
    local.register(&a);
    // SAFETY: as Buf::register.
    unsafe { b.register_memory(remote.addr() + (1 << 16), 1 << 16, "*") }.unwrap();
    let base = remote.addr() + (1 << 16);

    let h = a.open_segment(&nb).unwrap();
    assert_ne!(h, SegmentHandle::LOCAL);
    assert_eq!(a.open_segment(&nb).unwrap(), h, "cached");
    let req = |source, target_offset, length| TransferRequest {
        opcode: Opcode::Write,
        source,
        target: h,
        target_offset,
        length,
    };
    let batch = a.allocate_batch(8).unwrap();
    assert_ne!(batch, 0);
    a.submit(
        batch,
        vec![
            req(local.addr(), base, 4096),
            req(unregistered.addr(), base + 8192, 4096), // local not registered
            req(local.addr(), base + (1 << 16) - 10, 20), // runs past the peer's buffer
            req(local.addr(), base - 1, 2),              // starts before it
            req(local.addr(), base + 4096, 0),           // zero length: completes
            req(local.addr() + 4096, base + 12288, 1000),
        ],
    )
    .unwrap();
    let overall = a.wait_batch(batch).unwrap();
    assert_eq!(overall.status, TransferStatus::Failed);
    let expect = [
        (TransferStatus::Completed, None),
        (TransferStatus::Failed, Some(-3)),
        (TransferStatus::Failed, Some(-3)),
        (TransferStatus::Failed, Some(-3)),
        (TransferStatus::Completed, None),
        (TransferStatus::Completed, None),
    ];
    for (i, (st, code)) in expect.iter().enumerate() {
        let r = a.report(batch, i).unwrap();
        assert_eq!((r.status, r.error_code), (*st, *code), "request {i}");
        assert_eq!(a.status(batch, i).unwrap(), *st);
    }
    assert!(a.status(batch, 6).is_err());
    // Too many for the capacity; then free.
    let err = a
        .submit(batch, vec![req(local.addr(), base, 1); 3])
        .unwrap_err();
    assert_eq!(err.code(), TeError::TooManyRequests);
    a.free_batch(batch).unwrap();
    assert!(a.status(batch, 0).is_err());

    // Peer memory: written where allowed, untouched elsewhere (including outside its buffer).
    let d = &remote.bytes();
    assert!(
        d[..1 << 16].iter().all(|&x| x == 0x11),
        "before the buffer untouched"
    );
    assert!(
        d[2 << 16..].iter().all(|&x| x == 0x11),
        "after the buffer untouched"
    );
    let m = &d[1 << 16..2 << 16];
    assert!(m[..4096].iter().all(|&x| x == 0xAB));
    assert!(
        m[8192..12288].iter().all(|&x| x == 0x11),
        "unregistered source never sent"
    );
    assert!(m[12288..13288].iter().all(|&x| x == 0xAB));
    assert!(m[13288..].iter().all(|&x| x == 0x11));

    // The synchronous path refuses the same way, with the code.
    let e = a
        .transfer_sync(&nb, unregistered.addr(), base, 16, Opcode::Write)
        .unwrap_err();
    assert_eq!(e.code(), TeError::AddressNotRegistered);
    let e = a
        .transfer_sync(&nb, local.addr(), base + (1 << 16), 1, Opcode::Read)
        .unwrap_err();
    assert_eq!(e.code(), TeError::AddressNotRegistered);
    // Unknown handle and batch.
    let bad = TransferRequest {
        target: SegmentHandle(999),
        ..req(local.addr(), base, 1)
    };
    let batch = a.allocate_batch(1).unwrap();
    assert_eq!(
        a.submit(batch, vec![bad]).unwrap_err().code(),
        TeError::InvalidArgument
    );
    assert!(a.submit(12345678, vec![]).is_err());
    drop(b);
    drop(a);
}

#[test]
fn engine_http_unknown_peer_probe_notify_and_shutdown() {
    let _env = common::env_lock();
    let meta = MetaServer::start();
    let (na, nb) = (name(4), name(5));
    let a = engine(&meta, &na);
    let b = engine(&meta, &nb);
    let local = Buf::new(4096, 1);
    local.register(&a);

    let e = a.open_segment("10.255.255.1:1").unwrap_err();
    assert_eq!(e.code(), TeError::Metadata, "{e}");
    let e = a
        .transfer_sync("nobody:1", local.addr(), 0, 1, Opcode::Write)
        .unwrap_err();
    assert_eq!(e.code(), TeError::Metadata);
    assert_eq!(
        a.send_probe("nobody:1").unwrap_err().code(),
        TeError::Metadata
    );
    assert_eq!(
        a.get_first_buffer_address("nobody:1").unwrap_err().code(),
        TeError::Metadata
    );

    a.send_probe(&nb).unwrap();
    a.send_notify(&nb, "kv", "layer 3 done").unwrap();
    a.send_notify(&nb, "kv", "layer 4 done").unwrap();
    assert_eq!(
        b.get_notifies(),
        vec![
            ("kv".to_string(), "layer 3 done".to_string()),
            ("kv".to_string(), "layer 4 done".to_string())
        ]
    );
    assert!(b.get_notifies().is_empty(), "drained");
    assert!(a.get_notifies().is_empty());

    // Unregister: -3 for an unknown address; the descriptor follows registrations.
    assert_eq!(
        a.unregister_memory(local.addr() + 1).unwrap_err().code(),
        TeError::AddressNotRegistered
    );
    // SAFETY: as Buf::register.
    let e = unsafe { a.register_memory(local.addr() + 10, 10, "*") }.unwrap_err();
    assert_eq!(e.code(), TeError::AddressOverlapped);
    a.unregister_memory(local.addr()).unwrap();
    let d = meta.get(&format!("mooncake/ram/{na}")).unwrap();
    assert_eq!(d["buffers"].as_array().unwrap().len(), 0);
    let e = a
        .transfer_sync(&na, local.addr(), local.addr(), 1, Opcode::Write)
        .unwrap_err();
    assert_eq!(e.code(), TeError::AddressNotRegistered);

    // Shutdown removes both keys; the peer then is unknown.
    drop(b);
    assert!(meta.get(&format!("mooncake/ram/{nb}")).is_none());
    assert!(meta.get(&format!("mooncake/rpc_meta/{nb}")).is_none());
    assert_eq!(a.send_probe(&nb).unwrap_err().code(), TeError::Metadata);
}

#[test]
fn engine_http_self_transfer_and_managed_buffers() {
    let _env = common::env_lock();
    let meta = MetaServer::start();
    let (na, nb) = (name(6), name(7));
    let a = engine(&meta, &na);
    let b = engine(&meta, &nb);
    assert_eq!(a.open_segment(&na).unwrap(), SegmentHandle::LOCAL);
    let buf = Buf::new(8192, 0);
    buf.register(&a);
    // SAFETY: inside the registered Vec; no transfer is running.
    unsafe { std::ptr::write_bytes(buf.addr() as *mut u8, 7, 100) };
    a.transfer_sync(&na, buf.addr(), buf.addr() + 4096, 100, Opcode::Write)
        .unwrap();
    assert!(buf.bytes()[4096..4196].iter().all(|&x| x == 7));
    a.transfer_sync(&na, buf.addr() + 5000, buf.addr(), 50, Opcode::Read)
        .unwrap();
    assert!(buf.bytes()[5000..5050].iter().all(|&x| x == 7));
    let outside = Buf::new(64, 9);
    let e = a
        .transfer_sync(&na, buf.addr(), outside.addr(), 64, Opcode::Write)
        .unwrap_err();
    assert_eq!(e.code(), TeError::AddressNotRegistered);
    assert!(
        outside.bytes().iter().all(|&x| x == 9),
        "self target outside registration untouched"
    );

    // Managed buffers on the peer, written and read through the engine.
    let small = b.allocate_managed_buffer(4096).unwrap();
    let big = b.allocate_managed_buffer(5 << 20).unwrap();
    assert_ne!(small, 0);
    let d = meta.get(&format!("mooncake/ram/{nb}")).unwrap();
    assert_eq!(
        d["buffers"].as_array().unwrap().len(),
        2,
        "a pool and a dedicated segment"
    );
    for (remote, len) in [(small, 4096usize), (big, 5 << 20)] {
        let src = Buf::new(len, 0);
        src.register(&a);
        // SAFETY: inside the registered Vec; no transfer is running.
        unsafe {
            for i in 0..len {
                *(src.addr() as *mut u8).add(i) = (i % 251) as u8;
            }
        }
        a.transfer_sync(&nb, src.addr(), remote, len as u64, Opcode::Write)
            .unwrap();
        let dst = Buf::new(len, 0);
        dst.register(&a);
        a.transfer_sync(&nb, dst.addr(), remote, len as u64, Opcode::Read)
            .unwrap();
        assert!(dst.bytes() == src.bytes());
        a.unregister_memory(src.addr()).unwrap();
        a.unregister_memory(dst.addr()).unwrap();
    }
    b.free_managed_buffer(big, 5 << 20).unwrap();
    b.free_managed_buffer(small, 4096).unwrap();
    assert_eq!(
        b.free_managed_buffer(small, 4096).unwrap_err().code(),
        TeError::AddressNotRegistered
    );
    let local = Buf::new(16, 0);
    local.register(&a);
    let e = a
        .transfer_sync(&nb, local.addr(), big, 16, Opcode::Read)
        .unwrap_err();
    assert_eq!(
        e.code(),
        TeError::AddressNotRegistered,
        "a freed dedicated buffer is gone"
    );
    drop(a);
    drop(b);
}

#[test]
fn engine_refuses_bad_arguments() {
    let _env = common::env_lock();
    // (etcd metadata: tests/engine_etcd.rs.)
    let e = TransferEngine::with_options(options());
    assert_eq!(
        e.initialize("127.0.0.1:1", "redis://127.0.0.1:6379", "tcp", "")
            .unwrap_err()
            .code(),
        TeError::NotImplemented
    );
    assert_eq!(
        e.initialize("127.0.0.1:1", "P2PHANDSHAKE", "nvlink", "")
            .unwrap_err()
            .code(),
        TeError::NotImplemented
    );
    // Not initialized: calls fail cleanly.
    assert!(e.open_segment("x:1").is_err());
    assert!(e.allocate_batch(1).is_err());
    assert_eq!(e.rpc_port(), 0);
    // Metadata server down: initialize fails with a socket error.
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let err = e
        .initialize(
            "127.0.0.1:1",
            &format!("http://127.0.0.1:{port}/metadata"),
            "tcp",
            "",
        )
        .unwrap_err();
    assert_eq!(err.code(), TeError::Socket, "{err}");
}

#[test]
fn engine_http_peer_restart_is_followed() {
    let _env = common::env_lock();
    let meta = MetaServer::start();
    let (na, nb) = (name(8), name(9));
    let a = engine(&meta, &na);
    let local = Buf::new(4096, 3);
    local.register(&a);
    let remote = Buf::new(4096, 0);
    let b = engine(&meta, &nb);
    remote.register(&b);
    a.transfer_sync(&nb, local.addr(), remote.addr(), 4096, Opcode::Write)
        .unwrap();
    let old_port = b.data_port();
    drop(b);
    assert!(a
        .transfer_sync(&nb, local.addr(), remote.addr(), 1, Opcode::Write)
        .is_err());
    // Same name, new ports: the cached handle fetches the new descriptor.
    let b = engine(&meta, &nb);
    remote.register(&b);
    assert_ne!(b.data_port(), old_port);
    a.transfer_sync(&nb, local.addr(), remote.addr(), 4096, Opcode::Read)
        .unwrap();
    drop(b);
    drop(a);
}

/// `protocol="rdma"` over the software verbs model with the HTTP metadata store: the
/// descriptor in the store is upstream's RDMA shape (devices with GID and LID, one rkey and
/// lkey per device per buffer, priority matrix) and transfers use it.
#[test]
fn engine_http_rdma_descriptor_and_transfers() {
    let _env = common::env_lock();
    let fabric = std::env::temp_dir().join(format!("mc-rdma-http-{}", std::process::id()));
    std::env::set_var("MOONCAKE_RDMA_SIM", &fabric);
    std::env::remove_var("MC_FORCE_TCP");
    let meta = MetaServer::start();
    let (na, nb) = (name(7), name(8));
    let mk = |n: &str| {
        let e = TransferEngine::with_options(options());
        e.initialize(n, &meta.url(), "rdma", "").unwrap();
        e
    };
    let a = mk(&na);
    let b = mk(&nb);
    assert_eq!(a.rdma_verbs(), Some("sim"));
    const LEN: usize = 1 << 20;
    let local = Buf::new(LEN, 0);
    let remote = Buf::new(LEN, 0);
    local.register(&a);
    remote.register(&b);
    let d = meta.get(&format!("mooncake/ram/{nb}")).unwrap();
    assert_eq!(d["protocol"], "rdma");
    let devs = d["devices"].as_array().unwrap();
    assert_eq!(devs.len(), 2);
    assert_eq!(devs[0]["name"], "sim0");
    assert_eq!(devs[0]["gid"].as_str().unwrap().split(':').count(), 16);
    assert_eq!(d["buffers"][0]["addr"], remote.addr());
    assert_eq!(d["buffers"][0]["rkey"].as_array().unwrap().len(), 2);
    assert_eq!(d["buffers"][0]["lkey"].as_array().unwrap().len(), 2);
    assert!(d["priority_matrix"]["*"][0].as_array().unwrap().len() == 2);
    assert_eq!(d["tcp_data_port"], b.data_port());

    let mut r = rng();
    let mut data = vec![0u8; LEN];
    r.fill_bytes(&mut data);
    local.fill(0, &data);
    a.transfer_sync(&nb, local.addr(), remote.addr(), LEN as u64, Opcode::Write)
        .unwrap();
    assert!(remote.bytes() == data);
    local.fill(0, &vec![0u8; LEN]);
    a.transfer_sync(
        &nb,
        local.addr() + 100,
        remote.addr() + 7,
        5000,
        Opcode::Read,
    )
    .unwrap();
    assert!(local.bytes()[100..5100] == data[7..5007]);
    let posted = a
        .rdma_transport()
        .unwrap()
        .stats()
        .wrs_posted
        .load(std::sync::atomic::Ordering::Relaxed);
    assert!(posted >= 17, "{posted}");
    // Unregistration republishes without the buffer; its rkeys stop working at the peer.
    b.unregister_memory(remote.addr()).unwrap();
    let d = meta.get(&format!("mooncake/ram/{nb}")).unwrap();
    assert!(d["buffers"].as_array().unwrap().is_empty());
    drop((a, b));
    let _ = std::fs::remove_dir_all(&fabric);
}
