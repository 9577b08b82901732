//! The lease tier: per-key quota leases a node holds and spends locally.
//!
//! With leases on ([`LimiterBuilder::leases`](crate::LimiterBuilder::leases)),
//! a check first spends from the live lease of its key and policy, with no
//! store call ([`DecisionSource::Lease`](crate::DecisionSource::Lease)).
//! When the lease is empty or past its deadline, the check reserves a new
//! one in one store call ([`lease::Backend::reserve`](crate::lease::Backend::reserve)) that
//! also admits the check itself; what an expired lease left unspent is
//! refunded first. The store decides how many units a lease gets (at most
//! half of what is left, so one node cannot take a window while others
//! wait), and guarantees the global bound (see [`crate::lease`]).
//!
//! Lease size adapts per key: it starts at one unit, doubles each time a
//! lease is used up before its deadline (the key is hot), halves when one
//! expires with units left, and never exceeds [`LeaseConfig::max_units`].
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

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use quick_cache::sync::{Cache, DefaultLifecycle};
use quick_cache::{DefaultHashBuilder, UnitWeighter};
use smallvec::SmallVec;
use tokio::sync::Mutex;

use crate::key::state_key::{bounded_options, StateKey, StateKeyRef};
use crate::lease::Lease;
use crate::{Decision, DecisionSource, Policy, WindowKey};

/// How a [`Limiter`](crate::Limiter) leases quota (see the
/// [lease module](crate::lease) for the guarantees).
///
/// ```
/// use std::time::Duration;
/// use tower_window::{LeaseConfig, Policy, Quota};
///
/// let policy = Policy::from("1000/1m".parse::<Quota>()?);
/// let config = LeaseConfig::new(100);
/// assert_eq!(config.max_units(), 100);
/// // By default a tenth of the shortest window, at most one second.
/// assert_eq!(config.ttl_for(&policy), Duration::from_secs(1));
/// let config = config.ttl(Duration::from_millis(200));
/// assert_eq!(config.ttl_for(&policy), Duration::from_millis(200));
/// # Ok::<(), tower_window::QuotaError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct LeaseConfig {
    max_units: u32,
    ttl: Option<Duration>,
}

impl LeaseConfig {
    /// The longest default lease TTL.
    pub const MAX_DEFAULT_TTL: Duration = Duration::from_secs(1);

    /// Leases of at most `max_units` units (0 turns leases off).
    pub fn new(max_units: u32) -> Self {
        Self {
            max_units,
            ttl: None,
        }
    }

    /// How long a lease may be spent (default: a tenth of the policy's
    /// shortest window, at most [`MAX_DEFAULT_TTL`](Self::MAX_DEFAULT_TTL)).
    /// The store shortens it to the end of the window or bucket where the
    /// algorithm needs it.
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = Some(ttl);
        self
    }

    /// The largest lease, in units.
    pub fn max_units(&self) -> u32 {
        self.max_units
    }

    /// The TTL used for leases under `policy`.
    pub fn ttl_for(&self, policy: &Policy) -> Duration {
        if let Some(ttl) = self.ttl {
            return ttl;
        }
        let shortest = policy
            .quotas()
            .iter()
            .map(|q| q.window())
            .min()
            .unwrap_or(Self::MAX_DEFAULT_TTL * 10);
        (shortest / 10)
            .min(Self::MAX_DEFAULT_TTL)
            .max(Duration::from_micros(1))
    }

    /// Checks that leases of this TTL can be granted under `policy`: a
    /// GCRA quota dates leased tokens at the deadline, so a TTL above
    /// `(burst - 1)` emission intervals could never be granted and is
    /// refused with a typed error.
    pub fn validate(&self, policy: &Policy) -> Result<(), crate::StoreError> {
        let ttl = u64::try_from(self.ttl_for(policy).as_micros()).unwrap_or(u64::MAX);
        crate::algorithm::lease::check_ttl(policy, ttl)
    }
}

/// Counts of a limiter's lease units since it was built.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct LeaseStats {
    /// Units the store granted in leases.
    pub granted: u64,
    /// Leased units admitted (with the reservation or locally).
    pub spent: u64,
    /// Units given back before their lease's deadline (on shutdown, say).
    pub refunded: u64,
    /// Units left unspent when their lease's deadline passed (refunded
    /// then where the store still counts them).
    pub expired_unspent: u64,
    /// Units the store took back from refunds of either kind.
    pub returned: u64,
}

