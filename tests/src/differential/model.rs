//! The reference model of one quota's window, for checks, quota leases and
//! settled usage, written from the algorithms' documented contracts (the
//! module docs of `tower_window::algorithm::*`, `tower_window::lease` and
//! `tower_window::limit::Limiter::settle`) with
//! plain data (every admission kept, nothing merged or dropped), and the
//! global bound of invariant 1 checked on what was admitted.

use std::collections::BTreeMap;

/// The algorithm of a quota, with its parameters (µs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Algo {
    /// Exact log of window `w`.
    Log,
    /// Buckets of width `g`.
    Counter {
        /// The bucket width.
        g: u64,
    },
    /// Aligned windows.
    Fixed,
    /// GCRA with capacity `burst`.
    Gcra {
        /// The capacity (the burst, else the limit).
        burst: u64,
    },
}

/// A quota as the model needs it.
#[derive(Debug, Clone, Copy)]
pub struct Params {
    /// The algorithm.
    pub algo: Algo,
    /// The window (µs).
    pub w: u64,
    /// The limit.
    pub l: u64,
}

impl Params {
    /// From a quota's configuration.
    pub fn of(quota: &tower_window::Quota) -> Self {
        let algo = match quota.algorithm() {
            tower_window::Algorithm::SlidingLog => Algo::Log,
            tower_window::Algorithm::SlidingCounter { granularity } => Algo::Counter {
                g: granularity.as_micros() as u64,
            },
            tower_window::Algorithm::FixedWindow => Algo::Fixed,
            _ => Algo::Gcra {
                burst: u64::from(quota.capacity()),
            },
        };
        Self {
            algo,
            w: quota.window_micros(),
            l: u64::from(quota.limit()),
        }
    }

    /// The most one request can ever get (a cost above never fits).
    pub fn capacity(&self) -> u64 {
        match self.algo {
            Algo::Gcra { burst } => burst,
            _ => self.l,
        }
    }

    fn interval(&self) -> u64 {
        self.w.div_ceil(self.l.max(1))
    }

    /// The latest deadline of a lease reserved at `t` (window or bucket end).
    pub fn deadline_cap(&self, t: u64) -> Option<u64> {
        match self.algo {
            Algo::Fixed => Some((t / self.w + 1) * self.w),
            Algo::Counter { g } => Some((t / g + 1) * g),
            _ => None,
        }
    }

    /// Whether a lease of `ttl` can ever be granted (GCRA dates tokens at
    /// the deadline: `ttl + T <= B T`).
    pub fn ttl_fits(&self, ttl: u64) -> bool {
        match self.algo {
            Algo::Gcra { burst } => ttl + self.interval() <= burst * self.interval(),
            _ => true,
        }
    }
}

/// What one quota says about a cost at a time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Eval {
    /// The cost fits.
    pub fits: bool,
    /// Remaining and reset as the window stands (before the cost).
    pub before: (u64, u64),
    /// Remaining and reset once the cost is recorded (when it fits).
    pub after: (u64, u64),
    /// The resets (before, after) leaving out slots whose units were all
    /// refunded: they count nothing, yet a store may still hold them (the
    /// embedded store keeps an empty log slot where Redis removes it), so a
    /// reset is allowed anywhere between the two.
    pub empty_slots_left_out: (u64, u64),
    /// For a cost that does not fit: `None` when it never can, else the
    /// exact wait, and the latest a store may report instead (the
    /// documented bounded walk reports `reset` past 128 slots).
    pub retry: Option<(u64, u64)>,
}

/// Where a lease's units are counted, for a refund.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Anchor {
    /// Fixed window `k`.
    Window(u64),
    /// Bucket `j`.
    Bucket(u64),
    /// A log entry at `ts` (the deadline).
    Entry(u64),
    /// GCRA: the arrival time the grant left, and the one before it.
    Tat(u64, u64),
}

/// One quota's window in the model.
#[derive(Debug, Clone, Default)]
pub struct Window {
    /// Log: every admission `(ts, units)` (leased ones at their deadline).
    log: Vec<(u64, u64)>,
    /// Counter: units per bucket.
    buckets: BTreeMap<u64, u64>,
    /// Fixed: the window index and its count (the documented state: a
    /// count of another window is over).
    fixed: Option<(u64, u64)>,
    /// GCRA: the theoretical arrival time.
    tat: u64,
    /// Admissions `(time, units)`: for the bound, and as the size of the
    /// state (the work bound).
    pub admitted: Vec<(u64, u64)>,
}

