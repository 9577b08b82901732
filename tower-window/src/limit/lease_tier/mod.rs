//! The lease tier: per-key quota leases a node holds and spends locally.
//!
//! With leases on ([`LimiterBuilder::leases`](crate::LimiterBuilder::leases)),
//! a check of a hot key first spends from the key's live lease, with no
//! store call ([`DecisionSource::Lease`](crate::DecisionSource::Lease)).
//! When the lease is empty or past its deadline, the check reserves a new
//! one in one store call ([`lease::Backend::reserve`](crate::lease::Backend::reserve)) that
//! also admits the check itself; what an expired lease left unspent is
//! refunded first. The store decides how many units a lease gets (at most
//! half of what is left, so one node cannot take a window while others
//! wait; see [`crate::lease`], "How much one lease takes"), and guarantees
//! the global bound.
//!
//! # Spending at memory speed
//!
//! A key's leases sit behind a short synchronous lock that is never held
//! across an `await`: a spend takes it, takes the units and lets go, so a
//! check that finds units in a live lease completes in its first poll,
//! whatever reservation of that key is in flight. Reservations are
//! single-flight per key: at most one is in flight, and a check that finds
//! the lease truly empty waits for that one (or, if none is in flight,
//! sends it) instead of sending its own. With
//! [`refill_ahead`](LeaseConfig::refill_ahead) (the default) the check whose
//! spend leaves half of the lease size or less sends the next reservation
//! and answers once it is back, while every other check keeps spending what
//! is left: a hot key waits for the store only when its lease runs dry
//! before the reservation comes back. A lease reserved ahead of need is
//! spent after the one before it.
//!
//! # Which keys lease
//!
//! Only keys hot enough to pay for a lease: a key checked at least
//! [`hot_after`](LeaseConfig::hot_after) times (default 8) within one lease
//! TTL, counted per key and policy over the current TTL-long period and the
//! one before it. The checks of other keys go to the store directly, as
//! without leases (one store call each, no reservation to refund), and cost
//! the tier one look at a fixed table of recent counts (`hotness.rs`): a
//! key gets a lease slot only once it is hot. A leased key that cools below
//! the rule gives back what its leases left at its next check and is
//! decided directly again.
//!
//! # Size, deadline, bound
//!
//! Lease size adapts per key: it starts at one unit, doubles each time a
//! lease is used up (or reaches the low watermark) before its deadline, halves
//! when one expires with units left, and never exceeds
//! [`LeaseConfig::max_units`].
//!
//! The local deadline is the limiter's clock reading when the reservation
//! was sent plus the lease's length on the store's clock, so it is never
//! later than the store's deadline (the reply comes after the store read
//! its clock), whatever the skew between the clocks.
//!
//! The tier is bounded like the local tier: a bounded cache of keys, one
//! small entry per key; a key evicted with a live lease loses its unspent
//! units until the store's records expire (under-admission, never over).
//!
//! A [shadow](crate::Quota::shadowed) quota of a leased policy is counted,
//! never enforced (see [`crate::lease`]): it holds part of each
//! lease (what it had room for), and a spend is its would-be admission
//! while that hold has the spend's units, its would-be denial otherwise —
//! reported in the admission's [`Decision::quotas`] and
//! [`Decision::shadow_denials`], so in `tower_window_shadow_denials_total`
//! and the `RateLimit-Policy` header as for a check that reached the store.
//! What a shadow quota still holds goes back with the lease's refund.
//!
//! [`Limiter::discard_leases`](crate::Limiter::discard_leases) (a tenant's
//! reset) drops every lease held, and a reservation in flight at that
//! moment is dropped when it comes back: no unit reserved before a reset
//! is spent after it.

use std::fmt;
use std::pin::pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use quick_cache::sync::{Cache, DefaultLifecycle};
use quick_cache::{DefaultHashBuilder, UnitWeighter};

use crate::key::state_key::{bounded_options, StateKey, StateKeyRef};
use crate::store::CheckRequest;
use crate::{Decision, Policy, WindowKey};

mod config;
mod hotness;
mod slot;

pub use config::{LeaseConfig, LeaseStats};
use hotness::{Hotness, Looked};
use slot::{shadow_holds, Held, Slot, Spend};

