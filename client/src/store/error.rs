//! [`StoreError`]: a store failure as Python sees it (upstream's [`ErrorCode`]) plus the reason
//! in words, so a `-200` from `put` reaches the log as "no space for 4 MiB x 2 replicas"
//! instead of a bare number.
//!
//! The code is what the caller branches on and what crosses the Python boundary, unchanged; the
//! cause is for people: what failed, on which key, segment, node or master address, and the
//! underlying error. The Python binding logs the cause (`python/src/api.rs`); nothing here
//! logs.
//!
//! Paths convert one by one: a function that still returns a bare [`ErrorCode`] turns into a
//! `StoreError` without a cause (`From<ErrorCode>`), and a `StoreError` turns back into its
//! code where a caller wants only that (`From<StoreError> for ErrorCode`), so `?` works both
//! ways while the rest of the store moves over.

use std::fmt;

use protocol::ErrorCode;

/// A failed store call: the code Python gets and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoreError {
    pub code: ErrorCode,
    /// What failed, in words; empty when the path has not been given one yet.
    pub cause: String,
}

impl StoreError {
    pub fn new(code: ErrorCode, cause: impl Into<String>) -> StoreError {
        StoreError {
            code,
            cause: cause.into(),
        }
    }

    /// `INVALID_PARAMS` with its cause: the caller asked for something that cannot be done.
    pub fn invalid(cause: impl Into<String>) -> StoreError {
        StoreError::new(ErrorCode::InvalidParams, cause)
    }

    pub fn code(&self) -> ErrorCode {
        self.code
    }

    /// The same error with `what` in front of its cause (`"put k: " + cause`), or as the cause
    /// when it had none.
    pub fn context(mut self, what: impl fmt::Display) -> StoreError {
        self.cause = if self.cause.is_empty() {
            what.to_string()
        } else {
            format!("{what}: {}", self.cause)
        };
        self
    }

    /// Whether this is an ordinary answer rather than a failure worth an error line: the key
    /// is not there (a get or lookup of a missing key is how callers test for one).
    pub fn is_miss(&self) -> bool {
        self.code == ErrorCode::ObjectNotFound
    }
}

impl From<ErrorCode> for StoreError {
    fn from(code: ErrorCode) -> StoreError {
        StoreError {
            code,
            cause: String::new(),
        }
    }
}

impl From<StoreError> for ErrorCode {
    fn from(e: StoreError) -> ErrorCode {
        e.code
    }
}

impl PartialEq<ErrorCode> for StoreError {
    fn eq(&self, code: &ErrorCode) -> bool {
        self.code == *code
    }
}

/// `NAME (number): cause`, or `NAME (number)` without a cause.
impl fmt::Display for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.cause.is_empty() {
            write!(f, "{}", self.code)
        } else {
            write!(f, "{}: {}", self.code, self.cause)
        }
    }
}

impl std::error::Error for StoreError {}

/// Bytes in the unit a person reads (`4 MiB`, `1.5 GiB`, `512 B`), for causes.
pub(crate) fn bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut unit = 0;
    while v >= 1024.0 && unit + 1 < UNITS.len() {
        v /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{n} B")
    } else if v.fract() == 0.0 {
        format!("{v} {}", UNITS[unit])
    } else {
        format!("{v:.1} {}", UNITS[unit])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_names_the_code_and_the_cause() {
        let e = StoreError::new(ErrorCode::TransferFail, "write to 10.0.0.2:12345: reset");
        assert_eq!(
            e.to_string(),
            "TRANSFER_FAIL (-800): write to 10.0.0.2:12345: reset"
        );
        let e = e.context("put k1");
        assert_eq!(
            e.to_string(),
            "TRANSFER_FAIL (-800): put k1: write to 10.0.0.2:12345: reset"
        );
        assert_eq!(
            StoreError::from(ErrorCode::InvalidParams).to_string(),
            "INVALID_PARAMS (-600)"
        );
        assert_eq!(
            StoreError::from(ErrorCode::InvalidParams)
                .context("put k")
                .cause,
            "put k"
        );
        assert_eq!(ErrorCode::from(e), ErrorCode::TransferFail);
    }

    #[test]
    fn sizes_read_as_people_write_them() {
        assert_eq!(bytes(512), "512 B");
        assert_eq!(bytes(4 << 20), "4 MiB");
        assert_eq!(bytes(3 << 29), "1.5 GiB");
    }
}
