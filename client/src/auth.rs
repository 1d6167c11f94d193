//! The cluster secret on this crate's connections to the master (see `protocol::auth`).
//!
//! [`handshake`] runs on every new master connection, once, before its first request; it
//! does nothing when no secret is configured.

use std::io;
use std::net::TcpStream;
use std::time::Duration;

use protocol::auth::{self, AuthError};

/// Proves this process's secret to the peer on `stream` and checks the peer's proof, within
/// `timeout` per step. No secret configured: `Ok` at once, nothing sent. A failure is an
/// `io::Error` of kind `PermissionDenied` (wrong or missing secret on either side) or the
/// I/O error's own kind, with a message that says which.
pub fn handshake(stream: &TcpStream, timeout: Duration) -> io::Result<()> {
    let token = match auth::process_token() {
        Ok(None) => return Ok(()),
        Ok(Some(t)) => t,
        Err(e) => return Err(io::Error::new(io::ErrorKind::InvalidInput, e)),
    };
    stream.set_read_timeout(Some(timeout))?;
    stream.set_write_timeout(Some(timeout))?;
    let mut s = stream;
    let result = auth::client_handshake(&mut s, token);
    stream.set_read_timeout(None)?;
    stream.set_write_timeout(None)?;
    result.map_err(to_io)
}

/// An `AuthError` as the `io::Error` callers already report.
pub fn to_io(e: AuthError) -> io::Error {
    let kind = match &e {
        AuthError::Io { kind, .. } => *kind,
        AuthError::Config(_) => io::ErrorKind::InvalidInput,
        _ => io::ErrorKind::PermissionDenied,
    };
    io::Error::new(kind, e)
}