#[derive(Default)]
pub(crate) struct LeaseCounters {
    pub(crate) granted: AtomicU64,
    pub(crate) spent: AtomicU64,
    pub(crate) refunded: AtomicU64,
    pub(crate) expired: AtomicU64,
    pub(crate) returned: AtomicU64,
    pub(crate) reservations: AtomicU64,
    pub(crate) waits: AtomicU64,
}

type SlotCache = Cache<
    StateKey,
    Arc<Slot>,
    UnitWeighter,
    DefaultHashBuilder,
    DefaultLifecycle<StateKey, Arc<Slot>>,
>;

/// The leases of one limiter, by key and policy.
pub(crate) struct LeaseTier {
    slots: SlotCache,
    /// Recent checks per key: only a key found hot, or one with a slot,
    /// looks at `slots`.
    hotness: Hotness,
    pub(crate) config: LeaseConfig,
    pub(crate) counters: LeaseCounters,
    /// Set once the store answered that it does not support leases:
    /// checks then go to the store directly, without asking again.
    unsupported: AtomicBool,
    /// Moved by every discard: a reservation sent before it is not kept.
    epoch: AtomicU64,
}

/// What the lease tier answered a check without waiting.
pub(crate) enum Leased {
    /// Spent from a live lease (or denied until the key's next lease
    /// starts); with `Some(slot)` this check also reserves the key's next
    /// lease ahead of need, and answers once it is back.
    Spent(Decision, Option<Arc<Slot>>),
    /// A key too cold to lease: decide in the store directly.
    Direct,
    /// The lease is empty: wait for the reservation in flight, or send it
    /// (whether the key is hot: a cold one decides directly instead).
    Empty(Arc<Slot>, bool),
}

impl LeaseTier {
    pub(crate) fn new(config: LeaseConfig, capacity: u64) -> Self {
        Self {
            slots: Cache::with_options(
                bounded_options(capacity.max(1)),
                UnitWeighter,
                DefaultHashBuilder::default(),
                DefaultLifecycle::default(),
            ),
            hotness: Hotness::new(),
            config,
            counters: LeaseCounters::default(),
            unsupported: AtomicBool::new(false),
            epoch: AtomicU64::new(0),
        }
    }

    /// Whether checks of `policy` lease: the store supports leases and the
    /// TTL leaves room in every quota (else checks decide directly).
    #[cfg(feature = "tower")]
    pub(crate) fn applies(&self, policy: &Policy) -> bool {
        self.lease_ttl(policy).is_some()
    }

    /// The lease TTL of `policy` in µs, if its checks lease (see
    /// [`applies`](Self::applies)).
    pub(crate) fn lease_ttl(&self, policy: &Policy) -> Option<u64> {
        if self.unsupported.load(Ordering::Relaxed) {
            return None;
        }
        let ttl = self.config.ttl_micros_for(policy);
        policy
            .quotas()
            .iter()
            .all(|quota| crate::algorithm::lease::ttl_fits(quota, ttl))
            .then_some(ttl)
    }

    /// The lease slot of `key` under `policy`, made on first use.
    fn slot(&self, key: &WindowKey, policy: &Policy) -> Arc<Slot> {
        if let Some(slot) = self.slots.get(&StateKeyRef::for_policy(key, policy)) {
            return slot;
        }
        let owned = StateKey::for_policy(key, policy);
        match self.slots.get_or_insert_with(&owned, || {
            Ok::<_, std::convert::Infallible>(Arc::new(Slot::new()))
        }) {
            Ok(slot) => slot,
            Err(never) => match never {},
        }
    }

    /// Every slot (for refunds on shutdown).
    fn all(&self) -> Vec<Arc<Slot>> {
        self.slots.iter().map(|(_, slot)| slot).collect()
    }

    fn stats(&self) -> LeaseStats {
        let c = &self.counters;
        LeaseStats {
            granted: c.granted.load(Ordering::Relaxed),
            spent: c.spent.load(Ordering::Relaxed),
            refunded: c.refunded.load(Ordering::Relaxed),
            expired_unspent: c.expired.load(Ordering::Relaxed),
            returned: c.returned.load(Ordering::Relaxed),
            reservations: c.reservations.load(Ordering::Relaxed),
            waits: c.waits.load(Ordering::Relaxed),
        }
    }
}

