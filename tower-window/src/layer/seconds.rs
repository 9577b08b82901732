//! How the layer writes a duration: whole seconds, rounded up.

use std::time::Duration;

/// Whole seconds, rounded up, as every header and body of this crate writes
/// durations (`300 ms` → `1`, never `0` for a positive wait).
pub fn ceil_secs(d: Duration) -> u64 {
    d.as_secs().saturating_add(u64::from(d.subsec_nanos() > 0))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::ceil_secs;

    #[test]
    fn rounds_up_to_whole_seconds() {
        assert_eq!(ceil_secs(Duration::ZERO), 0);
        assert_eq!(ceil_secs(Duration::from_millis(300)), 1);
        assert_eq!(ceil_secs(Duration::from_secs(2)), 2);
        assert_eq!(ceil_secs(Duration::from_millis(2_001)), 3);
        assert_eq!(ceil_secs(Duration::MAX), u64::MAX);
    }
}
