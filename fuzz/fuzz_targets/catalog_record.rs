//! Fuzzes the decoder of a `CATALOG_PUT` record (`dataplane::recovery::CatalogRecord`): nothing
//! may panic; a record that decodes has a key of 1 ..= `KEY_MAX_BYTES` bytes and a length
//! above 0, and survives an encode/decode round trip (a record without a version decodes as
//! version 0.0 and re-encodes with it, so the bytes may grow, never the meaning).
#![no_main]

use dataplane::recovery::{CatalogRecord, RecordKind};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(r) = CatalogRecord::decode(data) {
        assert!(!r.key.is_empty() && r.key.len() <= protocol::limits::KEY_MAX_BYTES);
        assert!(r.len > 0);
        // Only an object or a commit carries a pin (a tombstone, an intent or a provisional
        // record none).
        assert!(
            matches!(r.kind, RecordKind::Object | RecordKind::Commit(_))
                || !(r.hard_pin || r.soft_pin_ttl_ms.is_some())
        );
        let again = r.encode();
        assert_eq!(CatalogRecord::decode(&again), Ok(r), "round trip");
    }
});