impl fmt::Debug for LeaseTier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LeaseTier")
            .field("config", &self.config)
            .field("keys", &self.slots.len())
            .finish()
    }
}

/// The one reservation a slot has in flight: when it ends, however it ends
/// (answered, failed, or its check dropped), the slot may reserve again and
/// the checks waiting for it look at the slot again.
struct Flight<'a>(&'a Slot);

impl Drop for Flight<'_> {
    fn drop(&mut self) {
        self.0.lock().refilling = false;
        self.0.refilled.notify_waiters();
    }
}

/// What [`Limiter::spend_at_once`](super::Limiter) found.
#[cfg(feature = "tower")]
pub(crate) enum SpentAtOnce {
    /// Spent from a live lease: the check's decision.
    Spent(Decision),
    /// Too cold to lease (counted): decide in the store directly.
    Cold,
    /// Nothing done.
    Not,
}

/// What a check with an empty lease does next.
enum Step {
    /// Spent from a lease that came back meanwhile.
    Spent(Decision),
    /// Answered by a remembered denial, or denied until the key's next
    /// lease starts.
    Remembered(Decision),
    /// Waits for the reservation in flight.
    Wait,
    /// The reservation it waited for failed: the fallback decides.
    Failed(crate::StoreErrorKind),
    /// Reserves: the clock, the leases to give back, the units wanted, the
    /// discard epoch.
    Reserve(u64, Vec<Held>, u32, u64),
}

/// What a reservation leaves to do once it is back.
enum Reserved {
    /// A lease, kept in the slot; the reservation's decision.
    Lease(Decision),
    /// Nothing granted: the latest deadline of the leases outstanding.
    Nothing(Option<u64>),
}

