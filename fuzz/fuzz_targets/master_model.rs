//! Drives the model of owners, writers and elections around the master
//! (`controlplane::model`, `docs/reliability.md`) with a schedule read from the input instead
//! of a seed: every choice (which writer starts or steps a put, which owner pings or re-mounts,
//! how far the clock moves, when an election happens) comes from the next two bytes.
//!
//! The check is the model's: every read after the recovery fence returns, for each replica,
//! exactly the bytes of that key's write at that version. Nothing may panic.
//!
//! `MC_MODEL_LATE=1` lets an old term's transfers land after an election: the open
//! interleaving of `docs/reliability.md`, found within a second, so not in CI's run.
#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;

fn late_writes() -> bool {
    static LATE: OnceLock<bool> = OnceLock::new();
    *LATE.get_or_init(|| std::env::var_os("MC_MODEL_LATE").is_some())
}

fuzz_target!(|data: &[u8]| {
    if let Err(violation) = controlplane::model::run_bytes(data, late_writes()) {
        panic!("{violation}");
    }
});
