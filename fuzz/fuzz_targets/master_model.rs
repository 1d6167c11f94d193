//! Drives the model of owners, writers and elections around the master
//! (`controlplane::model`, `docs/reliability.md`) with a schedule read from the input instead
//! of a seed: every choice (which writer starts or steps a put, which owner pings or re-mounts,
//! how far the clock moves, when an election happens) comes from the next two bytes.
//!
//! The check is the model's: every read after the recovery fence returns, for each replica,
//! exactly the bytes of that key's write at that version. Nothing may panic.
//!
//! An old term's transfers may land after an election (its writer outlived the leader), and
//! the owners refuse the bytes and records of ended terms, as they do over TCP and for memcpy
//! (`dataplane::recovery::fence`, `recovery::inflight`). `MC_MODEL_LATE=0` keeps every transfer before
//! the election; `MC_MODEL_UNFENCED_BYTES=1` lets late bytes land (an RDMA write past its
//! intent, a same-host copy stalled past the owner's 5 s wait): the interleaving
//! `docs/reliability.md` leaves open, found within a second, so not in CI's run.
#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;

fn late_writes() -> bool {
    static LATE: OnceLock<bool> = OnceLock::new();
    *LATE.get_or_init(|| std::env::var_os("MC_MODEL_LATE").is_none_or(|v| v != "0"))
}

fn fenced_bytes() -> bool {
    static FENCED: OnceLock<bool> = OnceLock::new();
    *FENCED.get_or_init(|| std::env::var_os("MC_MODEL_UNFENCED_BYTES").is_none())
}

fuzz_target!(|data: &[u8]| {
    if let Err(violation) = controlplane::model::run_bytes(data, late_writes(), fenced_bytes()) {
        panic!("{violation}");
    }
});
