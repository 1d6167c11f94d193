//! Fuzzes the master's view of a byte stream: frame splitting, then request decoding, then
//! response validation. Nothing here may panic, and a decoded request must re-encode to the
//! bytes it came from (the codec is canonical).
#![no_main]

use libfuzzer_sys::fuzz_target;
use protocol::frame::split_frame;
use protocol::message::{validate_response, Request};

fuzz_target!(|data: &[u8]| {
    let mut rest = data;
    while let Ok(Some((f, used))) = split_frame(rest) {
        if let Ok(req) = Request::decode(f.header.opcode, f.body) {
            let mut again = Vec::new();
            req.encode_body(&mut again);
            assert_eq!(again, f.body, "request codec is not canonical");
        }
        let _ = validate_response(f.header.opcode, f.body);
        rest = &rest[used..];
    }
    // The same bytes as a bare body of every opcode.
    if let Some((&op, body)) = data.split_first() {
        let _ = Request::decode(op as u16, body);
        let _ = validate_response(op as u16, body);
    }
});
