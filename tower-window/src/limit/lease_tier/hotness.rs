//! Which keys are hot enough to lease, counted without a slot per key.
//!
//! Most keys never lease, and a lease slot each (cache entry, `Arc`, lock)
//! would cost them more than leases save. They are counted here instead,
//! in a fixed table of packed 64-bit entries; only a key found hot (or one
//! that already has a slot) looks at the slot cache.
//!
//! The table is two-way set associative: a key's hash picks a set of two
//! entries, and a 24-bit fingerprint tells whose count an entry holds. A key
//! without an entry takes the set's weaker one, so a hot key keeps its
//! entry while cold keys churn through the other. Entries are read and
//! written whole with relaxed atomics: a race may lose a count or an entry,
//! which only makes a key lease less (a cold key goes to the store
//! directly, which is exact), never admit more.

use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::key::state_key::StateKeyRef;

/// Sets in the table (a power of two): two 8-byte entries each, 256 KiB,
/// about 32,000 keys counted at once.
const SETS: usize = 1 << 14;

/// An entry, packed in a `u64`: 24 bits of fingerprint (never 0 for a used
/// entry), 7 bits of period number (the limiter's clock divided by the TTL,
/// modulo 128), 1 bit "the key has a slot", and 16 bits each of checks in
/// that period and in the one before it.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
struct Entry(u64);

impl Entry {
    const PERIOD_MASK: u64 = 0x7f;

    fn new(fingerprint: u32, period: u64, slotted: bool, seen: u16, before: u16) -> Self {
        Self(
            u64::from(fingerprint) << 40
                | (period & Self::PERIOD_MASK) << 33
                | u64::from(slotted) << 32
                | u64::from(seen) << 16
                | u64::from(before),
        )
    }

    fn fingerprint(self) -> u32 {
        (self.0 >> 40) as u32
    }

    fn period(self) -> u64 {
        (self.0 >> 33) & Self::PERIOD_MASK
    }

    fn slotted(self) -> bool {
        self.0 >> 32 & 1 == 1
    }

    fn seen(self) -> u16 {
        (self.0 >> 16) as u16
    }

    fn before(self) -> u16 {
        self.0 as u16
    }

    /// The entry's counts as of `period`: (this period's, the one before's),
    /// zero for periods that ended more than one period ago.
    fn counts_at(self, period: u64) -> (u16, u16) {
        match period.wrapping_sub(self.period()) & Self::PERIOD_MASK {
            0 => (self.seen(), self.before()),
            1 => (0, self.seen()),
            _ => (0, 0),
        }
    }

    /// How much the entry is worth keeping at `period` (the lesser goes).
    fn worth(self, period: u64) -> (bool, u32) {
        let (seen, before) = self.counts_at(period);
        (self.slotted(), u32::from(seen) + u32::from(before))
    }
}

/// What [`Hotness::count`] found for a key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Observed {
    /// Checks of the key in this period and the one before, this one
    /// included.
    pub(crate) checks: u32,
    /// See [`Hotness::mark`].
    pub(crate) slotted: bool,
}

/// Recent checks per key and policy, for [`LeaseConfig::hot_after`](super::LeaseConfig::hot_after).
pub(crate) struct Hotness {
    entries: Box<[AtomicU64]>,
    /// Fixed seeds: a key lands in the same set on every node and run.
    hasher: foldhash::fast::FixedState,
}

impl Hotness {
    pub(crate) fn new() -> Self {
        Self {
            entries: (0..SETS * 2).map(|_| AtomicU64::new(0)).collect(),
            hasher: foldhash::fast::FixedState::with_seed(0x7477_686f_7400_0001),
        }
    }

    /// The key's place: its set's first entry and its fingerprint.
    fn place(&self, key: &StateKeyRef<'_>) -> (usize, u32) {
        let hash = self.hasher.hash_one(key);
        let set = (hash as usize) & (SETS - 1);
        // The top 24 bits, never 0 (0 marks an empty entry).
        let fingerprint = ((hash >> 40) as u32).max(1);
        (set * 2, fingerprint)
    }

    /// Counts a check of `key` at `now` (µs) in periods of `ttl` µs, and
    /// answers the key's count over this period and the one before, this
    /// check included (so a key checked `n` times within one TTL counts at
    /// least `n`).
    ///
    /// A period's count stops at `enough`, so a hot key's checks write its
    /// entry once per period rather than bounce its cache line between
    /// cores.
    pub(crate) fn count(&self, key: &StateKeyRef<'_>, now: u64, ttl: u64, enough: u32) -> Observed {
        let (first, fingerprint) = self.place(key);
        let period = now / ttl.max(1);
        let ways = [
            Entry(self.entries[first].load(Ordering::Relaxed)),
            Entry(self.entries[first + 1].load(Ordering::Relaxed)),
        ];
        let (way, (mut seen, before), slotted) =
            match ways.iter().position(|e| e.fingerprint() == fingerprint) {
                Some(way) => (way, ways[way].counts_at(period), ways[way].slotted()),
                None => {
                    let way = usize::from(ways[1].worth(period) < ways[0].worth(period));
                    (way, (0, 0), false)
                }
            };
        if u32::from(seen) < enough {
            seen = seen.saturating_add(1);
            let entry = Entry::new(fingerprint, period, slotted, seen, before);
            self.entries[first + way].store(entry.0, Ordering::Relaxed);
        }
        Observed {
            checks: u32::from(seen) + u32::from(before),
            slotted,
        }
    }

