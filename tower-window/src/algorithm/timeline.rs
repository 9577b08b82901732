//! An ordered record of admissions that expire: the common core of the
//! sliding log (one slot per timestamp) and the sliding counter (one slot
//! per bucket), which differ only in the slot of "now" and when a slot
//! stops counting. The contract shared with the Redis scripts, in integer
//! microseconds (`t` now, `L` limit, `c` cost):
//!
//! 1. Slots that stopped counting are dropped; `used = Σ units` of the rest.
//! 2. `c > L`: deny, `retry_after = None`, `remaining = L - used`,
//!    `reset_after` = until the newest slot stops counting (0 with none).
//! 3. `used + c <= L`: admit, add `c` to the slot of `t`;
//!    `remaining = L - used - c`, `reset_after` (also the TTL) as in 2,
//!    after the admission.
//! 4. Otherwise deny: `remaining = L - used`, `reset_after` as in 2; walk
//!    the slots oldest first, accumulating `freed`: the first with
//!    `used - freed + c <= L` gives `retry_after` = until it stops counting.
//!
//! A denial records nothing. Slots newer than `t` (the clock stepped back)
//! keep counting, in order.

use std::collections::VecDeque;

use super::outcome::{saturate_u32, Evaluation, Outcome};

#[cfg(test)]
use test_support::{count_step, steps};

/// Loop iterations of `evaluate` on this thread, for the tests that bound
/// the work of a check by the state held (never by how far the clock
/// moved), and the tests' view of a timeline's memory use.
#[cfg(test)]
mod test_support {
    thread_local! {
        static STEPS: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
    }

    pub(super) fn count_step() {
        STEPS.with(|steps| steps.set(steps.get() + 1));
    }

    /// The loop iterations counted so far on this thread.
    pub(crate) fn steps() -> u64 {
        STEPS.with(std::cell::Cell::get)
    }

    impl super::Timeline {
        /// Number of slots kept.
        pub(crate) fn len(&self) -> usize {
            self.slots.iter().count()
        }

        /// Whether the slots are kept inline.
        pub(crate) fn is_inline(&self) -> bool {
            matches!(self.slots, super::Slots::Inline { .. })
        }
    }
}

/// Slots `(at, units)`, ascending by `at`, and their sum (kept beside them
/// so a check costs O(expired slots), not O(all slots): a sliding log near a
/// high limit holds many entries).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Timeline {
    slots: Slots,
    total: u64,
}

/// How many slots a [`Timeline`] keeps inline, in the store's entry for
/// the key: a key checked a few times per window (most keys of a large
/// store) then costs no second cache miss for its state.
pub(crate) const INLINE_SLOTS: usize = 2;

/// One slot: `(at, units)`.
type Slot = (u64, u64);

/// The slots of a [`Timeline`]: inline while they are few, in a ring
/// buffer beyond (and inline again once they have all expired).
#[derive(Clone)]
enum Slots {
    Inline {
        len: u8,
        slots: [Slot; INLINE_SLOTS],
    },
    Spilled(VecDeque<Slot>),
}

impl Default for Slots {
    fn default() -> Self {
        Self::Inline {
            len: 0,
            slots: [(0, 0); INLINE_SLOTS],
        }
    }
}

impl Slots {
    fn as_slices(&self) -> (&[Slot], &[Slot]) {
        match self {
            Self::Inline { len, slots } => (&slots[..usize::from(*len)], &[]),
            Self::Spilled(ring) => ring.as_slices(),
        }
    }

    // The ends, read on every check: straight from the ring, which is
    // cheaper than through `as_slices`.
    fn front(&self) -> Option<&Slot> {
        match self {
            Self::Inline { len, slots } => slots[..usize::from(*len)].first(),
            Self::Spilled(ring) => ring.front(),
        }
    }

    fn back_mut(&mut self) -> Option<&mut Slot> {
        match self {
            Self::Inline { len, slots } => slots[..usize::from(*len)].last_mut(),
            Self::Spilled(ring) => ring.back_mut(),
        }
    }

    fn iter(&self) -> impl Iterator<Item = &Slot> {
        let (a, b) = self.as_slices();
        a.iter().chain(b)
    }

    fn get_mut(&mut self, i: usize) -> Option<&mut Slot> {
        match self {
            Self::Inline { len, slots } => slots[..usize::from(*len)].get_mut(i),
            Self::Spilled(ring) => ring.get_mut(i),
        }
    }

    fn partition_point(&self, pred: impl Fn(&Slot) -> bool) -> usize {
        match self {
            Self::Inline { len, slots } => slots[..usize::from(*len)].partition_point(pred),
            Self::Spilled(ring) => ring.partition_point(pred),
        }
    }

