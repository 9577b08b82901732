//! The rolling window the ratio triggers count in.

pub(super) const BUCKETS: u64 = 10;

/// Buckets reused round-robin: bucket `now / width` is kept at its value
/// modulo `BUCKETS`.
#[derive(Debug, Default)]
pub(super) struct Window {
    buckets: [Bucket; BUCKETS as usize],
}

impl Window {
    /// Counts `outcome` at `now` in buckets `width` µs wide.
    pub(super) fn count(&mut self, width: u64, now: u64, outcome: Outcome) {
        let index = now / width;
        let bucket = &mut self.buckets[(index % BUCKETS) as usize];
        if bucket.index != index {
            *bucket = Bucket {
                index,
                ..Bucket::default()
            };
        }
        match outcome {
            Outcome::Failed => bucket.failed += 1,
            Outcome::Ok { slow } => {
                bucket.ok += 1;
                bucket.slow += u64::from(slow);
            }
        }
    }

    /// The buckets' sum over the window ending at `now`.
    pub(super) fn sum(&self, width: u64, now: u64) -> Bucket {
        let index = now / width;
        let mut sum = Bucket::default();
        for bucket in &self.buckets {
            if bucket.index <= index && index - bucket.index < BUCKETS {
                sum.ok += bucket.ok;
                sum.failed += bucket.failed;
                sum.slow += bucket.slow;
            }
        }
        sum
    }
}

/// Calls counted in one bucket, or the window.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Bucket {
    index: u64,
    pub(super) ok: u64,
    pub(super) failed: u64,
    /// Slow successes, also counted in `ok`.
    pub(super) slow: u64,
}

/// How a counted call ended.
#[derive(Debug, Clone, Copy)]
pub(super) enum Outcome {
    Ok { slow: bool },
    Failed,
}
