//! gcra state transition (to be written).
