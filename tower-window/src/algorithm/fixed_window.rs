//! fixed_window state transition (to be written).