#[derive(Default)]
pub(crate) struct LeaseCounters {
    pub(crate) granted: AtomicU64,
    pub(crate) spent: AtomicU64,
    pub(crate) refunded: AtomicU64,
    pub(crate) expired: AtomicU64,
    pub(crate) returned: AtomicU64,
}

/// A lease this node holds.
pub(crate) struct Held {
    pub(crate) lease: Lease,
    /// Units not spent yet.
    pub(crate) left: u32,
    /// Per quota of the policy (policy order), the units a shadow quota
    /// still holds unspent (entries of enforced quotas unused); empty for a
    /// policy without shadow quotas.
    pub(crate) shadow_left: SmallVec<[u32; 4]>,
    /// The limiter's clock (µs) from which the lease may not be spent.
    pub(crate) local_deadline: u64,
    /// The limiter's clock (µs) when the reservation was sent.
    pub(crate) sent: u64,
    /// The reservation's decision, reported (aged) by local admissions.
    pub(crate) decision: Decision,
    /// Whose lease, for refunds that do not come from a check.
    pub(crate) key: WindowKey,
    pub(crate) policy: Policy,
}

impl Held {
    /// Spends `cost` of every shadow quota's hold that has it (its
    /// would-be admission); a shadow quota whose hold has less reports its
    /// would-be denial instead. The decision is rebuilt only when a shadow
    /// quota's answer changes.
    fn spend_shadows(&mut self, cost: u32) {
        let mut fits: SmallVec<[bool; 4]> = SmallVec::new();
        let mut changed = false;
        for (state, left) in self.decision.quotas().iter().zip(&mut self.shadow_left) {
            let fit = if state.quota.is_shadow() && *left >= cost {
                *left -= cost;
                true
            } else {
                !state.quota.is_shadow()
            };
            changed |= fit != state.allowed;
            fits.push(fit);
        }
        if !changed {
            return;
        }
        let states = self.decision.quotas().iter().zip(fits).map(|(state, fit)| {
            let mut state = state.clone();
            state.allowed = fit;
            state.retry_after = Some(if fit {
                Duration::ZERO
            } else {
                state.reset_after
            });
            state
        });
        if let Some(decision) = Decision::from_quotas(states) {
            self.decision = decision;
        }
    }

    /// Whether a refund would give anything back.
    fn holds_anything(&self) -> bool {
        self.left > 0 || self.shadow_left.iter().any(|units| *units > 0)
    }
}

/// What each shadow quota of `policy` holds unspent once `cost` of `lease`
/// was spent by the check that reserved it (empty without shadow quotas).
fn shadow_holds(policy: &Policy, lease: &Lease, cost: u32) -> SmallVec<[u32; 4]> {
    if !policy.quotas().iter().any(crate::Quota::is_shadow) {
        return SmallVec::new();
    }
    policy
        .quotas()
        .iter()
        .enumerate()
        .map(|(i, quota)| {
            let held = lease.held_by(i);
            match (quota.is_shadow(), held >= cost) {
                (true, true) => held - cost,
                (true, false) => held,
                (false, _) => 0,
            }
        })
        .collect()
}

/// One key's lease state.
pub(crate) struct Slot {
    pub(crate) held: Option<Held>,
    /// Units the next reservation asks for.
    pub(crate) want: u32,
    /// The local deadline of the last lease (0: none yet).
    pub(crate) last_deadline: u64,
}

impl Slot {
    /// Spends `cost` units of the live lease at `now`, if it has them.
    pub(crate) fn spend(&mut self, now: u64, cost: u32) -> Option<Decision> {
        let held = self.held.as_mut()?;
        if now >= held.local_deadline || held.left < cost {
            return None;
        }
        held.left -= cost;
        if !held.shadow_left.is_empty() {
            held.spend_shadows(cost);
        }
        let elapsed = Duration::from_micros(now.saturating_sub(held.sent));
        let mut decision = held
            .decision
            .clone()
            .aged(elapsed, Duration::ZERO)
            .with_source(DecisionSource::Lease)
            .with_timestamp_micros(now);
        decision.retry_after = Some(Duration::ZERO);
        Some(decision)
    }

