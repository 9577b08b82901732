//! Cross-crate integration tests and shared test harnesses for tower-window.

pub mod conformance;
