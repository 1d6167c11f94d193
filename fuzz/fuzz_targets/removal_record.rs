//! Fuzzes the decoder of the removal records a new leader reads from etcd
//! (`controlplane::service::removals`, `docs/ha.md`, "removals the owners have not heard of").
//!
//! Nothing may panic. A record that decodes encodes back to bytes that decode to the same
//! record, and its etcd key sorts as its version does.
#![no_main]

use controlplane::service::removals::Removal;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(r) = Removal::decode(data) else {
        return;
    };
    let again = Removal::decode(&r.encode()).expect("our own encoding decodes");
    assert_eq!(again, r);
    let key = r.etcd_key("p/");
    assert_eq!(key.len(), "p/".len() + 20 + 1 + 20, "{key}");
});
