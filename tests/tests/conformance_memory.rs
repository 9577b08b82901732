//! The store conformance suite on the embedded [`MemoryStore`](tower_window::MemoryStore).

tower_window_tests::conformance_tests!(tower_window_tests::conformance::MemoryStoreFactory);

mod lease {
    tower_window_tests::lease_conformance_tests!(
        tower_window_tests::conformance::MemoryStoreFactory
    );
}