    /// Marks whether `key` has a lease slot to look at while it is cold (to
    /// give back what its leases left). A key that loses its mark goes to
    /// the store directly while cold; its slot's units come back with its
    /// next reservation or [`refund_leases`](crate::Limiter::refund_leases).
    pub(crate) fn mark(&self, key: &StateKeyRef<'_>, slotted: bool) {
        let (first, fingerprint) = self.place(key);
        for index in [first, first + 1] {
            let entry = Entry(self.entries[index].load(Ordering::Relaxed));
            if entry.fingerprint() == fingerprint && entry.slotted() != slotted {
                let marked = Entry(entry.0 ^ 1 << 32);
                // Only if it is still the entry read: a racing count wins.
                let _ = self.entries[index].compare_exchange(
                    entry.0,
                    marked.0,
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                );
            }
        }
    }

    /// Forgets every count and mark (tests of eviction use it).
    #[cfg(test)]
    fn clear(&self) {
        for entry in self.entries.iter() {
            entry.store(0, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Policy, Quota, WindowKey};

    fn policy() -> Policy {
        Policy::from("100/1m".parse::<Quota>().expect("a valid quota"))
    }

    fn observe(hotness: &Hotness, subject: &str, now: u64) -> Observed {
        let key = WindowKey::for_subject(subject.to_owned());
        let policy = policy();
        hotness.count(
            &StateKeyRef::for_policy(&key, &policy),
            now,
            1_000,
            u32::MAX,
        )
    }

    #[test]
    fn entries_pack_and_unpack() {
        let entry = Entry::new(0xab_cdef, 130, true, 65_535, 7);
        assert_eq!(entry.fingerprint(), 0xab_cdef);
        assert_eq!(entry.period(), 130 % 128);
        assert!(entry.slotted());
        assert_eq!((entry.seen(), entry.before()), (65_535, 7));
        assert_eq!(entry.counts_at(130), (65_535, 7));
        assert_eq!(entry.counts_at(131), (0, 65_535));
        assert_eq!(entry.counts_at(132), (0, 0));
    }

    #[test]
    fn counts_this_period_and_the_one_before() {
        let hotness = Hotness::new();
        for (i, now) in [0, 200, 999].into_iter().enumerate() {
            assert_eq!(observe(&hotness, "a", now).checks, i as u32 + 1);
        }
        // The next period: the three before still count.
        assert_eq!(observe(&hotness, "a", 1_500).checks, 4);
        // Two periods on: only the one before (1 check) and this one.
        assert_eq!(observe(&hotness, "a", 2_100).checks, 2);
        // Long after: from zero.
        assert_eq!(observe(&hotness, "a", 9_000).checks, 1);
        // Another key counts apart.
        assert_eq!(observe(&hotness, "b", 9_000).checks, 1);
    }

    #[test]
    fn a_period_stops_counting_at_enough() {
        let hotness = Hotness::new();
        let key = WindowKey::for_subject("a");
        let policy = policy();
        let key = StateKeyRef::for_policy(&key, &policy);
        let counts: Vec<u32> = (0..6)
            .map(|i| hotness.count(&key, i, 1_000, 3).checks)
            .collect();
        assert_eq!(counts, [1, 2, 3, 3, 3, 3]);
        // The next period starts from the one before's 3.
        assert_eq!(hotness.count(&key, 1_000, 1_000, 3).checks, 4);
        assert_eq!(hotness.count(&key, 1_000, 1_000, 3).checks, 5);
    }

    #[test]
    fn marks_stay_with_the_key_until_unmarked() {
        let hotness = Hotness::new();
        let key = WindowKey::for_subject("a");
        let policy = policy();
        let key = StateKeyRef::for_policy(&key, &policy);
        assert!(!hotness.count(&key, 0, 1_000, u32::MAX).slotted);
        hotness.mark(&key, true);
        assert!(hotness.count(&key, 10, 1_000, u32::MAX).slotted);
        assert!(
            hotness.count(&key, 50_000, 1_000, u32::MAX).slotted,
            "marks outlive counts"
        );
        hotness.mark(&key, false);
        assert!(!hotness.count(&key, 50_001, 1_000, u32::MAX).slotted);
        hotness.clear();
        assert_eq!(hotness.count(&key, 50_002, 1_000, u32::MAX).checks, 1);
    }

    /// A hot key keeps its entry while 200,000 cold keys churn through the
    /// table (each set keeps the entry worth more), and a cold key never
    /// counts another's checks.
    #[test]
    fn a_hot_key_survives_churn() {
        let hotness = Hotness::new();
        // Two periods of 1,000 µs, 100,000 cold keys in each.
        for i in 0..200_000u32 {
            let now = u64::from(i) / 100;
            observe(&hotness, &format!("cold-{i}"), now);
            if i % 50 == 0 {
                let hot = observe(&hotness, "hot", now);
                assert_eq!(hot.checks, i / 50 + 1, "check {i}");
            }
        }
        for i in 199_000..200_000u32 {
            let cold = observe(&hotness, &format!("cold-{i}"), 1_999);
            assert!(cold.checks <= 2, "cold-{i}: {cold:?}");
        }
    }
}
