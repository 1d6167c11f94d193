//! Fuzzes the master admin router's quota parsing (`controlplane::http::admin`): arbitrary
//! bytes as the `tenant_id` query string and as a quota `PUT` body. Nothing may panic; a
//! tenant that is accepted is a valid tenant name and survives URL encoding, and a body's
//! quota is what its JSON says (0 when absent).
#![no_main]

use controlplane::http::admin::{quota_body, tenant_param};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        if let Ok(Some(t)) = tenant_param(Some(text)) {
            assert!(protocol::tenant::valid_tenant(&t), "accepted {t:?}");
        }
        // Any text as a tenant name: accepted back exactly when it is valid.
        let query = form_urlencoded::Serializer::new(String::new())
            .append_pair("tenant_id", text)
            .finish();
        match tenant_param(Some(&query)) {
            Ok(got) => assert_eq!(got.as_deref(), Some(text)),
            Err(_) => assert!(!protocol::tenant::valid_tenant(text)),
        }
    }
    if let Ok(n) = quota_body(data) {
        let doc: serde_json::Value = serde_json::from_slice(data).expect("it parsed once");
        let said = doc.get("requested_quota_bytes").map(|v| v.as_u64());
        assert_eq!(said.unwrap_or(Some(0)), Some(n));
    }
});
