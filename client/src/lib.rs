//! Store client (placeholder).
