//! Fuzzes the transfer-engine descriptor decoders (`dataplane::metadata::desc`): arbitrary
//! bytes as a `mooncake/ram/<name>` segment descriptor and as a `mooncake/rpc_meta/<name>`
//! entry. Nothing may panic; what decodes re-encodes and decodes to the same value.
#![no_main]

use dataplane::metadata::desc::{RpcMeta, SegmentDesc};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(d) = SegmentDesc::from_json(data) {
        let again = SegmentDesc::from_json(&d.to_json()).expect("re-encoded descriptor decodes");
        assert_eq!(again, d);
    }
    if let Ok(m) = RpcMeta::from_json(data) {
        assert_eq!(RpcMeta::from_json(&m.to_json()).expect("re-encoded entry decodes"), m);
    }
});