    /// Drops the oldest slot; once none is left, an empty timeline is
    /// inline again (its buffer freed).
    fn pop_front(&mut self) {
        match self {
            Self::Inline { len, slots } => {
                if *len > 0 {
                    slots.copy_within(1..usize::from(*len), 0);
                    *len -= 1;
                }
            }
            Self::Spilled(ring) => {
                ring.pop_front();
                if ring.is_empty() {
                    *self = Self::default();
                }
            }
        }
    }

    /// Inserts `slot` at `i` (the end if beyond it), moving the slots to a
    /// buffer of their own when they no longer fit inline.
    fn insert(&mut self, i: usize, slot: Slot) {
        match self {
            Self::Inline { len, slots } if usize::from(*len) < INLINE_SLOTS => {
                let n = usize::from(*len);
                let i = i.min(n);
                slots.copy_within(i..n, i + 1);
                slots[i] = slot;
                *len += 1;
            }
            Self::Inline { len, slots } => {
                let mut ring = VecDeque::with_capacity(2 * INLINE_SLOTS);
                ring.extend(&slots[..usize::from(*len)]);
                ring.insert(i.min(ring.len()), slot);
                *self = Self::Spilled(ring);
            }
            // Appending is the common case: VecDeque::insert at the end
            // costs some 60 instructions more than push_back.
            Self::Spilled(ring) if i >= ring.len() => ring.push_back(slot),
            Self::Spilled(ring) => ring.insert(i, slot),
        }
    }
}

// Slots compare and print by content, wherever they are kept.
impl PartialEq for Slots {
    fn eq(&self, other: &Self) -> bool {
        self.iter().eq(other.iter())
    }
}

impl Eq for Slots {}

impl std::fmt::Debug for Slots {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

impl Timeline {
    /// The units of slot `at`, or where it would be inserted.
    fn find(&mut self, at: u64) -> Result<&mut u64, usize> {
        let i = self.slots.partition_point(|&(slot, _)| slot < at);
        match self.slots.get_mut(i) {
            Some((slot, c)) if *slot == at => Ok(c),
            _ => Err(i),
        }
    }

    /// Takes back up to `units` from the slot at `at`, if it is still
    /// kept; answers how many were taken.
    pub(crate) fn take_back(&mut self, at: u64, units: u64) -> u64 {
        let Ok(c) = self.find(at) else { return 0 };
        let taken = units.min(*c);
        *c -= taken;
        self.total = self.total.saturating_sub(taken);
        taken
    }

    /// Adds `units` to slot `at`, keeping slots ascending. A slot older than
    /// the newest one only appears when the clock stepped back.
    pub(crate) fn add(&mut self, at: u64, units: u64) {
        self.total = self.total.saturating_add(units);
        match self.slots.back_mut() {
            Some((newest, c)) if *newest == at => *c = c.saturating_add(units),
            Some((newest, _)) if *newest > at => match self.find(at) {
                Ok(c) => *c = c.saturating_add(units),
                Err(i) => self.slots.insert(i, (at, units)),
            },
            _ => self.slots.insert(usize::MAX, (at, units)),
        }
    }
}

/// The most slots a denial's retry computation walks (as the Redis scripts
/// do), so that its work stays bounded: past it, the wait reported is
/// `reset_after`, later than the exact answer, never earlier.
pub(crate) const MAX_RETRY_WALK: usize = 128;

/// Evaluates `cost` units against `limit` at `now`, for recording in slot
/// `at`, recording nothing but dropping expired slots. Slot `s` counts
/// until `expires_at(s)` (`None`: never). Never panics.
pub(crate) fn evaluate(
    timeline: &mut Timeline,
    now: u64,
    at: u64,
    cost: u32,
    limit: u64,
    expires_at: impl Fn(u64) -> Option<u64>,
) -> Evaluation {
    let cost = u64::from(cost);
    let wait_for = |slot: u64| expires_at(slot).unwrap_or(u64::MAX).saturating_sub(now);

    // Slots are ascending, so the expired ones are a prefix.
    while let Some(&(slot, units)) = timeline.slots.front() {
        #[cfg(test)]
        count_step();
        if expires_at(slot).is_none_or(|end| end > now) {
            break;
        }
        timeline.slots.pop_front();
        timeline.total = timeline.total.saturating_sub(units);
    }
    let used = timeline.total;
    let newest = timeline.slots.back_mut().map(|&mut (newest, _)| newest);
    let reset_after = newest.map_or(0, wait_for);
    let remaining = saturate_u32(limit.saturating_sub(used));

    if cost > limit {
        // Can never fit: say so (None) rather than promise a wait.
        return Evaluation::denied(Outcome::deny(remaining, reset_after, None));
    }

    if used.saturating_add(cost) <= limit {
        let newest_after = newest.map_or(at, |n| n.max(at));
        let left = saturate_u32(limit - used - cost);
        return Evaluation::admitted(left, wait_for(newest_after), (remaining, reset_after));
    }

    // Denied: wait until enough of the oldest slots have expired for `cost`
    // to fit, looking at no more than MAX_RETRY_WALK of them.
    let mut freed = 0u64;
    let fits_after = timeline.slots.iter().take(MAX_RETRY_WALK).find(|&&(_, c)| {
        #[cfg(test)]
        count_step();
        freed = freed.saturating_add(c);
        used.saturating_sub(freed).saturating_add(cost) <= limit
    });
    let retry = fits_after.map_or(reset_after, |&(slot, _)| wait_for(slot));
    Evaluation::denied(Outcome::deny(remaining, reset_after, Some(retry)))
}

#[cfg(test)]
mod tests {
    use super::{steps, Timeline, INLINE_SLOTS, MAX_RETRY_WALK};
    use crate::algorithm::test_support::{check_with, quota, T0};
    use crate::algorithm::{sliding_counter, sliding_log};

