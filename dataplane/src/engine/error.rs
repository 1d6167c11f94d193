//! The engine's error: an upstream transfer-engine code plus a sentence saying what went
//! wrong, so that a log line is useful and the Python layer still returns the number.

use crate::metadata::MetadataError;
use crate::TeError;

/// A failed engine call: [`EngineError::code`] is what crosses the Python boundary.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{code}: {message}")]
pub struct EngineError {
    code: TeError,
    message: String,
}

impl EngineError {
    pub fn new(code: TeError, message: impl Into<String>) -> EngineError {
        EngineError {
            code,
            message: message.into(),
        }
    }

    /// The upstream error code.
    pub fn code(&self) -> TeError {
        self.code
    }

    /// The explanation.
    pub fn message(&self) -> &str {
        &self.message
    }

    pub(crate) fn not_initialized() -> EngineError {
        EngineError::new(TeError::InvalidArgument, "the engine is not initialized")
    }
}

impl From<TeError> for EngineError {
    fn from(code: TeError) -> EngineError {
        EngineError::new(code, code.name())
    }
}

impl From<MetadataError> for EngineError {
    fn from(e: MetadataError) -> EngineError {
        EngineError::new(e.code(), e.to_string())
    }
}

/// A numeric code that came back from a peer or the transport, as an engine error.
pub(crate) fn from_code(code: i32, what: &str) -> EngineError {
    let te = TeError::from_i32(code).unwrap_or(TeError::Socket);
    EngineError::new(te, format!("{what}: status {code}"))
}
