//! The payload decoded back with `rmpv`: field names, msgpack types and the options.

use rmpv::Value;

use super::super::{Event, Kind, Medium};
use super::{encode_batch, parse_hash, EncodeOptions};

fn opts(legacy: bool, object_key: bool) -> EncodeOptions {
    EncodeOptions {
        backend_id: "pool-a".into(),
        default_tenant: "default".into(),
        dp_rank: 3,
        legacy,
        object_key,
    }
}

fn event(kind: Kind, medium: Medium, key: &str) -> Event {
    Event {
        kind,
        medium,
        key: key.into(),
        group: None,
    }
}

/// Decodes a payload into (timestamp, events as name -> value lists, dp_rank).
fn decode(bytes: &[u8]) -> (Value, Vec<Vec<(String, Value)>>, Value) {
    let mut r = bytes;
    let v = rmpv::decode::read_value(&mut r).expect("valid msgpack");
    assert!(r.is_empty(), "trailing bytes");
    let Value::Array(top) = v else {
        panic!("payload is not an array: {v:?}")
    };
    assert_eq!(top.len(), 3);
    let Value::Array(events) = &top[1] else {
        panic!("events is not an array")
    };
    let events = events
        .iter()
        .map(|e| {
            let Value::Map(m) = e else {
                panic!("event is not a map")
            };
            m.iter()
                .map(|(k, v)| (k.as_str().expect("string key").to_string(), v.clone()))
                .collect()
        })
        .collect();
    (top[0].clone(), events, top[2].clone())
}

fn field<'a>(e: &'a [(String, Value)], name: &str) -> Option<&'a Value> {
    e.iter().find(|(k, _)| k == name).map(|(_, v)| v)
}

fn names(e: &[(String, Value)]) -> Vec<&str> {
    e.iter().map(|(k, _)| k.as_str()).collect()
}

#[test]
fn stored_event_has_every_field_of_the_reference_with_its_type() {
    let mut out = Vec::new();
    let e = event(Kind::Stored, Medium::Cpu, "12345");
    let non_hash = encode_batch(
        &opts(true, true),
        1_700_000_000_123,
        7,
        &[e.as_ref()],
        &mut out,
    );
    assert_eq!(non_hash, 0);
    let (ts, events, dp) = decode(&out);
    assert_eq!(ts.as_u64(), Some(1_700_000_000_123));
    assert_eq!(dp.as_u64(), Some(3));
    let e = &events[0];
    assert_eq!(
        names(e),
        [
            "event_id",
            "timestamp",
            "event_type",
            "type",
            "model_name",
            "block_size",
            "additional_salt",
            "lora_name",
            "dp_rank",
            "tenant_id",
            "backend_id",
            "group_id",
            "medium",
            "object_key",
            "seq_hashes",
            "block_hashes",
            "base_block_idx",
            "parent_hash",
            "token_ids",
            "parent_block_hash",
        ]
    );
    assert_eq!(field(e, "event_id").unwrap().as_u64(), Some(7));
    assert_eq!(
        field(e, "timestamp").unwrap().as_u64(),
        Some(1_700_000_000_123)
    );
    assert_eq!(field(e, "event_type").unwrap().as_str(), Some("stored"));
    assert_eq!(field(e, "type").unwrap().as_str(), Some("BlockStored"));
    for nil in [
        "model_name",
        "block_size",
        "additional_salt",
        "lora_name",
        "dp_rank",
        "group_id",
        "parent_hash",
        "token_ids",
        "parent_block_hash",
    ] {
        assert!(field(e, nil).unwrap().is_nil(), "{nil}");
    }
    assert_eq!(field(e, "tenant_id").unwrap().as_str(), Some("default"));
    assert_eq!(field(e, "backend_id").unwrap().as_str(), Some("pool-a"));
    assert_eq!(field(e, "medium").unwrap().as_str(), Some("cpu"));
    assert_eq!(field(e, "object_key").unwrap().as_str(), Some("12345"));
    assert_eq!(
        field(e, "seq_hashes").unwrap(),
        &Value::Array(vec![Value::from(12345u64)])
    );
    assert_eq!(
        field(e, "block_hashes").unwrap(),
        &Value::Array(vec![Value::from(12345i64)])
    );
    assert_eq!(field(e, "base_block_idx").unwrap().as_u64(), Some(0));
}