    /// The size of the next lease: doubled if the last one was used up
    /// before its deadline, halved if it expired with units left.
    pub(crate) fn next_want(&mut self, now: u64, max_units: u32, leftover_expired: bool) -> u32 {
        if leftover_expired {
            self.want = (self.want / 2).max(1);
        } else if self.last_deadline != 0 && now < self.last_deadline {
            self.want = self.want.saturating_mul(2).min(max_units.max(1));
        }
        self.want
    }
}

type SlotCache = Cache<
    StateKey,
    Arc<Mutex<Slot>>,
    UnitWeighter,
    DefaultHashBuilder,
    DefaultLifecycle<StateKey, Arc<Mutex<Slot>>>,
>;

/// The leases of one limiter, by key and policy.
pub(crate) struct LeaseTier {
    slots: SlotCache,
    pub(crate) config: LeaseConfig,
    pub(crate) counters: LeaseCounters,
    /// Set once the store answered that it does not support leases:
    /// checks then go to the store directly, without asking again.
    unsupported: std::sync::atomic::AtomicBool,
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
            config,
            counters: LeaseCounters::default(),
            unsupported: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// Whether checks of `policy` lease: the store supports leases and the
    /// TTL leaves room in every quota (else checks decide directly).
    pub(crate) fn applies(&self, policy: &Policy) -> bool {
        if self.unsupported.load(Ordering::Relaxed) {
            return false;
        }
        let ttl = u64::try_from(self.config.ttl_for(policy).as_micros()).unwrap_or(u64::MAX);
        policy
            .quotas()
            .iter()
            .all(|quota| crate::algorithm::lease::ttl_fits(quota, ttl))
    }

    /// The lease slot of `key` under `policy`, made on first use.
    pub(crate) fn slot(&self, key: &WindowKey, policy: &Policy) -> Arc<Mutex<Slot>> {
        if let Some(slot) = self.slots.get(&StateKeyRef::for_policy(key, policy)) {
            return slot;
        }
        let owned = StateKey::for_policy(key, policy);
        match self.slots.get_or_insert_with(&owned, || {
            Ok::<_, std::convert::Infallible>(Arc::new(Mutex::new(Slot {
                held: None,
                want: 1,
                last_deadline: 0,
            })))
        }) {
            Ok(slot) => slot,
            Err(never) => match never {},
        }
    }

    /// Every slot (for refunds on shutdown).
    pub(crate) fn all(&self) -> Vec<Arc<Mutex<Slot>>> {
        self.slots.iter().map(|(_, slot)| slot).collect()
    }

