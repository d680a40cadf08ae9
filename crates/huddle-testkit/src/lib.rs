//! Test-only support.
