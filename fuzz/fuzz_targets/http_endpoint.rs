//! Fuzzes the node's small HTTP endpoint's request-line parsing
//! (`client::http_endpoint::parse_head`): arbitrary bytes as a request head. Nothing may
//! panic; the path never holds `?` or whitespace, neither word is empty unless what precedes
//! it is missing, and a request line built from the parsed words parses to the same words.
#![no_main]

use client::http_endpoint::parse_head;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let h = parse_head(data);
    assert!(!h.path.contains('?'), "{h:?}");
    assert!(!h.path.contains(char::is_whitespace), "{h:?}");
    assert!(!h.method.contains(char::is_whitespace), "{h:?}");
    if h.method.is_empty() {
        assert!(h.path.is_empty(), "{h:?}");
    }
    let line = format!("{} {}?q HTTP/1.1\r\n\r\n", h.method, h.path);
    if !h.method.is_empty() && !h.path.is_empty() {
        assert_eq!(parse_head(line.as_bytes()), h);
    }
});
