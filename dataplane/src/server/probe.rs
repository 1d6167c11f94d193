//! io_uring availability: the switch between the io_uring shard and the blocking fallback.
//!
//! io_uring is refused in many places a storage node runs: Docker's default seccomp profile
//! (EPERM), `kernel.io_uring_disabled` (EPERM), old kernels (ENOSYS). The node asks once at
//! start-up with [`probe`], which creates and closes a tiny ring through the raw
//! `io_uring_setup` system call; `MC_DISABLE_IO_URING=1` forces the fallback so that tests
//! and operators can exercise it. The answer says why, for the log line and the metric.
//!
//! When the probe succeeds the node runs the io_uring shards (`crate::shard`), whose
//! buffers are owned by each operation until its completion; when it fails, every server
//! runs the blocking path (`super::blocking`).

use std::fmt;

/// Which data-plane I/O path a node can use, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum UringStatus {
    /// A ring could be created.
    Available,
    /// `MC_DISABLE_IO_URING` asked for the fallback.
    DisabledByEnv,
    /// The kernel refused `io_uring_setup` with this errno (EPERM, ENOSYS, ...).
    Refused { errno: i32 },
}

impl UringStatus {
    /// True only for [`UringStatus::Available`].
    pub fn is_available(&self) -> bool {
        matches!(self, UringStatus::Available)
    }
}

impl fmt::Display for UringStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            UringStatus::Available => write!(f, "io_uring available"),
            UringStatus::DisabledByEnv => {
                write!(
                    f,
                    "io_uring disabled by MC_DISABLE_IO_URING; using the blocking path"
                )
            }
            UringStatus::Refused { errno } => write!(
                f,
                "io_uring refused by the kernel ({}); using the blocking path",
                std::io::Error::from_raw_os_error(*errno)
            ),
        }
    }
}

/// True when `MC_DISABLE_IO_URING` holds a true value ([`protocol::env::TRUE_WORDS`]).
pub fn disabled_by_env() -> bool {
    env_value_is_true(std::env::var("MC_DISABLE_IO_URING").ok().as_deref())
}

fn env_value_is_true(value: Option<&str>) -> bool {
    value.and_then(protocol::env::parse_bool).unwrap_or(false)
}

/// Decides the I/O path: the environment first, then a real `io_uring_setup`.
pub fn probe() -> UringStatus {
    if disabled_by_env() {
        return UringStatus::DisabledByEnv;
    }
    probe_kernel()
}

/// Creates and closes a 2-entry ring, ignoring the environment.
pub fn probe_kernel() -> UringStatus {
    // `struct io_uring_params` is 120 bytes; all-zero asks for default behaviour.
    let mut params = [0u32; 30];
    // SAFETY: io_uring_setup reads and writes exactly one `struct io_uring_params`, which
    // `params` is large enough and suitably aligned (u32) to hold.
    let fd = unsafe { libc::syscall(libc::SYS_io_uring_setup, 2u32, params.as_mut_ptr()) };
    if fd < 0 {
        let errno = std::io::Error::last_os_error()
            .raw_os_error()
            .unwrap_or(libc::ENOSYS);
        return UringStatus::Refused { errno };
    }
    // SAFETY: `fd` is the ring descriptor just created and owned by nobody else.
    unsafe { libc::close(fd as libc::c_int) };
    UringStatus::Available
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn env_values() {
        assert!(env_value_is_true(Some("1")));
        assert!(env_value_is_true(Some(" On ")));
        assert!(!env_value_is_true(Some("0")));
        assert!(!env_value_is_true(Some("")));
        assert!(!env_value_is_true(None));
    }

    #[test]
    fn kernel_probe_answers_available_or_a_refusal_errno() {
        let status = probe_kernel();
        println!("{status}");
        match status {
            UringStatus::Available => {}
            UringStatus::Refused { errno } => assert!(errno > 0, "errno {errno}"),
            UringStatus::DisabledByEnv => panic!("probe_kernel ignores the environment"),
        }
    }

    #[test]
    fn messages_name_the_reason() {
        let refused = UringStatus::Refused { errno: libc::EPERM }.to_string();
        assert!(
            refused.contains("refused") && refused.contains("blocking path"),
            "{refused}"
        );
        assert!(UringStatus::DisabledByEnv
            .to_string()
            .contains("MC_DISABLE_IO_URING"));
        assert!(!UringStatus::DisabledByEnv.is_available());
    }
}
