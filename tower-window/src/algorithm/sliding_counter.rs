//! sliding_counter state transition (to be written).
