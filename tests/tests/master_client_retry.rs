//! A client following an HA leader leaves a connection whose master answered "not now"
//! (`client::master`, `forget`): a standby, a leader that cannot prove its lease, or a new
//! leader's recovery fence. Calls other threads still have in flight on that connection must
//! get their own answers there, not be failed and sent again: the master may still execute the
//! first copy, which is in its socket, after the second. A put's start executed twice in that
//! order moved the put to buffers its writer never heard of, and the seed-1 reproduction of
//! violation 2 read another writer's bytes through them (`docs/reliability.md`).
//!
//! The leader here is a stand-in speaking the master's frames, so that one answer can be held
//! back while another is given: it answers a lookup "not now" once and holds a start's answer
//! for 600 ms, counting the starts it receives.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use client::dataplane::metadata::etcd::{parse_endpoints, EtcdStore};
use client::dataplane::metadata::MetadataStore;
use client::MasterClient;
use mooncake_tests::Etcd;
use protocol::frame::{self, Kind};
use protocol::message::*;
use protocol::wire::Wire;
use protocol::*;

const CLUSTER: &str = "retry-test";

/// What the stand-in leader has seen.
#[derive(Default)]
struct Seen {
    starts: AtomicUsize,
    lookups: AtomicUsize,
}

/// Answers one request (its frame already read) on `out`, from a thread of its own.
fn answer(out: &Mutex<TcpStream>, seen: &Seen, opcode: u16, id: u64) {
    let body = if opcode == UpsertStart::OP {
        seen.starts.fetch_add(1, Ordering::SeqCst);
        std::thread::sleep(Duration::from_millis(600));
        Result::<UpsertStarted, ErrorCode>::Ok(UpsertStarted {
            replicas: Vec::new(),
            soft_pin_ttl_ms: None,
        })
        .to_bytes()
    } else if opcode == GetReplicaList::OP {
        let first = seen.lookups.fetch_add(1, Ordering::SeqCst) == 0;
        let code = if first {
            ErrorCode::UnavailableInCurrentStatus
        } else {
            ErrorCode::ObjectNotFound
        };
        Result::<ReplicaList, ErrorCode>::Err(code).to_bytes()
    } else {
        Result::<(), ErrorCode>::Err(ErrorCode::InvalidParams).to_bytes()
    };
    let mut frame = Vec::new();
    frame::encode_with(&mut frame, Kind::Response, opcode, id, |b| {
        b.extend_from_slice(&body)
    })
    .unwrap();
    // The client may have closed this connection: nothing to do then.
    let _ = out.lock().unwrap().write_all(&frame);
}

/// Serves one connection until the client closes it, each request on a thread of its own.
fn serve(stream: TcpStream, seen: Arc<Seen>) {
    let out = Arc::new(Mutex::new(stream.try_clone().unwrap()));
    let mut stream = stream;
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        let n = match stream.read(&mut chunk) {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        buf.extend_from_slice(&chunk[..n]);
        let mut used = 0;
        while let Ok(Some((f, len))) = frame::split_frame(&buf[used..]) {
            let (opcode, id) = (f.header.opcode, f.header.request_id);
            let (out, seen) = (out.clone(), seen.clone());
            std::thread::spawn(move || answer(&out, &seen, opcode, id));
            used += len;
        }
        buf.drain(..used);
    }
}

#[test]
fn a_call_in_flight_is_not_sent_again_when_another_leaves_its_connection() {
    let Some(etcd) = Etcd::start() else {
        eprintln!("skipping: Debian's etcd-server is not installed");
        return;
    };
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let leader = listener.local_addr().unwrap();
    let seen = Arc::new(Seen::default());
    {
        let seen = seen.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let seen = seen.clone();
                std::thread::spawn(move || serve(stream, seen));
            }
        });
    }
    EtcdStore::new(parse_endpoints(&etcd.addr()).unwrap())
        .put(
            &format!("mooncake-store/{CLUSTER}/master_view"),
            leader.to_string().as_bytes(),
        )
        .unwrap();
    let c = Arc::new(
        MasterClient::new_in_cluster(&format!("etcd://{}", etcd.addr()), CLUSTER).unwrap(),
    );

    let writer = {
        let c = c.clone();
        std::thread::spawn(move || {
            c.call(&UpsertStart {
                client_id: Uuid::from_parts(1, 1),
                key: "k".into(),
                size: 4096,
                config: ReplicateConfig::default(),
            })
        })
    };
    // The start is in flight (its answer held back) when the lookup is answered "not now",
    // and the lookup's thread leaves the connection to ask again.
    std::thread::sleep(Duration::from_millis(150));
    let looked_up = c.call(&GetReplicaList { key: "x".into() }).unwrap();
    assert_eq!(looked_up, Err(ErrorCode::ObjectNotFound));
    assert_eq!(seen.lookups.load(Ordering::SeqCst), 2);

    let started = writer.join().unwrap();
    assert!(
        matches!(started, Ok(Ok(_))),
        "the start's own answer: {started:?}"
    );
    assert_eq!(
        seen.starts.load(Ordering::SeqCst),
        1,
        "the start was sent again while its first copy was in flight"
    );
}