#[test]
fn removed_event_without_legacy_or_key() {
    let mut out = Vec::new();
    let mut e = event(Kind::Removed, Medium::Disk, "\0ta\0not-a-hash");
    e.group = Some("\0ta\0g1".into());
    let non_hash = encode_batch(&opts(false, false), 5, 1, &[e.as_ref()], &mut out);
    assert_eq!(non_hash, 1);
    let (_, events, _) = decode(&out);
    let e = &events[0];
    assert_eq!(
        names(e),
        [
            "event_id",
            "timestamp",
            "event_type",
            "model_name",
            "block_size",
            "additional_salt",
            "lora_name",
            "dp_rank",
            "tenant_id",
            "backend_id",
            "group_id",
            "medium",
            "seq_hashes",
            "base_block_idx",
        ]
    );
    assert_eq!(field(e, "event_type").unwrap().as_str(), Some("removed"));
    assert_eq!(field(e, "tenant_id").unwrap().as_str(), Some("ta"));
    assert_eq!(field(e, "group_id").unwrap().as_str(), Some("g1"));
    assert_eq!(field(e, "medium").unwrap().as_str(), Some("disk"));
    assert_eq!(field(e, "seq_hashes").unwrap(), &Value::Array(vec![]));
    assert!(field(e, "base_block_idx").unwrap().is_nil());
}

#[test]
fn legacy_removed_and_non_hash_keys_still_carry_the_key() {
    let mut out = Vec::new();
    let events = [
        event(Kind::Removed, Medium::Cpu, "0xFFFFFFFFFFFFFFFF"),
        event(Kind::Stored, Medium::Cpu, "layer0/block7"),
    ];
    let mut o = opts(true, true);
    o.default_tenant = "tenant-x".into();
    let refs: Vec<_> = events.iter().map(Event::as_ref).collect();
    let non_hash = encode_batch(&o, 5, 100, &refs, &mut out);
    assert_eq!(non_hash, 1);
    let (_, events, _) = decode(&out);
    let (a, b) = (&events[0], &events[1]);
    assert_eq!(field(a, "event_id").unwrap().as_u64(), Some(100));
    assert_eq!(field(b, "event_id").unwrap().as_u64(), Some(101));
    assert_eq!(field(a, "type").unwrap().as_str(), Some("BlockRemoved"));
    assert_eq!(field(a, "tenant_id").unwrap().as_str(), Some("tenant-x"));
    assert_eq!(
        field(a, "seq_hashes").unwrap(),
        &Value::Array(vec![Value::from(u64::MAX)])
    );
    // The legacy field is the same 64 bits, signed.
    assert_eq!(
        field(a, "block_hashes").unwrap(),
        &Value::Array(vec![Value::from(-1i64)])
    );
    assert!(field(a, "base_block_idx").unwrap().is_nil());
    assert!(field(a, "parent_block_hash").is_none());
    assert_eq!(
        field(b, "object_key").unwrap().as_str(),
        Some("layer0/block7")
    );
    assert_eq!(field(b, "seq_hashes").unwrap(), &Value::Array(vec![]));
    assert_eq!(field(b, "block_hashes").unwrap(), &Value::Array(vec![]));
}

#[test]
fn hashes_parse_from_decimal_and_hex_only() {
    let cases: &[(&str, Option<u64>)] = &[
        ("0", Some(0)),
        ("18446744073709551615", Some(u64::MAX)),
        ("18446744073709551616", None),
        ("0x0", Some(0)),
        ("0x1f", Some(31)),
        ("0XAbC", Some(0xabc)),
        ("0xffffffffffffffff", Some(u64::MAX)),
        ("0x1ffffffffffffffff", None),
        ("0x", None),
        ("0xg", None),
        ("", None),
        ("-1", None),
        ("+1", None),
        (" 1", None),
        ("1.5", None),
        ("12a", None),
        ("key-1", None),
        ("٣", None),
    ];
    for &(key, want) in cases {
        assert_eq!(parse_hash(key), want, "{key:?}");
    }
}
