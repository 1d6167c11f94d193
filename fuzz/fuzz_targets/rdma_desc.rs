//! Fuzzes the RDMA metadata decoders (`dataplane::metadata::rdma_desc`): arbitrary bytes as
//! an RDMA segment descriptor and as a handshake `Connection` body, and the software verbs
//! model's shared records (`transport::rdma::sim`: `mr-*`, `qp-*` files). Nothing may panic;
//! what decodes re-encodes and decodes to the same value.
#![no_main]

use dataplane::metadata::rdma_desc::{ConnectBody, Gid, RdmaSegmentDesc};
use dataplane::transport::rdma::sim::{MrRecord, QpRecord};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(d) = RdmaSegmentDesc::from_json(data) {
        let again = RdmaSegmentDesc::from_json(&d.to_json()).expect("re-encoded descriptor decodes");
        assert_eq!(again, d);
        if let Some(b) = d.buffers.first() {
            let _ = d.buffer_covering(b.addr, b.length);
        }
    }
    if let Ok(c) = ConnectBody::from_json(data) {
        assert_eq!(ConnectBody::from_json(&c.to_json()).expect("re-encoded body decodes"), c);
    }
    if let Ok(m) = MrRecord::decode(data) {
        assert_eq!(MrRecord::decode(&m.encode()).expect("re-encoded MR decodes"), m);
        let _ = m.covers(m.addr, m.length);
    }
    if let Ok(q) = QpRecord::decode(data) {
        assert_eq!(QpRecord::decode(&q.encode()).expect("re-encoded QP decodes"), q);
    }
    if let Ok(text) = std::str::from_utf8(data) {
        if let Ok(g) = Gid::parse(text) {
            assert_eq!(Gid::parse(&g.to_text()).expect("re-encoded GID parses"), g);
        }
    }
});
