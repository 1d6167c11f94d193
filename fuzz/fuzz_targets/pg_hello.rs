//! Fuzzes the hello that opens every `mooncake.pg` and EP link (`collective::net`:
//! a founder's, a joiner's, an EP link's), as a listener reads it after the handshake: the
//! first 24 bytes decode, then the checks of each kind run against a group shape taken from
//! the input's last bytes. Nothing may panic; a hello re-encodes to exactly its bytes; a
//! hello a check accepts names a rank of the group other than the listener's, sent to the
//! listener, with the kind's magic (and a joiner's pid is not 0).
#![no_main]

use collective::ep::net::HELLO_MAGIC as EP_MAGIC;
use collective::net::{Hello, FRAME_BYTES, HELLO_MAGIC, JOIN_MAGIC};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some(h) = Hello::decode(data) else {
        assert!(data.len() < FRAME_BYTES);
        return;
    };
    assert_eq!(&h.encode()[..], &data[..FRAME_BYTES], "not canonical");
    // The listener's group: rank `me` of `ranks` (small, so checks can pass), from the tail.
    let tail = &data[FRAME_BYTES..];
    let ranks = tail.first().map_or(2, |b| usize::from(*b % 65).max(1));
    let me = tail.get(1).map_or(0, |b| usize::from(*b) % ranks);
    for magic in [HELLO_MAGIC, EP_MAGIC] {
        if let Ok(r) = h.founder(magic, me, ranks) {
            assert!(
                h.magic == magic && r < ranks && r != me && h.to as usize == me,
                "{h:?}"
            );
        }
    }
    if let Ok((slot, pid)) = h.joiner(me, ranks) {
        assert!(h.magic == JOIN_MAGIC && slot < ranks && slot != me, "{h:?}");
        assert!(pid != 0 && h.to as usize == me, "{h:?}");
    }
});
