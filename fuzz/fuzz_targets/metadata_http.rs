//! Fuzzes the HTTP metadata client's response parser (`dataplane::metadata::http`): arbitrary
//! bytes as everything a server sent before closing (status line, headers, a
//! Content-Length, chunked or unframed body). Nothing may panic; a body is never larger
//! than the bytes received.
#![no_main]

use dataplane::metadata::http;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(r) = http::decode_response(data) {
        assert!(r.body.len() <= data.len());
    }
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = http::HttpUrl::parse(text);
        let _ = dataplane::metadata::MetadataBackend::parse(text);
    }
});