    const HOUR: i64 = 3_600_000_000;
    const DAY: i64 = 24 * HOUR;
    const P40: i64 = 1 << 40;

    /// Slots move out of line past `INLINE_SLOTS` and back once all have
    /// expired, in order and with their sum, whatever order they came in.
    #[test]
    fn slots_spill_in_order_and_come_back_inline() {
        let mut timeline = Timeline::default();
        assert!(timeline.is_inline());
        // Out of order (a clock stepping back), merging equal slots.
        for at in [50, 10, 30, 10, 70, 20] {
            timeline.add(at, 1);
        }
        assert!(!timeline.is_inline());
        let kept: Vec<(u64, u64)> = timeline.slots.iter().copied().collect();
        assert_eq!(kept, [(10, 2), (20, 1), (30, 1), (50, 1), (70, 1)]);
        assert_eq!(timeline.total, 6);
        assert_eq!(timeline.take_back(30, 5), 1);
        assert_eq!(timeline.total, 5);
        // Everything up to 60 expires: two slots left (30 is kept at 0).
        let e = super::evaluate(&mut timeline, 60, 60, 1, 10, |at| Some(at + 10));
        assert!(e.fits());
        assert_eq!(timeline.len(), 1);
        assert_eq!(timeline.total, 1);
        // All expired: inline again, and equal to a fresh timeline.
        super::evaluate(&mut timeline, 100, 100, 1, 10, |at| Some(at + 10));
        assert!(timeline.is_inline());
        assert_eq!(timeline, Timeline::default());
        for at in 0..INLINE_SLOTS as u64 {
            timeline.add(at, 1);
        }
        assert!(timeline.is_inline());
        timeline.add(5, 1);
        assert!(!timeline.is_inline());
    }

    /// Steps of an hour, a day and 2^40 µs, back and forward, between
    /// admissions: each check's loop iterations stay within the slots it
    /// holds (one per slot dropped or walked, plus the one that stops),
    /// whatever the distance the clock moved (issue 22, defect 6).
    #[test]
    fn work_is_bounded_by_the_slots_held_across_clock_steps() {
        let run = [
            0,
            1_000,
            1_000,
            -HOUR,
            0,
            3_000,
            HOUR,
            1_000,
            -DAY,
            1_000,
            0,
            DAY,
            P40,
            -P40,
            -P40,
            1_000,
            2 * P40,
            -3 * DAY,
            7_000,
            3 * DAY,
            HOUR,
        ];
        for text in [
            "5/1s sliding-counter(1ms)",
            "8/3600ms sliding-counter(1ms)",
            "5/1s",
            "7/1d",
        ] {
            let q = quota(text);
            let log = !text.contains("counter");
            let mut state = super::Timeline::default();
            let mut now = T0;
            let mut most = 0;
            for (i, step) in run.iter().enumerate() {
                now = now.checked_add_signed(*step).unwrap_or(now);
                for cost in [1, 3, 9] {
                    let held = state.len() as u64;
                    let before = steps();
                    if log {
                        let (evaluate, commit) = (sliding_log::evaluate, sliding_log::commit);
                        check_with(&mut state, &q, now, cost, evaluate, commit);
                    } else {
                        let (evaluate, commit) =
                            (sliding_counter::evaluate, sliding_counter::commit);
                        check_with(&mut state, &q, now, cost, evaluate, commit);
                    }
                    let work = steps() - before;
                    most = most.max(work);
                    assert!(
                        work <= held + 1 + held.min(MAX_RETRY_WALK as u64),
                        "{text} step {i} cost {cost}: {work} iterations over {held} slots"
                    );
                }
            }
            assert!(most > 0, "{text}: the loops ran");
        }
    }
}
