//! (placeholder, filled in by issue 2 work)