impl super::Limiter {
    /// How hot `key` is now (not counted yet), with its state key and the
    /// clock reading the look used.
    fn look_hot<'a>(
        &self,
        tier: &'a LeaseTier,
        ttl: u64,
        key: &'a WindowKey,
        policy: &'a Policy,
    ) -> (StateKeyRef<'a>, u64, Looked<'a>) {
        let state_key = StateKeyRef::for_policy(key, policy);
        let now = self.inner.clock.now_micros();
        let looked = tier
            .hotness
            .look_at(&state_key, now, ttl, tier.config.hot_checks);
        (state_key, now, looked)
    }

    /// The lease tier's answer without waiting: a spend from a live lease
    /// (the whole check, in its first poll), or what the check must do;
    /// `ttl` is the policy's [`lease_ttl`](LeaseTier::lease_ttl).
    pub(super) fn spend_leased(
        &self,
        tier: &LeaseTier,
        ttl: u64,
        key: &WindowKey,
        policy: &Policy,
        units: u32,
    ) -> Leased {
        let inner = &*self.inner;
        let (state_key, now, looked) = self.look_hot(tier, ttl, key, policy);
        let observed = looked.observed;
        looked.count();
        let hot = observed.checks >= tier.config.hot_checks;
        if !hot && !observed.slotted {
            // Cold, with no slot to give back from: as without leases, and
            // without touching the slot cache.
            return Leased::Direct;
        }
        let slot = tier.slot(key, policy);
        if !observed.slotted {
            tier.hotness.mark(&state_key, true);
        }
        let mut state = slot.lock();
        let now = state.dated(now, &*inner.clock);
        match state.spend(now, units) {
            Spend::Spent(decision) => {
                let refill = tier.config.refill_ahead && hot && !state.refilling && state.low();
                if refill {
                    state.refilling = true;
                }
                drop(state);
                self.count_spent(tier, policy, units);
                return Leased::Spent(decision, refill.then_some(slot));
            }
            Spend::Later(decision) => {
                drop(state);
                inner.stats.local_cache.fetch_add(1, Ordering::Relaxed);
                return Leased::Spent(decision, None);
            }
            Spend::Empty => {}
        }
        if !hot && !state.refilling && state.held.is_empty() && state.retired.is_empty() {
            drop(state);
            // Nothing left to give back: while cold, skip the slot.
            tier.hotness.mark(&state_key, false);
            return Leased::Direct;
        }
        drop(state);
        Leased::Empty(slot, hot)
    }

    /// A spend from a live lease that needs nothing more (no reservation
    /// ahead of need, no wait), for a caller that would otherwise build a
    /// future; or a key too cold to lease, counted as such (it goes to the
    /// store directly, as [`spend_leased`](Self::spend_leased) would send
    /// it); else nothing counted or changed, and the check goes through
    /// `spend_leased`.
    #[cfg(feature = "tower")]
    pub(super) fn spend_at_once(
        &self,
        tier: &LeaseTier,
        ttl: u64,
        key: &WindowKey,
        policy: &Policy,
        units: u32,
    ) -> SpentAtOnce {
        let inner = &*self.inner;
        let hot_checks = tier.config.hot_checks;
        let (state_key, now, looked) = self.look_hot(tier, ttl, key, policy);
        let seen = looked.observed;
        if !seen.slotted {
            if seen.checks >= hot_checks {
                // Hot, without a slot yet: `spend_leased` makes one.
                return SpentAtOnce::Not;
            }
            looked.count();
            return SpentAtOnce::Cold;
        }
        let Some(slot) = tier.slots.get(&state_key) else {
            return SpentAtOnce::Not;
        };
        let mut state = slot.lock();
        let now = state.dated(now, &*inner.clock);
        let hot = seen.checks >= hot_checks;
        let refill_wanted = tier.config.refill_ahead && hot && !state.refilling;
        if !state.spends_at_once(now, units, refill_wanted) {
            return SpentAtOnce::Not;
        }
        looked.count();
        let Spend::Spent(decision) = state.spend(now, units) else {
            // `spends_at_once` said it would, under the same lock.
            return SpentAtOnce::Not;
        };
        drop(state);
        self.count_spent(tier, policy, units);
        SpentAtOnce::Spent(decision)
    }

    fn count_spent(&self, tier: &LeaseTier, policy: &Policy, units: u32) {
        let inner = &*self.inner;
        tier.counters
            .spent
            .fetch_add(u64::from(units), Ordering::Relaxed);
        inner.stats.lease.fetch_add(1, Ordering::Relaxed);
        inner
            .metrics
            .lease_units(policy.first(), "spent", u64::from(units));
    }

    /// A check whose key's lease is empty: waits for the reservation in
    /// flight and spends from it, else answers a remembered denial, else
    /// sends the reservation itself (refunding what the old leases left), or
    /// for a key too cold to lease decides in the store directly.
    pub(super) async fn decide_leased(
        &self,
        tier: &LeaseTier,
        slot: Arc<Slot>,
        hot: bool,
        key: &WindowKey,
        policy: &Policy,
        cost: crate::Cost,
    ) -> Result<Decision, super::LimitError> {
        let inner = &*self.inner;
        let units = cost.get();
        let mut waited = false;
        let (now, old, want, epoch) = loop {
            // Registered before the look, so the end of a flight cannot
            // slip between the look and the wait.
            let mut notified = pin!(slot.refilled.notified());
            notified.as_mut().enable();
            let step = {
                let mut state = slot.lock();
                let now = inner.clock.now_micros();
                let spend = state.spend(now, units);
                if let Spend::Spent(decision) = spend {
                    Step::Spent(decision)
                } else if let Spend::Later(decision) = spend {
                    Step::Remembered(decision)
                } else if state.refilling {
                    Step::Wait
                } else if let Some(kind) = state.failed.filter(|_| waited) {
                    Step::Failed(kind)
                } else if let Some(decision) = inner.local.as_ref().and_then(|local| {
                    match local.lookup(key, policy, units, None) {
                        super::Lookup::Hit(decision) => Some(decision),
                        super::Lookup::Miss { .. } => None,
                    }
                }) {
                    Step::Remembered(decision)
                } else {
                    // This check reserves. The leases held cannot pay for it
                    // (empty, too small or over): give back what they left
                    // (a shadow quota's leftover too).
                    state.refilling = true;
                    let old = state.take_all();
                    let leftover_expired = old
                        .iter()
                        .any(|held| held.left > 0 && now >= held.local_deadline);
                    let max_units = tier.config.max_units.max(1);
                    let want = state.next_want(now, max_units, leftover_expired).max(units);
                    Step::Reserve(now, old, want, tier.epoch.load(Ordering::Acquire))
                }
            };
            match step {
                Step::Spent(decision) => {
                    self.count_spent(tier, policy, units);
                    return Ok(decision);
                }
                Step::Remembered(decision) => {
                    inner.stats.local_cache.fetch_add(1, Ordering::Relaxed);
                    return Ok(decision);
                }
                Step::Failed(kind) => {
                    let error = crate::StoreError::new(
                        kind,
                        "the quota lease reservation this check waited for failed",
                    );
                    return self.fall_back(CheckRequest::new(key, policy, cost), error);
                }
                Step::Wait => {
                    if !waited {
                        waited = true;
                        tier.counters.waits.fetch_add(1, Ordering::Relaxed);
                    }
                    notified.await;
                }
                Step::Reserve(now, old, want, epoch) => break (now, old, want, epoch),
            }
        };
        let flight = Flight(&slot);
        for held in &old {
            self.refund_held(tier, held, now >= held.local_deadline)
                .await;
        }
        if !hot {
            // Cooled down: this check and the next ones go to the store.
            drop(flight);
            return self.decide_direct(key, policy, cost, None).await;
        }
        let reserved = self
            .reserve(tier, &slot, key, policy, want, units, epoch)
            .await;
        drop(flight);
        match reserved {
            Ok(Reserved::Lease(decision)) => {
                inner.stats.store.fetch_add(1, Ordering::Relaxed);
                Ok(decision)
            }
            // Nothing to lease: the store decides this check exactly (one
            // more call, then the denial is remembered), and a denial waits
            // no longer than the leases other nodes hold.
            Ok(Reserved::Nothing(held_until)) => {
                self.decide_direct(key, policy, cost, held_until).await
            }
            Err(error) => self.fall_back(CheckRequest::new(key, policy, cost), error),
        }
    }

    /// A check that left the key's lease at its low watermark: it was
    /// admitted with `decision`, and reserves the next lease before it
    /// answers (other checks keep spending meanwhile). A reservation that
    /// fails or grants nothing changes nothing: the check that finds the
    /// lease empty decides.
    pub(super) async fn refill_ahead(
        &self,
        tier: &LeaseTier,
        slot: Arc<Slot>,
        key: &WindowKey,
        policy: &Policy,
        decision: Decision,
    ) -> Result<Decision, super::LimitError> {
        let inner = &*self.inner;
        let flight = Flight(&slot);
        let (now, old, want, epoch) = {
            let mut state = slot.lock();
            let now = inner.clock.now_micros();
            let old = std::mem::take(&mut state.retired);
            let leftover_expired = old
                .iter()
                .any(|held| held.left > 0 && now >= held.local_deadline);
            let max_units = tier.config.max_units.max(1);
            let want = state.next_want(now, max_units, leftover_expired);
            (now, old, want, tier.epoch.load(Ordering::Acquire))
        };
        for held in &old {
            self.refund_held(tier, held, now >= held.local_deadline)
                .await;
        }
        if let Err(error) = self.reserve(tier, &slot, key, policy, want, 0, epoch).await {
            tracing::debug!(
                kind = error.kind().as_str(),
                "quota lease reservation ahead of need failed; the key's next empty lease decides"
            );
        }
        drop(flight);
        Ok(decision)
    }

    /// Reserves up to `want` units for `key` (at least `spend`, which the
    /// reserving check spends at once, or 1 when none does) and keeps the
    /// lease in `slot`, unless the leases were discarded since `epoch`.
    #[allow(clippy::too_many_arguments)]
    async fn reserve(
        &self,
        tier: &LeaseTier,
        slot: &Slot,
        key: &WindowKey,
        policy: &Policy,
        want: u32,
        spend: u32,
        epoch: u64,
    ) -> Result<Reserved, crate::StoreError> {
        let inner = &*self.inner;
        let ttl = tier.config.ttl_for(policy);
        let at_least = spend.max(1);
        // A GCRA lease may start up to one TTL later, so that a near-empty
        // bucket gives a lease of the tokens it frees meanwhile rather than
        // of one token (a check that reserves it is denied until it starts:
        // the bucket had less room than the lease wanted, so the key is at
        // its limit).
        let request =
            crate::lease::ReserveRequest::new(key, policy, want.max(at_least), at_least, ttl)
                .waiting_up_to(ttl);
        let sent = inner.clock.now_micros();
        tier.counters.reservations.fetch_add(1, Ordering::Relaxed);
        let reserved = self
            .call_leases(key, policy, |leases, g| leases.reserve(g, request))
            .await;
        let reservation = match reserved {
            Ok(reservation) => reservation,
            Err(error) => {
                let kind = error.kind();
                if kind == crate::StoreErrorKind::Unsupported {
                    tracing::warn!(
                        "the store does not support quota leases: checks go to it directly"
                    );
                    tier.unsupported.store(true, Ordering::Relaxed);
                }
                if !matches!(
                    kind,
                    crate::StoreErrorKind::Unsupported | crate::StoreErrorKind::InvalidRequest
                ) {
                    slot.lock().failed = Some(kind);
                    return Err(error);
                }
                // No lease for this store or policy (a GCRA quota too
                // small for the TTL, say): decide directly.
                crate::lease::Reservation::empty(0, None)
            }
        };
        slot.lock().failed = None;
        let held_until = reservation.held_until_micros;
        let (Some(lease), Some(decision)) = (reservation.lease, reservation.decision) else {
            // The window is full: no more reservations ahead of need until
            // one grants again (the check that finds the lease empty asks).
            slot.lock().last_granted = 0;
            return Ok(Reserved::Nothing(held_until));
        };
        let granted = lease.granted;
        tier.counters
            .granted
            .fetch_add(u64::from(granted), Ordering::Relaxed);
        inner
            .metrics
            .lease_units(policy.first(), "granted", u64::from(granted));
        // Never earlier than the store's start: the reply came after the
        // store read its clock.
        let wait = lease
            .not_before_micros
            .saturating_sub(reservation.now_micros);
        let local_not_before = if wait == 0 {
            // Spendable at once (a check that read the clock just before
            // this reply must not find it "later").
            0
        } else {
            inner.clock.now_micros().saturating_add(wait)
        };
        let later = wait > 0;
        // A lease that starts later admits nobody now (it is only reserved
        // ahead of need, where nobody spends with the reservation).
        let spend = if later { 0 } else { spend };
        if spend > 0 {
            tier.counters
                .spent
                .fetch_add(u64::from(spend), Ordering::Relaxed);
            inner
                .metrics
                .lease_units(policy.first(), "spent", u64::from(spend));
        }
        let length = lease.deadline_micros.saturating_sub(reservation.now_micros);
        let local_deadline = sent.saturating_add(length);
        let left = granted.saturating_sub(spend);
        let shadow_left = shadow_holds(policy, &lease, spend);
        // What a spend of it reports: an admission (a lease that starts
        // later came with a denial until then, for the reserving check).
        let template = if later {
            let states = decision.quotas().iter().map(|state| {
                crate::QuotaDecision::allow(state.quota.clone(), 0, state.reset_after)
            });
            crate::Decision::from_quotas(states)
                .map(|d| d.with_timestamp_micros(decision.timestamp_micros))
                .unwrap_or_else(|| decision.clone())
        } else {
            decision.clone()
        };
        let held = Held {
            lease,
            left,
            shadow_left,
            local_deadline,
            local_not_before,
            sent,
            decision: template,
            key: key.clone(),
            policy: policy.clone(),
        };
        {
            let mut state = slot.lock();
            // A discard since the reservation was sent: its units belong to
            // the windows before the reset and are never spent (the store's
            // records expire).
            if tier.epoch.load(Ordering::Acquire) == epoch {
                state.last_deadline = local_deadline;
                state.last_granted = granted;
                // Kept while it holds anything: a shadow quota's leftover
                // goes back with the refund even when nothing else is left.
                if held.holds_anything() {
                    state.held.push(held);
                }
            }
        }
        if let Some(local) = &inner.local {
            local.forget(key, policy);
        }
        Ok(Reserved::Lease(decision))
    }

    /// The store decides this check as without leases (one call; a denial
    /// is remembered by the local tier). `held_until` (store clock): the
    /// latest deadline of the leases outstanding, which a denial waits no
    /// longer than.
    async fn decide_direct(
        &self,
        key: &WindowKey,
        policy: &Policy,
        cost: crate::Cost,
        held_until: Option<u64>,
    ) -> Result<Decision, super::LimitError> {
        let inner = &*self.inner;
        match self.check_store(CheckRequest::new(key, policy, cost)).await {
            Ok(mut decision) => {
                inner.stats.store.fetch_add(1, Ordering::Relaxed);
                // On the store's clock: the latest outstanding deadline,
                // from this decision's time.
                if let (false, Some(held_until), Some(retry)) =
                    (decision.allowed, held_until, decision.retry_after)
                {
                    let left = held_until.saturating_sub(decision.timestamp_micros);
                    if left > 0 {
                        decision.retry_after = Some(retry.min(Duration::from_micros(left)));
                    }
                }
                if let Some(local) = &inner.local {
                    if !decision.allowed {
                        local.remember(key, policy, cost.get(), None, &decision);
                    }
                }
                Ok(decision)
            }
            Err(error) => self.fall_back(CheckRequest::new(key, policy, cost), error),
        }
    }

    /// Refunds what `held` left, through the resilience stack; a failed
    /// refund leaves the units counted until the store's records expire.
    async fn refund_held(&self, tier: &LeaseTier, held: &Held, expired: bool) {
        if !held.holds_anything() {
            return;
        }
        let inner = &*self.inner;
        let counter = if expired {
            &tier.counters.expired
        } else {
            &tier.counters.refunded
        };
        counter.fetch_add(u64::from(held.left), Ordering::Relaxed);
        let event = if expired { "expired" } else { "refunded" };
        inner
            .metrics
            .lease_units(held.policy.first(), event, u64::from(held.left));
        let mut request =
            crate::lease::RefundRequest::new(&held.key, &held.policy, &held.lease, held.left);
        if !held.shadow_left.is_empty() {
            request = request.with_shadow_unused(&held.shadow_left);
        }
        let refunded = self
            .call_leases(&held.key, &held.policy, |leases, g| {
                leases.refund(g, request)
            })
            .await;
        match refunded {
            Ok(returned) => {
                tier.counters
                    .returned
                    .fetch_add(u64::from(returned), Ordering::Relaxed);
            }
            Err(error) => {
                tracing::debug!(
                    kind = error.kind().as_str(),
                    "quota lease refund failed; its units count until the lease's records expire"
                );
            }
        }
    }

    /// Gives back the unspent units of every lease this limiter holds, and
    /// answers how many units the store took back. Call it on graceful
    /// shutdown (the example gateway does), so that other nodes can use
    /// them at once; leases taken afterwards are not refunded. Without
    /// leases, 0.
    pub async fn refund_leases(&self) -> u64 {
        let Some(tier) = &self.inner.leases else {
            return 0;
        };
        let before = tier.counters.returned.load(Ordering::Relaxed);
        for slot in tier.all() {
            let held = slot.lock().take_all();
            for held in held {
                let now = self.inner.clock.now_micros();
                let expired = now >= held.local_deadline;
                self.refund_held(tier, &held, expired).await;
            }
        }
        tier.counters
            .returned
            .load(Ordering::Relaxed)
            .saturating_sub(before)
    }

    /// Drops every lease this limiter holds without refunding it, and
    /// answers how many units were dropped: for a reset of the windows
    /// (a tenant's `reset`, say), after which held units must not be spent
    /// against the fresh windows. A reservation in flight is dropped when it
    /// comes back. The store's records of those leases are left to expire
    /// (a reset that deletes the windows' keys should delete the policy's
    /// `:lr`/`:lx` lease keys with them).
    pub async fn discard_leases(&self) -> u64 {
        let Some(tier) = &self.inner.leases else {
            return 0;
        };
        tier.epoch.fetch_add(1, Ordering::AcqRel);
        let mut dropped = 0;
        for slot in tier.all() {
            for held in slot.lock().take_all() {
                dropped += u64::from(held.left);
            }
        }
        dropped
    }

    /// Counts of leased units since the limiter was built (`None` without
    /// leases).
    pub fn lease_stats(&self) -> Option<LeaseStats> {
        self.inner.leases.as_ref().map(LeaseTier::stats)
    }
}
