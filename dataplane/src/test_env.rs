//! The environment lock of tests, for this crate's integration tests and every crate above
//! it (`mooncake-tests`): one copy, so both keep the same rules. Nothing outside tests calls it.

/// The lock every test of a test binary takes when one of its tests changes process-wide
/// environment variables (`std::env::set_var`) that the code under test reads: `cargo test`
/// runs a binary's tests as threads of one process, so without it one test's variables leak
/// into another running at the same time (`cargo nextest` runs each test in its own process
/// and never raced). A test that panicked while holding it does not poison it for the others.
/// Dropping the guard puts the environment back as it was when the lock was taken, so a
/// variable one test sets (`MC_STORE_SHM=0`) does not reach the tests after it either.
pub fn env_lock() -> EnvGuard {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let lock = LOCK
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    EnvGuard {
        saved: std::env::vars_os().collect(),
        _lock: lock,
    }
}

/// Held by a test that may change the environment; see [`env_lock`].
pub struct EnvGuard {
    saved: Vec<(std::ffi::OsString, std::ffi::OsString)>,
    _lock: std::sync::MutexGuard<'static, ()>,
}

impl Drop for EnvGuard {
    fn drop(&mut self) {
        // Before the lock is released (fields drop after this).
        for (k, _) in std::env::vars_os() {
            if !self.saved.iter().any(|(s, _)| *s == k) {
                std::env::remove_var(&k);
            }
        }
        for (k, v) in &self.saved {
            if std::env::var_os(k).as_ref() != Some(v) {
                std::env::set_var(k, v);
            }
        }
    }
}
