//! Flags and config files (placeholder).
