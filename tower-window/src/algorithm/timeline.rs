//! An ordered record of admissions that expire: the common core of the
//! sliding log (one slot per timestamp) and the sliding counter (one slot per
//! bucket).
//!
//! Each slot `(at, units)` counts until `expires_at(at)`. Both algorithms
//! keep slots ascending by `at`, drop the expired prefix, admit when the
//! units still counting plus the cost fit the limit, and on a denial wait
//! until enough of the oldest slots have expired. Only the slot of "now" and
//! the expiry of a slot differ, so they are the two parameters.

use std::collections::VecDeque;

use super::outcome::{saturate_u32, Outcome};

/// Slots `(at, units)`, ascending by `at`, and their sum (kept beside them
/// so a check costs O(expired slots), not O(all slots): a sliding log near a
/// high limit holds many entries).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Timeline {
    slots: VecDeque<(u64, u64)>,
    total: u64,
}

impl Timeline {
    /// Number of slots kept (for tests of memory use).
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.slots.len()
    }

    /// Adds `units` to slot `at`, keeping slots ascending. A slot older than
    /// the newest one only appears when the clock stepped back.
    fn add(&mut self, at: u64, units: u64) {
        self.total = self.total.saturating_add(units);
        match self.slots.back_mut() {
            Some((newest, c)) if *newest == at => *c = c.saturating_add(units),
            Some((newest, _)) if *newest > at => {
                let i = self.slots.partition_point(|&(slot, _)| slot < at);
                match self.slots.get_mut(i) {
                    Some((slot, c)) if *slot == at => *c = c.saturating_add(units),
                    _ => self.slots.insert(i, (at, units)),
                }
            }
            _ => self.slots.push_back((at, units)),
        }
    }
}

/// Checks `cost` units against `limit` at `now`, recording them in slot `at`
/// if admitted. Slot `s` counts until `expires_at(s)` (µs since the epoch;
/// `None` when that lies beyond `u64`, i.e. never). Never panics.
pub(crate) fn check(
    timeline: &mut Timeline,
    now: u64,
    at: u64,
    cost: u32,
    limit: u64,
    expires_at: impl Fn(u64) -> Option<u64>,
) -> Outcome {
    let cost = u64::from(cost);
    let wait_for = |slot: u64| expires_at(slot).unwrap_or(u64::MAX).saturating_sub(now);

    // Slots are ascending, so the expired ones are a prefix.
    while let Some(&(slot, units)) = timeline.slots.front() {
        if expires_at(slot).is_none_or(|end| end > now) {
            break;
        }
        timeline.slots.pop_front();
        timeline.total = timeline.total.saturating_sub(units);
    }
    let used = timeline.total;
    let reset_after = |t: &Timeline| t.slots.back().map_or(0, |&(newest, _)| wait_for(newest));

    if cost > limit {
        // Can never fit: say so (None) rather than promise a wait.
        return Outcome::deny(
            saturate_u32(limit.saturating_sub(used)),
            reset_after(timeline),
            None,
        );
    }

    if used.saturating_add(cost) <= limit {
        timeline.add(at, cost);
        let reset = reset_after(timeline);
        return Outcome::allow(saturate_u32(limit - used - cost), reset);
    }

    // Denied: wait until enough of the oldest slots have expired for `cost`
    // to fit. Freeing everything always suffices (cost <= limit), so the
    // walk always finds a slot; the fallback is unreachable.
    let mut freed = 0u64;
    let mut retry = reset_after(timeline);
    for &(slot, c) in &timeline.slots {
        freed = freed.saturating_add(c);
        if used.saturating_sub(freed).saturating_add(cost) <= limit {
            retry = wait_for(slot);
            break;
        }
    }
    Outcome::deny(
        saturate_u32(limit.saturating_sub(used)),
        reset_after(timeline),
        Some(retry),
    )
}
