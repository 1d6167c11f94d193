//! Fuzzes the decoder of etcd's JSON gateway answers (`dataplane::metadata::etcd`): arbitrary
//! bytes as a range/put/deleterange answer body, and as base64. Nothing may panic; a decoded
//! answer's keys and values must re-encode to base64 that decodes to the same bytes.
#![no_main]

use dataplane::metadata::{base64, etcd};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(answer) = etcd::decode_answer(data) {
        for (k, v) in &answer.kvs {
            assert_eq!(&base64::decode(&base64::encode(k)).unwrap(), k);
            assert_eq!(&base64::decode(&base64::encode(v)).unwrap(), v);
        }
    }
    let _ = etcd::decode_range(data, b"mooncake/ram/127.0.0.1:12345");
    if let Ok(text) = std::str::from_utf8(data) {
        if let Ok(bytes) = base64::decode(text) {
            // What decodes re-encodes to something that decodes to the same bytes.
            assert_eq!(base64::decode(&base64::encode(&bytes)).unwrap(), bytes);
        }
        let _ = etcd::parse_endpoints(text);
    }
});
