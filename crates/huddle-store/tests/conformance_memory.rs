//! The store conformance suite, run against the in-memory store (a fresh database per
//! test). It has no cross-process test: nothing outside this process can open it.

use huddle_store::memory::MemoryTestBackend;

async fn make_backend() -> MemoryTestBackend {
    MemoryTestBackend::new()
}

huddle_store::conformance_tests!(make_backend);
