//! The event-window conformance suite on the embedded `MemoryStore`.

tower_window_tests::event_conformance_tests!(
    tower_window_tests::event_conformance::MemoryEventFactory
);
