//! Transfer-engine error codes, numbered as upstream Mooncake numbers them
//! (`mooncake-transfer-engine/include/error.h`).
//!
//! These are the numbers that cross the boundary (the wire status of a data-plane response,
//! the return values of the Python `TransferEngine`), so the numbers are the contract. Richer
//! `thiserror` types inside the crate map onto one of these with a `code()` method.

macro_rules! te_errors {
    ($($name:ident = $value:expr => $text:literal,)*) => {
        /// A transfer-engine error code. Every code is negative; success is not a variant.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        #[repr(i32)]
        pub enum TeError {
            $($name = $value,)*
        }

        impl TeError {
            /// Every code, in declaration order.
            pub const ALL: &'static [TeError] = &[$(TeError::$name,)*];

            /// The code for a number, or `None` for a number upstream does not define.
            pub fn from_i32(value: i32) -> Option<TeError> {
                match value {
                    $($value => Some(TeError::$name),)*
                    _ => None,
                }
            }

            /// Upstream's macro name, e.g. `ERR_ADDRESS_OVERLAPPED`.
            pub fn name(self) -> &'static str {
                match self {
                    $(TeError::$name => $text,)*
                }
            }
        }
    };
}

te_errors! {
    InvalidArgument = -1 => "ERR_INVALID_ARGUMENT",
    TooManyRequests = -2 => "ERR_TOO_MANY_REQUESTS",
    AddressNotRegistered = -3 => "ERR_ADDRESS_NOT_REGISTERED",
    BatchBusy = -4 => "ERR_BATCH_BUSY",
    DeviceNotFound = -6 => "ERR_DEVICE_NOT_FOUND",
    AddressOverlapped = -7 => "ERR_ADDRESS_OVERLAPPED",
    Dns = -101 => "ERR_DNS",
    Socket = -102 => "ERR_SOCKET",
    MalformedJson = -103 => "ERR_MALFORMED_JSON",
    RejectHandshake = -104 => "ERR_REJECT_HANDSHAKE",
    Metadata = -200 => "ERR_METADATA",
    Endpoint = -201 => "ERR_ENDPOINT",
    Context = -202 => "ERR_CONTEXT",
    Numa = -300 => "ERR_NUMA",
    Clock = -301 => "ERR_CLOCK",
    Memory = -302 => "ERR_MEMORY",
    NotImplemented = -303 => "ERR_NOT_IMPLEMENTED",
}

impl TeError {
    /// The number upstream returns.
    pub fn code(self) -> i32 {
        self as i32
    }
}

impl std::fmt::Display for TeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({})", self.name(), self.code())
    }
}

impl std::error::Error for TeError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_match_upstream() {
        assert_eq!(TeError::InvalidArgument.code(), -1);
        assert_eq!(TeError::AddressNotRegistered.code(), -3);
        assert_eq!(TeError::AddressOverlapped.code(), -7);
        assert_eq!(TeError::Socket.code(), -102);
        assert_eq!(TeError::Context.code(), -202);
        assert_eq!(TeError::NotImplemented.code(), -303);
        assert_eq!(TeError::ALL.len(), 17);
    }

    #[test]
    fn every_code_round_trips_and_unknown_numbers_are_none() {
        for &e in TeError::ALL {
            assert_eq!(TeError::from_i32(e.code()), Some(e));
            assert!(e.name().starts_with("ERR_"));
        }
        for n in [0, -5, -8, -100, -105, -203, -304, 1] {
            assert_eq!(TeError::from_i32(n), None, "{n}");
        }
        assert_eq!(
            TeError::AddressOverlapped.to_string(),
            "ERR_ADDRESS_OVERLAPPED (-7)"
        );
    }
}
