//! Shared helpers for integration tests (placeholder).
