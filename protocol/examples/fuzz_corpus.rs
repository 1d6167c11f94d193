//! Writes a seed corpus for `fuzz/fuzz_targets/control_frame.rs`: one well-formed request
//! frame per operation, so the fuzzer starts from inputs that reach every decoder.
//!
//! Usage: `cargo run -p mooncake-protocol --example fuzz_corpus -- fuzz/seeds/control_frame`

use protocol::frame::{encode_with, Kind};
use protocol::message::*;
use protocol::wire::Wire;
use protocol::*;

fn frame<R: Rpc>(r: &R) -> (String, Vec<u8>) {
    let mut out = Vec::new();
    encode_with(&mut out, Kind::Request, R::OP, 7, |b| r.encode(b)).unwrap();
    (R::NAME.to_string(), out)
}

/// A frame whose body is a successful answer carrying `value`.
fn answer<T: Wire>(op: u16, name: &str, value: &T) -> (String, Vec<u8>) {
    let mut out = Vec::new();
    encode_with(&mut out, Kind::Response, op, 7, |b| {
        0i32.encode(b);
        value.encode(b);
    })
    .unwrap();
    (name.to_string(), out)
}

/// A replication config with every field set.
fn config() -> ReplicateConfig {
    ReplicateConfig {
        replica_num: 2,
        soft_pin_action: SoftPinAction::Enable,
        soft_pin_ttl_ms: Some(1000),
        preferred_segments: vec!["127.0.0.1:1".into()],
        ..Default::default()
    }
}

fn main() {
    let dir = std::env::args().nth(1).expect("usage: fuzz_corpus <dir>");
    std::fs::create_dir_all(&dir).unwrap();
    let id = Uuid::from_parts(1, 2);
    let cfg = config();
    let seg = Segment {
        id,
        name: "127.0.0.1:12345".into(),
        base: 1 << 40,
        size: 1 << 26,
        te_endpoint: "127.0.0.1:15000".into(),
        protocol: "tcp".into(),
        host_id: "h".into(),
        ..Default::default()
    };
    let keys = vec!["a".to_string(), "bb".to_string()];
    let held = HeldObject {
        key: "k".into(),
        size: 9,
        segment_name: seg.name.clone(),
        buffer_address: 1 << 40,
        with_hard_pin: false,
        version: Version { term: 5, seq: 9 },
        soft_pin_ttl_ms: Some(60_000),
    };
    let tombstone = HeldObject {
        key: "gone".into(),
        size: 0,
        buffer_address: 0,
        soft_pin_ttl_ms: None,
        ..held.clone()
    };
    let frames = vec![
        frame(&Ping { client_id: id }),
        frame(&MountSegment {
            client_id: id,
            segment: seg.clone(),
        }),
        frame(&ReMountSegment {
            client_id: id,
            segments: vec![seg],
            held: vec![held, tombstone],
        }),
        frame(&ReMountDone { client_id: id }),
        frame(&UnmountSegment {
            client_id: id,
            segment_id: id,
        }),
        frame(&PutStart {
            client_id: id,
            key: "k".into(),
            size: 4096,
            config: cfg.clone(),
        }),
        frame(&PutEnd {
            client_id: id,
            key: "k".into(),
        }),
        frame(&GetReplicaList { key: "k".into() }),
        frame(&RemoveByRegex {
            pattern: "^k.*".into(),
            force: true,
        }),
        frame(&BatchPutStart {
            client_id: id,
            keys: keys.clone(),
            sizes: vec![1, 2],
            config: cfg,
        }),
        // The target also decodes each body as its opcode's answer: here `UpsertStarted`s.
        frame(&BatchUpsertStart {
            client_id: id,
            keys: keys.clone(),
            sizes: vec![1, 2],
            config: ReplicateConfig::default(),
        }),
        frame(&BatchExistKey { keys: keys.clone() }),
        frame(&Tenanted {
            tenant: "ta".into(),
            inner: BatchExistKey { keys: keys.clone() },
        }),
        frame(&BatchReplicaClear {
            client_id: id,
            keys: keys.clone(),
            segment_name: "seg".into(),
        }),
        frame(&BatchRemove { keys, force: false }),
        frame(&CreateCopyTask {
            key: "k".into(),
            targets: vec!["127.0.0.1:1".into(), "127.0.0.1:2".into()],
        }),
        frame(&CreateMoveTask {
            key: "k".into(),
            source: "127.0.0.1:1".into(),
            target: "127.0.0.1:2".into(),
        }),
        frame(&QueryTask { task_id: id }),
        frame(&FetchTasks { client_id: id }),
        frame(&CompleteTask {
            client_id: id,
            task_id: id,
            ok: false,
            message: "transfer failed".into(),
        }),
    ];
    // Answers whose decoders the requests above do not reach (`validate_response` reads each
    // body as its opcode's answer): a fetched task and a task's state.
    let replica = ReplicaDescriptor {
        status: ReplicaStatus::Complete,
        medium: protocol::ReplicaMedium::Memory,
        segment_name: "127.0.0.1:1".into(),
        transport_endpoint: "127.0.0.1:15000".into(),
        buffer_address: 1 << 40,
        size: 9,
        version: Version { term: 5, seq: 9 },
    };
    let work = TaskWork {
        task_id: id,
        key: "k".into(),
        // A disk replica too: its medium rides in the status byte's high nibble.
        sources: vec![
            replica.clone(),
            ReplicaDescriptor {
                medium: protocol::ReplicaMedium::LocalDisk,
                ..replica.clone()
            },
        ],
        targets: vec![replica.clone()],
        with_hard_pin: false,
        soft_pin_ttl_ms: Some(1000),
    };
    let info = TaskInfo {
        id,
        task_type: TaskType::ReplicaMove,
        status: TaskStatus::Success,
        created_at_ms_epoch: 1,
        last_updated_at_ms_epoch: 2,
        assigned_client: id,
        message: String::new(),
    };
    let mut frames = frames;
    frames.extend(reserved_put_frames(id, &replica));
    frames.push(answer(FetchTasks::OP, "FetchTasksAnswer", &vec![work]));
    frames.push(answer(QueryTask::OP, "QueryTaskAnswer", &info));
    for (name, bytes) in frames {
        std::fs::write(format!("{dir}/{name}"), bytes).unwrap();
    }
}

/// A put in one round trip: the reservation, its commit, and the commit's answer (its version
/// and the next reservation).
fn reserved_put_frames(id: Uuid, replica: &ReplicaDescriptor) -> Vec<(String, Vec<u8>)> {
    let committed = ReservedCommit {
        version: Version { term: 5, seq: 10 },
        next: Some(replica.clone()),
    };
    vec![
        frame(&ReservePut {
            client_id: id,
            size: 4096,
            host_id: "127.0.0.1".into(),
        }),
        frame(&CommitReservedPut {
            client_id: id,
            key: "k".into(),
            reserved: replica.clone(),
            next_host_id: "127.0.0.1".into(),
        }),
        answer(CommitReservedPut::OP, "CommitReservedPutAnswer", &committed),
    ]
}