    pub(crate) fn stats(&self) -> LeaseStats {
        let c = &self.counters;
        LeaseStats {
            granted: c.granted.load(Ordering::Relaxed),
            spent: c.spent.load(Ordering::Relaxed),
            refunded: c.refunded.load(Ordering::Relaxed),
            expired_unspent: c.expired.load(Ordering::Relaxed),
            returned: c.returned.load(Ordering::Relaxed),
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

impl super::Limiter {
    /// A check with leases on: spend from the live lease, else answer a
    /// remembered denial, else reserve a new lease (refunding what the old
    /// one left), else decide directly in the store.
    pub(super) async fn decide_leased(
        &self,
        tier: &LeaseTier,
        key: &WindowKey,
        policy: &Policy,
        cost: crate::Cost,
    ) -> Result<Decision, super::LimitError> {
        let inner = &*self.inner;
        let store = &inner.store.inner;
        let units = cost.get();
        let slot = tier.slot(key, policy);
        let mut guard = slot.lock().await;
        let now = inner.clock.now_micros();
        if let Some(decision) = guard.spend(now, units) {
            tier.counters
                .spent
                .fetch_add(u64::from(units), Ordering::Relaxed);
            inner.stats.lease.fetch_add(1, Ordering::Relaxed);
            inner
                .metrics
                .lease_units(policy.first(), "spent", u64::from(units));
            return Ok(decision);
        }
        if let Some(local) = &inner.local {
            if let super::Lookup::Hit(decision) = local.lookup(key, policy, units) {
                inner.stats.local_cache.fetch_add(1, Ordering::Relaxed);
                return Ok(decision);
            }
        }
        // The lease is empty, too small or over: give back what it left
        // (a shadow quota's leftover too).
        let mut leftover_expired = false;
        if let Some(held) = guard.held.take() {
            leftover_expired = held.left > 0 && now >= held.local_deadline;
            self.refund_held(tier, &held, leftover_expired).await;
        }
        let max_units = tier.config.max_units.max(1);
        let want = guard.next_want(now, max_units, leftover_expired).max(units);
        let ttl = tier.config.ttl_for(policy);
        let request = crate::lease::ReserveRequest::new(key, policy, want, units, ttl);
        let sent = inner.clock.now_micros();
        let reserved = match &store.leases {
            Some(leases) => {
                store
                    .resilience
                    .call(self.domain(key, policy), self.calls(policy), |g| {
                        leases.reserve(g, request)
                    })
                    .await
            }
            None => Err(crate::StoreError::unsupported("quota leases")),
        };
        let reservation = match reserved {
            Ok(reservation) => reservation,
            Err(error) => {
                let kind = Some(error.kind());
                if kind == Some(crate::StoreErrorKind::Unsupported) {
                    tracing::warn!(
                        "the store does not support quota leases: checks go to it directly"
                    );
                    tier.unsupported.store(true, Ordering::Relaxed);
                }
                let refused = matches!(
                    kind,
                    Some(
                        crate::StoreErrorKind::Unsupported | crate::StoreErrorKind::InvalidRequest
                    )
                );
                if !refused {
                    drop(guard);
                    return self.fall_back(key, policy, cost, error);
                }
                // No lease for this store or policy (a GCRA quota too
                // small for the TTL, say): decide directly.
                crate::lease::Reservation::empty(0, None)
            }
        };
        let held_until = reservation.held_until_micros;
        if let (Some(lease), Some(decision)) = (reservation.lease, reservation.decision) {
            let granted = lease.granted;
            tier.counters
                .granted
                .fetch_add(u64::from(granted), Ordering::Relaxed);
            tier.counters
                .spent
                .fetch_add(u64::from(units), Ordering::Relaxed);
            inner
                .metrics
                .lease_units(policy.first(), "granted", u64::from(granted));
            inner
                .metrics
                .lease_units(policy.first(), "spent", u64::from(units));
            inner.stats.store.fetch_add(1, Ordering::Relaxed);
            let length = lease.deadline_micros.saturating_sub(reservation.now_micros);
            let local_deadline = sent.saturating_add(length);
            guard.last_deadline = local_deadline;
            let left = granted.saturating_sub(units);
            let shadow_left = shadow_holds(policy, &lease, units);
            let held = Held {
                lease,
                left,
                shadow_left,
                local_deadline,
                sent,
                decision: decision.clone(),
                key: key.clone(),
                policy: policy.clone(),
            };
            // Kept while it holds anything: a shadow quota's leftover goes
            // back with the refund even when nothing else is left.
            if held.holds_anything() {
                guard.held = Some(held);
            }
            if let Some(local) = &inner.local {
                local.forget(key, policy);
            }
            return Ok(decision);
        }
        drop(guard);
        // Nothing to lease: the store decides this check exactly (one more
        // call, then the denial is remembered), and a denial waits no longer
        // than the leases other nodes hold.
        match self.check_store(key, policy, cost).await {
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
                        local.remember(key, policy, units, &decision);
                    }
                }
                Ok(decision)
            }
            Err(error) => self.fall_back(key, policy, cost, error),
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
        let store = &inner.store.inner;
        let Some(leases) = &store.leases else {
            return;
        };
        let refunded = store
            .resilience
            .call(
                self.domain(&held.key, &held.policy),
                self.calls(&held.policy),
                |g| leases.refund(g, request),
            )
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
            let mut guard = slot.lock().await;
            if let Some(held) = guard.held.take() {
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
    /// against the fresh windows. The store's records of those leases are
    /// left to expire (a reset that deletes the windows' keys should delete
    /// the policy's `:lr`/`:lx` lease keys with them).
    pub async fn discard_leases(&self) -> u64 {
        let Some(tier) = &self.inner.leases else {
            return 0;
        };
        let mut dropped = 0;
        for slot in tier.all() {
            if let Some(held) = slot.lock().await.held.take() {
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