fn sat(a: u64, b: u64) -> u64 {
    a.saturating_sub(b)
}

impl Window {
    /// Slots the state holds (entries or buckets written, never dropped).
    pub fn slots(&self) -> u64 {
        (self.log.len() + self.buckets.len() + 1) as u64
    }

    /// Drops what no longer counts at `t`, as every check and reservation
    /// does (the contracts' step 1): a dropped entry or bucket stays gone
    /// when the clock steps back.
    pub fn expire(&mut self, p: &Params, t: u64) {
        match p.algo {
            Algo::Log => self.log.retain(|&(ts, _)| ts + p.w > t),
            Algo::Counter { g } => {
                let n = p.w / g;
                self.buckets.retain(|&j, _| (j + n + 1) * g > t);
            }
            _ => {}
        }
    }

    /// Evaluates `cost` at `t`.
    pub fn eval(&self, p: &Params, t: u64, cost: u64) -> Eval {
        match p.algo {
            Algo::Log => {
                let counted: Vec<(u64, u64)> = self
                    .log
                    .iter()
                    .copied()
                    .filter(|&(ts, _)| ts + p.w > t)
                    .collect();
                let expires = |ts: u64| ts + p.w - t;
                self.timeline(p, t, t, cost, counted, expires)
            }
            Algo::Counter { g } => {
                let n = p.w / g;
                let counted: Vec<(u64, u64)> = self
                    .buckets
                    .iter()
                    .map(|(&j, &u)| (j, u))
                    .filter(|&(j, _)| (j + n + 1) * g > t)
                    .collect();
                let expires = |j: u64| (j + n + 1) * g - t;
                self.timeline(p, t, t / g, cost, counted, expires)
            }
            Algo::Fixed => {
                let k = t / p.w;
                let count = match self.fixed {
                    Some((k0, c)) if k0 == k => c,
                    _ => 0,
                };
                let reset = (k + 1) * p.w - t;
                let before = (sat(p.l, count), reset);
                if cost > p.l {
                    return Eval {
                        fits: false,
                        before,
                        after: before,
                        empty_slots_left_out: (before.1, before.1),
                        retry: None,
                    };
                }
                if count + cost <= p.l {
                    return Eval {
                        fits: true,
                        before,
                        after: (p.l - count - cost, reset),
                        empty_slots_left_out: (reset, reset),
                        retry: None,
                    };
                }
                Eval {
                    fits: false,
                    before,
                    after: before,
                    empty_slots_left_out: (reset, reset),
                    retry: Some((reset, reset)),
                }
            }
            Algo::Gcra { burst } => {
                let i = p.interval();
                let tol = burst * i;
                let tat0 = self.tat.max(t);
                let backlog = tat0 - t;
                let before = (sat(tol, backlog) / i, backlog);
                if cost > burst {
                    return Eval {
                        fits: false,
                        before,
                        after: before,
                        empty_slots_left_out: (before.1, before.1),
                        retry: None,
                    };
                }
                let ahead = tat0 + cost * i - t;
                if ahead <= tol {
                    return Eval {
                        fits: true,
                        before,
                        after: ((tol - ahead) / i, ahead),
                        empty_slots_left_out: (backlog, ahead),
                        retry: None,
                    };
                }
                Eval {
                    fits: false,
                    before,
                    after: before,
                    empty_slots_left_out: (backlog, backlog),
                    retry: Some((ahead - tol, ahead - tol)),
                }
            }
        }
    }

    /// The log and the counter: slots `(at, units)` counted now, each until
    /// `t + expires(at)`.
    fn timeline(
        &self,
        p: &Params,
        _t: u64,
        now_slot: u64,
        cost: u64,
        mut counted: Vec<(u64, u64)>,
        expires: impl Fn(u64) -> u64,
    ) -> Eval {
        counted.sort_unstable();
        let used: u64 = counted.iter().map(|&(_, u)| u).sum();
        let newest = counted.last().map(|&(at, _)| at);
        let reset = newest.map_or(0, &expires);
        let newest_full = counted
            .iter()
            .rev()
            .find(|&&(_, u)| u > 0)
            .map(|&(at, _)| at);
        let reset_full = newest_full.map_or(0, &expires);
        let before = (sat(p.l, used), reset);
        let fits = cost <= p.l && used + cost <= p.l;
        let after_of = |n: Option<u64>| expires(n.map_or(now_slot, |n| n.max(now_slot)));
        let alt = (
            reset_full,
            if fits {
                after_of(newest_full)
            } else {
                reset_full
            },
        );
        if cost > p.l {
            return Eval {
                fits: false,
                before,
                after: before,
                empty_slots_left_out: alt,
                retry: None,
            };
        }
        if fits {
            return Eval {
                fits: true,
                before,
                after: (p.l - used - cost, after_of(newest)),
                empty_slots_left_out: alt,
                retry: None,
            };
        }
        let mut freed = 0;
        let mut exact = reset_full.min(reset);
        for &(at, u) in &counted {
            freed += u;
            if used - freed + cost <= p.l {
                exact = expires(at);
                break;
            }
        }
        Eval {
            fits: false,
            before,
            after: before,
            empty_slots_left_out: alt,
            retry: Some((exact, reset.max(reset_full))),
        }
    }

