//! Fuzzes the cluster-secret handshake (`protocol::auth`) as a server meets it on a stream:
//! `Frame::decode` at every offset, and a `ServerHandshake` fed the input as back-to-back
//! 32-byte frames. Nothing may panic; a frame that decodes re-encodes to exactly its bytes
//! (the codec is canonical); and a peer that does not know the secret never authenticates
//! (the fuzzer cannot compute the MAC, so the handshake must never accept).
#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use protocol::auth::{Frame, ServerHandshake, ServerStep, Token, FRAME_BYTES};

fn token() -> &'static Token {
    static T: OnceLock<Token> = OnceLock::new();
    T.get_or_init(|| Token::new(b"fuzz-cluster-secret").expect("a valid token"))
}

fuzz_target!(|data: &[u8]| {
    for at in 0..data.len().min(64) {
        if let Ok(f) = Frame::decode(&data[at..]) {
            assert_eq!(&f.encode()[..], &data[at..at + FRAME_BYTES], "not canonical");
        }
    }
    let mut hs = ServerHandshake::new(token());
    for chunk in data.chunks(FRAME_BYTES) {
        match hs.on_frame(chunk) {
            ServerStep::Reply(_) => {}
            ServerStep::Accept(_) => panic!("a peer without the secret was accepted"),
            ServerStep::Refuse(..) | ServerStep::NotHandshake => break,
        }
        assert!(!hs.is_done());
    }
});
