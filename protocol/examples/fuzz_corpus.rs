//! Writes a seed corpus for `fuzz/fuzz_targets/control_frame.rs`: one well-formed request
//! frame per operation, so the fuzzer starts from inputs that reach every decoder.
//!
//! Usage: `cargo run -p mooncake-protocol --example fuzz_corpus -- fuzz/seeds/control_frame`

use protocol::frame::{encode_with, Kind};
use protocol::message::*;
use protocol::*;

fn frame<R: Rpc>(r: &R) -> (String, Vec<u8>) {
    let mut out = Vec::new();
    encode_with(&mut out, Kind::Request, R::OP, 7, |b| r.encode(b)).unwrap();
    (R::NAME.to_string(), out)
}

fn main() {
    let dir = std::env::args().nth(1).expect("usage: fuzz_corpus <dir>");
    std::fs::create_dir_all(&dir).unwrap();
    let id = Uuid::from_parts(1, 2);
    let cfg = ReplicateConfig {
        replica_num: 2,
        soft_pin_action: SoftPinAction::Enable,
        soft_pin_ttl_ms: Some(1000),
        preferred_segments: vec!["127.0.0.1:1".into()],
        ..Default::default()
    };
    let seg = Segment {
        id,
        name: "127.0.0.1:12345".into(),
        base: 1 << 40,
        size: 1 << 26,
        te_endpoint: "127.0.0.1:15000".into(),
        protocol: "tcp".into(),
        host_id: "h".into(),
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
    ];
    for (name, bytes) in frames {
        std::fs::write(format!("{dir}/{name}"), bytes).unwrap();
    }
}