    /// Records an admission of `cost` at `t` (after [`eval`](Self::eval) said it fits).
    pub fn commit(&mut self, p: &Params, t: u64, cost: u64) {
        self.admitted.push((t, cost));
        match p.algo {
            Algo::Log => self.log.push((t, cost)),
            Algo::Counter { g } => *self.buckets.entry(t / g).or_default() += cost,
            Algo::Fixed => {
                let k = t / p.w;
                self.fixed = Some(match self.fixed {
                    Some((k0, c)) if k0 == k => (k, c + cost),
                    _ => (k, cost),
                });
            }
            Algo::Gcra { .. } => self.tat = self.tat.max(t) + cost * p.interval(),
        }
    }

    /// Units a lease reserved at `t` with deadline `d` may take.
    pub fn room(&self, p: &Params, t: u64, d: u64) -> u64 {
        match p.algo {
            Algo::Gcra { burst } => {
                let i = p.interval();
                sat(t + burst * i, self.tat.max(d)) / i
            }
            _ => self.eval(p, t, 1).before.0,
        }
    }

    /// Records a lease of `g` units reserved at `t` with deadline `d`:
    /// where they count, and the reset the reservation reports.
    pub fn lease(&mut self, p: &Params, t: u64, d: u64, g: u64) -> (Anchor, u64) {
        match p.algo {
            Algo::Log => {
                self.log.push((d, g));
                (Anchor::Entry(d), d + p.w - t)
            }
            Algo::Counter { g: width } => {
                let j = t / width;
                *self.buckets.entry(j).or_default() += g;
                (Anchor::Bucket(j), (j + p.w / width + 1) * width - t)
            }
            Algo::Fixed => {
                self.commit(p, t, g);
                self.admitted.pop();
                let k = t / p.w;
                (Anchor::Window(k), (k + 1) * p.w - t)
            }
            Algo::Gcra { .. } => {
                let prior = self.tat;
                self.tat = self.tat.max(d) + g * p.interval();
                (Anchor::Tat(self.tat, prior), self.tat - t)
            }
        }
    }

    /// Whether a later grant moved the GCRA arrival time past `tat`.
    pub fn tat_moved(&self, tat: u64) -> bool {
        self.tat != tat
    }

    /// Whether a lease's units still count at `now`.
    pub fn still_counts(&self, p: &Params, anchor: Anchor, now: u64) -> bool {
        match (anchor, p.algo) {
            (Anchor::Window(k), _) => now / p.w == k && self.fixed.is_some_and(|(k0, _)| k0 == k),
            (Anchor::Bucket(j), Algo::Counter { g }) => (j + p.w / g + 1) * g > now,
            (Anchor::Entry(ts), _) => ts + p.w > now,
            (Anchor::Tat(tat, _), _) => self.tat == tat && tat > now,
            _ => false,
        }
    }

    /// Takes back up to `units` of a lease of `granted` counted at
    /// `anchor`, where they still count (see `still_counts`); how many.
    pub fn refund(&mut self, p: &Params, anchor: Anchor, granted: u64, units: u64) -> u64 {
        match anchor {
            Anchor::Window(k) => match &mut self.fixed {
                Some((k0, c)) if *k0 == k => {
                    let taken = units.min(*c);
                    *c -= taken;
                    taken
                }
                _ => 0,
            },
            Anchor::Bucket(j) => match self.buckets.get_mut(&j) {
                Some(c) => {
                    let taken = units.min(*c);
                    *c -= taken;
                    taken
                }
                None => 0,
            },
            Anchor::Entry(ts) => {
                let mut left = units;
                for entry in self.log.iter_mut().filter(|e| e.0 == ts) {
                    let taken = left.min(entry.1);
                    entry.1 -= taken;
                    left -= taken;
                }
                units - left
            }
            Anchor::Tat(tat, prior) => {
                if self.tat != tat {
                    return 0;
                }
                self.tat = if units >= granted {
                    prior
                } else {
                    tat - units * p.interval()
                };
                units
            }
        }
    }

