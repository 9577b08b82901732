//! sliding_log state transition (to be written).
