//! Fuzzes the same-host segment offer decoder (`dataplane::mem::shm::Offer`), the 24 bytes an
//! importer receives with a memfd. Nothing may panic; an offer that decodes has a non-empty
//! range that does not wrap, and re-encodes to exactly the bytes it came from.
#![no_main]

use dataplane::mem::shm::{Offer, OFFER_BYTES};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(o) = Offer::decode(data) {
        assert!(o.len > 0 && o.base.checked_add(o.len).is_some(), "{o:?}");
        assert_eq!(data.len(), OFFER_BYTES);
        assert_eq!(&o.encode()[..], data, "not canonical");
    }
});