    /// Settles `used` units of a reservation admitted at `at`, at `now`
    /// (the contract of `Limiter::settle`) that recorded `reserved` units
    /// in this window (none where it recorded nothing: a shadow quota it
    /// did not fit). Units reserved and not used are taken back where the
    /// reservation put them (the window of `at`, its bucket, its log entry)
    /// while they still count; usage past `reserved` is recorded now, past
    /// the limit if need be. Like every call it drops what no longer
    /// counts. Answers whether units were recorded past the limit (debt:
    /// never an admission, so left out of the bound).
    pub fn settle(&mut self, p: &Params, now: u64, at: u64, reserved: u64, used: u64) -> bool {
        let anchor = match p.algo {
            Algo::Fixed => Some(Anchor::Window(at / p.w)),
            Algo::Counter { g } => Some(Anchor::Bucket(at / g)),
            Algo::Log => Some(Anchor::Entry(at)),
            // Never reserved: a reservation on gcra is refused.
            Algo::Gcra { .. } => None,
        };
        if let (true, Some(anchor)) = (used < reserved, anchor) {
            // The admission was that much smaller (the bound's input).
            let mut left = self.refund(p, anchor, reserved, reserved - used);
            for entry in self.admitted.iter_mut().filter(|e| e.0 == at) {
                let taken = left.min(entry.1);
                entry.1 -= taken;
                left -= taken;
            }
        }
        self.expire(p, now);
        if used <= reserved {
            return false;
        }
        let debt = used - reserved;
        let past = !self.eval(p, now, debt).fits;
        self.commit(p, now, debt);
        self.admitted.pop();
        past
    }

    /// Invariant 1 on what was admitted (directly or spent from leases):
    /// `Err` describes the first violation.
    pub fn check_bound(&self, p: &Params, spends: &[(u64, u64)]) -> Result<(), String> {
        let mut all: Vec<(u64, u64)> = self.admitted.iter().chain(spends).copied().collect();
        all.sort_unstable();
        match p.algo {
            Algo::Log | Algo::Counter { .. } => {
                for &(s, _) in &all {
                    let sum: u64 = all
                        .iter()
                        .filter(|&&(a, _)| a + p.w > s && a <= s)
                        .map(|&(_, u)| u)
                        .sum();
                    if sum > p.l {
                        return Err(format!(
                            "{sum} units admitted in the window ending at {s} (limit {})",
                            p.l
                        ));
                    }
                }
            }
            Algo::Fixed => {
                let mut per: BTreeMap<u64, u64> = BTreeMap::new();
                for &(a, u) in &all {
                    *per.entry(a / p.w).or_default() += u;
                }
                if let Some((k, sum)) = per.iter().find(|(_, &sum)| sum > p.l) {
                    return Err(format!(
                        "{sum} units admitted in aligned window {k} (limit {})",
                        p.l
                    ));
                }
            }
            Algo::Gcra { burst } => {
                let i = p.interval();
                for a in 0..all.len() {
                    let mut n = 0;
                    for b in a..all.len() {
                        n += all[b].1;
                        if n * i > burst * i + (all[b].0 - all[a].0) {
                            return Err(format!(
                                "{n} units admitted in [{}, {}]: more than the burst {burst} plus the rate",
                                all[a].0, all[b].0
                            ));
                        }
                    }
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::{Algo, Params, Window};

    /// The bound counts spent lease units with direct admissions: one of
    /// each in a window of a limit of 1 is an over-admission (what a
    /// refund naming a spent unit let the stores do).
    #[test]
    fn a_spent_unit_and_an_admission_past_the_limit_break_the_bound() {
        let p = Params {
            algo: Algo::Counter { g: 10_000 },
            w: 2_000_000,
            l: 1,
        };
        let mut window = Window::default();
        window.admitted.push((2_010_000, 1));
        assert!(window.check_bound(&p, &[]).is_ok());
        assert!(window.check_bound(&p, &[(2_010_000, 1)]).is_err());
        assert!(window.check_bound(&p, &[(10_000, 1)]).is_ok());
    }
}
