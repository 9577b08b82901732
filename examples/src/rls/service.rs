//! `envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit` on a
//! [`Limiter`].
//!
//! A request's domain is the tenant of its window key, and each descriptor
//! that gets a rule (see [`matching`](super::matching)) is one
//! tenant-scoped quota of one [`Policy`], its window told apart by
//! [`Quota::with_instance`] (the rule's path and the descriptor's values).
//! So the descriptors of one request are decided together in one store
//! call: all admitted, or none counted. On Redis Cluster every window of a
//! domain lives in the slot of `{@<domain>}` (the price of deciding them
//! together: one domain's load is on one primary).
//!
//! Answers, as envoyproxy/ratelimit gives them: an empty domain or an empty
//! descriptor list is a gRPC error (`UNKNOWN`, its message); an unknown
//! domain, a descriptor matching no rule or without entries is `OK` with no
//! limit; `unlimited` is `OK` with `limit_remaining` = `u32::MAX`, and never
//! reaches the store; `shadow_mode` is counted but `OK`; a rule named in
//! another matched rule's `replaces` is left out (`OK`, no limit). Every
//! other descriptor has its `current_limit`, `limit_remaining` and
//! `duration_until_reset` (for a denied one: how long until its cost
//! fits; for a cost that never fits, the window's reset).
//!
//! `overall_code` is `OVER_LIMIT` when a descriptor of an enforced rule is,
//! or when every *quota group* is: a `quota_mode` rule (or every rule,
//! with [`Modes::quota`]) is a soft limit, its descriptor answered
//! `OVER_LIMIT` but the request denied only when every group of such
//! descriptors is over — a group being the descriptors of one
//! `backend_name` / `model_name_override` pair, or else of one entry list
//! (envoyproxy/ratelimit's rule, so a gateway can fail over to another
//! model). With [`Modes::shadow`] (`SHADOW_MODE`) every descriptor keeps
//! its code and the overall code is `OK`. Soft and shadowed windows are
//! shadow quotas of the request's policy: each counts on its own, never
//! stopping the others from counting.
//!
//! `hits_addend` (the request's, or a descriptor's own) is the cost; 0 at
//! the request level means 1. Each window is charged its own descriptor's
//! cost, and all of them are decided in the one store call
//! ([`Limiter::check_policy_per_quota`]): descriptors of different costs
//! are all-or-nothing too. A descriptor's own `hits_addend` of 0 counts
//! nothing: its window is read first ([`Limiter::peek_policy`] of 1 unit,
//! a second call, only for requests holding such descriptors), and it is
//! `OVER_LIMIT` when no unit is left (envoyproxy/ratelimit: when the
//! window is strictly past its limit) — a denial as any other, so the
//! request's other windows are then only read. Two descriptors with the
//! same rule and values are one window, counted once, at the larger of
//! their costs.
//!
//! **Usage reports.** A descriptor whose last entry matches a
//! `usage_report: true` entry of the rules (see
//! [`matching`](super::matching)) reports usage of the window its entries
//! before that one get — Envoy's `apply_on_stream_done` call at the end of
//! a stream, whose answer Envoy ignores. Its cost is recorded there in
//! full, past the limit too ([`Limiter::settle_per_quota`] of nothing
//! reserved: debt that later checks see until it slides out), and it is
//! answered `OK` with the window's state. The reports of one call are
//! recorded in one store call before any check of the same call; two
//! reports of one window add up. A store failure is an error (usage that
//! happened has no fallback). Request-time checks are unchanged: a denial
//! records nothing. The rls's series count reports apart
//! (`code="usage_report"`, `result="usage_report"`).
//!
//! A request is prepared once per rules generation (rules matched, windows
//! named, policies built) and kept in a bounded cache by its encoded bytes,
//! so Envoy's repeated descriptors go straight to their store call; a
//! reload starts a new generation.

use std::collections::HashSet;
use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use bytes::Bytes;
use envoy_types::pb::envoy::config::core::v3::HeaderValue;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    Code, DescriptorStatus, RateLimit,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::RateLimitService;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::{Duration as ProtoDuration, Struct};
use prost::Message as _;
use tonic::{Request, Response, Status};
use tower_window::limit::Reserved;
use tower_window::quota::MAX_QUOTAS;
use tower_window::{Cost, Decision, Limiter, Policy, Quota, QuotaCosts, WindowKey};

use super::config::{self, Limit, RlsConfig, Rule};
use super::dynamic_metadata;
use super::matching::{match_descriptor, override_instance, Matched};
use super::metrics;

/// The service: the rules in force (swapped whole on reload) and the
/// limiter every decision goes through.
#[derive(Clone)]
pub struct RlsService {
    inner: Arc<Inner>,
    modes: Modes,
    headers: Arc<Headers>,
}

/// The names of the three rate limit headers of an answer.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct HeaderNames {
    /// The limit's header (`requests_per_unit`).
    pub limit: String,
    /// The remaining units' header.
    pub remaining: String,
    /// The header of the seconds until the reset.
    pub reset: String,
}

impl HeaderNames {
    /// Headers named `limit`, `remaining` and `reset`.
    pub fn new(limit: &str, remaining: &str, reset: &str) -> Self {
        Self {
            limit: limit.to_owned(),
            remaining: remaining.to_owned(),
            reset: reset.to_owned(),
        }
    }
}

impl Default for HeaderNames {
    /// envoyproxy/ratelimit's: `RateLimit-Limit`, `RateLimit-Remaining`,
    /// `RateLimit-Reset`.
    fn default() -> Self {
        Self::new("RateLimit-Limit", "RateLimit-Remaining", "RateLimit-Reset")
    }
}

/// Which rate limit headers answers carry, for the descriptor that binds
/// (an over-limit one, else the one with the least remaining): its
/// `requests_per_unit`, its remaining units and the whole seconds (rounded
/// up) of its `duration_until_reset`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Headers {
    /// In `response_headers_to_add` (Envoy adds them to the client's
    /// response): envoyproxy/ratelimit's `LIMIT_RESPONSE_HEADERS_ENABLED`.
    pub response: Option<HeaderNames>,
    /// In `request_headers_to_add` (Envoy adds them to the upstream
    /// request): its `LIMIT_REQUEST_HEADERS_ENABLED`.
    pub request: Option<HeaderNames>,
    /// Per-unit headers in `response_headers_to_add`, before the three
    /// others: for each unit of the answer's limits, in order of first
    /// appearance, the limit and remaining of its descriptor with the least
    /// remaining, named `<limit name>-Seconds`, `<remaining name>-Seconds`
    /// (`-Minutes`, ...): its `LIMIT_PER_UNIT_HEADERS_ENABLED`. The names
    /// are `per_unit`'s.
    pub per_unit: Option<HeaderNames>,
}

/// The service-wide modes (envoyproxy/ratelimit's `SHADOW_MODE` and
/// `QUOTA_MODE`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Modes {
    /// `SHADOW_MODE`: the overall code is always `OK`; descriptors keep
    /// theirs.
    pub shadow: bool,
    /// `QUOTA_MODE`: every rule is a `quota_mode` rule.
    pub quota: bool,
    /// `RESPONSE_DYNAMIC_METADATA`: answers carry `dynamic_metadata` (see
    /// [`super::dynamic_metadata`]).
    pub dynamic_metadata: bool,
}

impl Modes {
    /// `shadow` and `quota` as given, no dynamic metadata.
    pub fn new(shadow: bool, quota: bool) -> Self {
        Self {
            shadow,
            quota,
            dynamic_metadata: false,
        }
    }

    /// The same modes, answering with `dynamic_metadata` or not.
    pub fn with_dynamic_metadata(mut self, on: bool) -> Self {
        self.dynamic_metadata = on;
        self
    }
}

struct Inner {
    config: Arc<ArcSwap<RlsConfig>>,
    limiter: Limiter,
    /// The rls's own series.
    counters: metrics::Counters,
    /// Requests seen before, prepared, by rules generation and encoded
    /// request (bounded; a reload's new generation never sees an older
    /// one's entries).
    prepared: quick_cache::sync::Cache<(u64, Bytes), Arc<Prepared>>,
}

/// How many prepared requests the service keeps.
const PREPARED: usize = 4_096;

impl std::fmt::Debug for RlsService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RlsService")
            .field("modes", &self.modes)
            .field("headers", &self.headers)
            .finish_non_exhaustive()
    }
}

impl RlsService {
    /// A service deciding with `limiter` under the rules `config` holds
    /// (shared with the reload task); with `response_headers`, answers
    /// carry `RateLimit-Limit`, `-Remaining` and `-Reset` for Envoy to add
    /// to the client's response (see [`Headers`]).
    pub fn new(config: Arc<ArcSwap<RlsConfig>>, limiter: Limiter, response_headers: bool) -> Self {
        let headers = Headers {
            response: response_headers.then(HeaderNames::default),
            ..Headers::default()
        };
        Self {
            inner: Arc::new(Inner {
                config,
                limiter,
                counters: metrics::Counters::new(),
                prepared: quick_cache::sync::Cache::new(PREPARED),
            }),
            modes: Modes::default(),
            headers: Arc::new(headers),
        }
    }

    /// The same service answering with `headers`.
    pub fn with_headers(mut self, headers: Headers) -> Self {
        self.headers = Arc::new(headers);
        self
    }

    /// The same service under `modes`.
    pub fn with_modes(mut self, modes: Modes) -> Self {
        self.modes = modes;
        // Requests prepared under other modes are not this service's.
        self.inner.prepared.clear();
        self
    }

    /// The limiter (to refund its leases on shutdown).
    pub fn limiter(&self) -> &Limiter {
        &self.inner.limiter
    }

    /// Decides `request` (see the [module docs](self)).
    pub async fn decide(&self, request: &RateLimitRequest) -> Result<RateLimitResponse, Status> {
        let encoded = Bytes::from(request.encode_to_vec());
        self.decide_counted(encoded, Some(request)).await
    }

    /// Decides the request `encoded` holds (a `RateLimitRequest`'s
    /// protobuf bytes, as a gRPC frame carries them): a request seen before
    /// under these rules is found by its bytes and not decoded again.
    pub async fn decide_encoded(&self, encoded: Bytes) -> Result<RateLimitResponse, Status> {
        self.decide_counted(encoded, None).await
    }

    async fn decide_counted(
        &self,
        encoded: Bytes,
        decoded: Option<&RateLimitRequest>,
    ) -> Result<RateLimitResponse, Status> {
        let response = self.decide_inner(encoded, decoded).await;
        self.inner.counters.request(match &response {
            Ok((_, true)) => "usage_report",
            Ok((r, false)) if r.overall_code == Code::OverLimit as i32 => "over_limit",
            Ok(_) => "ok",
            Err(_) => "error",
        });
        response.map(|(response, _)| response)
    }

    /// The answer, and whether the call was a usage report.
    async fn decide_inner(
        &self,
        encoded: Bytes,
        decoded: Option<&RateLimitRequest>,
    ) -> Result<(RateLimitResponse, bool), Status> {
        let generation = self.inner.config.load().generation;
        // A request seen before under these rules is prepared already:
        // its rules matched, its windows named, its policies built.
        let mut cache_key = (generation, encoded);
        let prepared = match self.inner.prepared.get(&cache_key) {
            Some(prepared) => prepared,
            None => {
                let owned;
                let request = match decoded {
                    Some(request) => request,
                    None => {
                        owned = RateLimitRequest::decode(cache_key.1.clone())
                            .map_err(|e| Status::internal(e.to_string()))?;
                        &owned
                    }
                };
                let config = self.inner.config.load();
                let prepared = Arc::new(prepare_request(&config, request, self.modes)?);
                // The rules of the generation prepared under (a reload in
                // between only leaves an entry no one looks up).
                cache_key.0 = config.generation;
                // A copy: the received bytes may be a slice of a larger
                // read buffer, which the cache would keep alive.
                cache_key.1 = Bytes::copy_from_slice(&cache_key.1);
                self.inner.prepared.insert(cache_key, Arc::clone(&prepared));
                prepared
            }
        };

        let decisions = self.run(&prepared).await?;

        let mut statuses = Vec::with_capacity(prepared.plans.len());
        let mut enforced_over = false;
        let mut groups_over = vec![false; prepared.quota_groups];
        for (i, plan) in prepared.plans.iter().enumerate() {
            let outcome = Self::outcome(&prepared, &decisions, i);
            let status = status_of(plan, outcome.as_ref(), &self.inner.counters);
            let over = status.code == Code::OverLimit as i32;
            if let Some(Some((rule, value))) = prepared.detailed.get(i) {
                let result = match (plan.is_report(), over) {
                    (true, _) => "usage_report",
                    (false, true) => "over_limit",
                    (false, false) => "ok",
                };
                self.inner.counters.detailed(rule, value, result);
            }
            match prepared.quota_group.get(i).copied().flatten() {
                Some(group) => {
                    if let Some(slot) = groups_over.get_mut(group) {
                        *slot |= over;
                    }
                }
                None => enforced_over |= over,
            }
            statuses.push(status);
        }
        let quota_over = !groups_over.is_empty() && groups_over.iter().all(|over| *over);
        let metadata = prepared.metadata.as_ref().map(|(base, rules)| {
            let passed = statuses.iter().enumerate().filter(|(i, status)| {
                let unlimited = matches!(prepared.plans.get(*i), Some(Plan::Unlimited { .. }));
                let group_over = prepared
                    .quota_group
                    .get(*i)
                    .copied()
                    .flatten()
                    .and_then(|g| groups_over.get(g).copied())
                    .unwrap_or(false);
                !unlimited && !group_over && status.code != Code::OverLimit as i32
            });
            base.answer(
                passed.map(|(i, _)| (i, rules.get(i).and_then(Option::as_ref))),
                prepared.quota_groups > 0,
            )
        });
        let overall = if (enforced_over || quota_over) && !self.modes.shadow {
            Code::OverLimit
        } else {
            Code::Ok
        };
        let headers = &self.headers;
        let mut response_headers = headers
            .per_unit
            .as_ref()
            .map(|names| per_unit_headers(&statuses, names))
            .unwrap_or_default();
        if let Some(names) = &headers.response {
            response_headers.extend(rate_limit_headers(&statuses, names));
        }
        let request_headers = headers
            .request
            .as_ref()
            .map(|names| rate_limit_headers(&statuses, names))
            .unwrap_or_default();
        let mut response = response(overall, statuses, response_headers);
        response.request_headers_to_add = request_headers;
        response.dynamic_metadata = metadata;
        Ok((response, prepared.usage_report))
    }

    /// The store calls of `prepared`, in order: each group's decision and
    /// whether it only read. The counted group only reads when the request
    /// is denied whatever it finds: an enforced zero-limit rule matched, or
    /// an enforced descriptor of `hits_addend` 0 found no unit left.
    async fn run(&self, prepared: &Prepared) -> Result<Vec<(Decision, bool)>, Status> {
        let mut decisions = Vec::with_capacity(prepared.groups.len());
        let key = &prepared.key;
        let limiter = &self.inner.limiter;
        let mut denied = prepared.zero_denies;
        for group in &prepared.groups {
            let decision = match &group.call {
                // Usage reports: recorded in full, whether or not it fits.
                Call::Record(usage) => {
                    limiter
                        .settle_per_quota(key, &group.policy, Reserved::NONE, usage)
                        .await
                }
                // Descriptors of hits_addend 0: is a unit left in each?
                Call::Read => limiter.peek_policy(key, &group.policy, 1).await,
                Call::Check(costs) if denied => {
                    limiter
                        .peek_policy_per_quota(key, &group.policy, costs)
                        .await
                }
                Call::Check(costs) => {
                    limiter
                        .check_policy_per_quota(key, &group.policy, costs)
                        .await
                }
            };
            let decision = decision.map_err(|e| {
                tracing::warn!(error = %e, "rate limit store unavailable");
                Status::unavailable(format!("the rate limit store cannot decide: {e}"))
            })?;
            let peeked = match group.call {
                Call::Record(_) => false,
                // Shadow (and soft) windows never deny a policy.
                Call::Read => {
                    denied |= !decision.allowed();
                    false
                }
                Call::Check(_) => denied,
            };
            decisions.push((decision, peeked));
        }
        Ok(decisions)
    }

    /// The decision descriptor `i`'s window was part of, if it has one.
    fn outcome<'a>(
        prepared: &'a Prepared,
        decisions: &'a [(Decision, bool)],
        i: usize,
    ) -> Option<QuotaOutcome<'a>> {
        let (group, at) = (*prepared.slots.get(i)?)?;
        let (decision, peeked) = decisions.get(group)?;
        Some(QuotaOutcome {
            decision,
            at,
            name: prepared.groups.get(group)?.names.get(at)?.as_ref(),
            peeked: *peeked,
        })
    }
}

/// A request made ready to decide: each descriptor's plan, and the store
/// calls: one recording the usage reports, one reading the windows of
/// descriptors that spend nothing (a unit left in each?), then one
/// counting every window a descriptor spends, each at its own cost (each
/// call only if it has windows).
#[derive(Debug)]
struct Prepared {
    /// The window key of the request's domain.
    key: WindowKey,
    plans: Vec<Plan>,
    /// Each plan's window: `(group index, quota index in its policy)`.
    slots: Vec<Option<(usize, usize)>>,
    groups: Vec<Group>,
    /// An enforced `requests_per_unit: 0` rule matched: the request is
    /// denied whatever the store says, and the windows it would count are
    /// only read.
    zero_denies: bool,
    /// Each plan's quota group, if it is a soft (quota-mode) limit.
    quota_group: Vec<Option<usize>>,
    /// How many quota groups there are.
    quota_groups: usize,
    /// Each plan's rule path and last value, for a `detailed_metric` rule.
    detailed: Vec<Option<(Arc<str>, Arc<str>)>>,
    /// With dynamic metadata: what every answer repeats, and each plan's
    /// rule `metadata`.
    metadata: Option<(dynamic_metadata::Base, Vec<Option<Struct>>)>,
    /// Every descriptor with a rule is a usage report (counted apart).
    usage_report: bool,
}

/// What one store call does with its windows.
#[derive(Debug)]
enum Call {
    /// Records each window's usage, in policy order, whether or not it fits.
    Record(Vec<u32>),
    /// Counts each window's cost, in policy order, if every one fits.
    Check(QuotaCosts),
    /// Only reads: whether each window has a unit left.
    Read,
}

/// Which [`Call`] a descriptor's window goes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Record,
    Check,
    Read,
}

/// One store call.
#[derive(Debug)]
struct Group {
    call: Call,
    policy: Policy,
    /// `(descriptor index, quota index in the policy)`.
    members: Vec<(usize, usize)>,
    /// The policy's quota names, lent to each outcome.
    names: Vec<Arc<str>>,
}

/// `request` made ready under `config`, or the error it is answered with.
fn prepare_request(
    config: &RlsConfig,
    request: &RateLimitRequest,
    modes: Modes,
) -> Result<Prepared, Status> {
    // envoyproxy/ratelimit's own words and code (a Go error: UNKNOWN).
    if request.domain.is_empty() {
        return Err(Status::unknown("rate limit domain must not be empty"));
    }
    if request.descriptors.is_empty() {
        return Err(Status::unknown(
            "rate limit descriptor list must not be empty",
        ));
    }
    if request.descriptors.iter().any(|d| d.is_negative_hits) {
        // envoyproxy/ratelimit's code when negative hits are off, before
        // any rule is looked up: one such descriptor fails the request.
        return Err(Status::unimplemented(
            "is_negative_hits is not supported: windows are only ever spent",
        ));
    }
    let key = WindowKey::new(request.domain.as_str(), "");
    let Some(domain) = config.domains.get(&request.domain) else {
        // Unknown domain: every descriptor OK, no limit.
        return Ok(Prepared {
            key,
            plans: request.descriptors.iter().map(|_| Plan::NoRule).collect(),
            slots: vec![None; request.descriptors.len()],
            groups: Vec::new(),
            zero_denies: false,
            quota_group: vec![None; request.descriptors.len()],
            quota_groups: 0,
            detailed: Vec::new(),
            metadata: modes
                .dynamic_metadata
                .then(|| (dynamic_metadata::Base::of(request), Vec::new())),
            usage_report: false,
        });
    };
    prepare(key, domain, request, modes)
}

fn prepare(
    key: WindowKey,
    domain: &config::Domain,
    request: &RateLimitRequest,
    modes: Modes,
) -> Result<Prepared, Status> {
    let request_cost = request.hits_addend.max(1);
    let mut plans = Vec::with_capacity(request.descriptors.len());
    for descriptor in &request.descriptors {
        plans.push(plan(domain, descriptor, request_cost, modes)?);
    }
    drop_replaced(&mut plans);
    let soft = |plan: &Plan| match plan {
        Plan::Unlimited { .. } => false,
        // A report is answered OK: it belongs to no quota group.
        _ if plan.is_report() => false,
        _ => modes.quota || plan.rule().is_some_and(|rule| rule.quota_mode),
    };
    let zero_denies = plans.iter().any(|p| match p {
        Plan::Zero { rule } => !rule.shadow && !soft(p) && !modes.shadow,
        _ => false,
    });
    let mut group_keys: Vec<String> = Vec::new();
    let quota_group = plans
        .iter()
        .zip(&request.descriptors)
        .map(|(plan, descriptor)| {
            if !soft(plan) {
                return None;
            }
            let key = quota_group_key(descriptor);
            Some(match group_keys.iter().position(|k| *k == key) {
                Some(at) => at,
                None => {
                    group_keys.push(key);
                    group_keys.len() - 1
                }
            })
        })
        .collect();
    let mut groups = Vec::with_capacity(2);
    for kind in [Kind::Record, Kind::Read, Kind::Check] {
        // Distinct windows (a few per request: linear scans beat hashing
        // here), each descriptor's index among them, and each window's cost.
        let mut quotas: Vec<Quota> = Vec::new();
        let mut costs: Vec<u32> = Vec::new();
        let mut members: Vec<(usize, usize)> = Vec::new();
        for (i, plan) in plans.iter().enumerate() {
            let (Plan::Store { quota, cost, .. }, Some(own)) = (plan, plan.kind()) else {
                continue;
            };
            if own != kind {
                continue;
            }
            let at = match quotas.iter().position(|q| q.state_id() == quota.state_id()) {
                Some(at) => at,
                None => {
                    quotas.push(unique_name(quota, &quotas)?);
                    costs.push(0);
                    quotas.len() - 1
                }
            };
            if let Some(slot) = costs.get_mut(at) {
                // Reports of one window add up; a window checked twice is
                // counted once, at the larger cost.
                *slot = match kind {
                    Kind::Record => slot.saturating_add(*cost),
                    Kind::Check | Kind::Read => (*slot).max(*cost),
                };
            }
            members.push((i, at));
        }
        if quotas.is_empty() {
            continue;
        }
        if quotas.len() > MAX_QUOTAS {
            return Err(Status::invalid_argument(format!(
                "at most {MAX_QUOTAS} limited descriptors per request, got {}",
                quotas.len()
            )));
        }
        let names = quotas.iter().map(|q| Arc::from(q.name())).collect();
        let policy = Policy::new("rls", quotas)
            .map_err(|e| Status::internal(format!("cannot decide these descriptors: {e}")))?;
        let call = match kind {
            Kind::Record => Call::Record(costs),
            Kind::Check => Call::Check(QuotaCosts::from(
                costs
                    .into_iter()
                    .map(|cost| Cost::new(cost).unwrap_or(Cost::ONE))
                    .collect::<Vec<_>>(),
            )),
            Kind::Read => Call::Read,
        };
        groups.push(Group {
            call,
            policy,
            members,
            names,
        });
    }
    let mut slots = vec![None; plans.len()];
    for (g, group) in groups.iter().enumerate() {
        for &(i, at) in &group.members {
            if let Some(slot) = slots.get_mut(i) {
                *slot = Some((g, at));
            }
        }
    }
    let detailed = plans
        .iter()
        .zip(&request.descriptors)
        .map(|(plan, descriptor)| {
            let rule = plan.rule().filter(|rule| rule.detailed_metric)?;
            let value = descriptor.entries.last().map_or("", |e| e.value.as_str());
            Some((Arc::from(rule.path.as_str()), Arc::from(value)))
        })
        .collect();
    let metadata = modes.dynamic_metadata.then(|| {
        let rules = plans
            .iter()
            .map(|plan| {
                plan.rule()
                    .and_then(|rule| rule.metadata.as_ref())
                    .map(dynamic_metadata::from_yaml)
            })
            .collect();
        (dynamic_metadata::Base::of(request), rules)
    });
    let usage_report = plans.iter().any(Plan::is_report)
        && plans
            .iter()
            .all(|plan| plan.is_report() || matches!(plan, Plan::NoRule));
    Ok(Prepared {
        key,
        plans,
        slots,
        groups,
        zero_denies,
        quota_group,
        quota_groups: group_keys.len(),
        detailed,
        metadata,
        usage_report,
    })
}

/// The quota group of a soft descriptor, as envoyproxy/ratelimit forms it:
/// its `backend_name` and `model_name_override` values when it has either
/// (one model's buckets are one group), else its whole entry list.
fn quota_group_key(descriptor: &RateLimitDescriptor) -> String {
    if let Some((backend, model)) = super::dynamic_metadata::model_of(descriptor) {
        let mut key = String::from("model;");
        for part in [backend, model] {
            let _ = write!(key, "{}:{part}", part.len());
        }
        return key;
    }
    let mut key = String::from("entries;");
    for entry in &descriptor.entries {
        let _ = write!(
            key,
            "{}:{}{}:{}",
            entry.key.len(),
            entry.key,
            entry.value.len(),
            entry.value
        );
    }
    key
}

#[tonic::async_trait]
impl RateLimitService for RlsService {
    async fn should_rate_limit(
        &self,
        request: Request<RateLimitRequest>,
    ) -> Result<Response<RateLimitResponse>, Status> {
        self.decide(request.get_ref()).await.map(Response::new)
    }
}

/// What one descriptor needs.
#[derive(Debug)]
enum Plan {
    /// No rule (unknown entries, no entries, or replaced): OK, no limit.
    NoRule,
    /// `unlimited`.
    Unlimited { rule: Arc<Rule> },
    /// `requests_per_unit: 0`.
    Zero { rule: Arc<Rule> },
    /// A window in the store: checked at `cost`, or, for a usage report,
    /// `cost` recorded.
    Store {
        rule: Arc<Rule>,
        quota: Quota,
        cost: u32,
        report: bool,
    },
}

impl Plan {
    fn rule(&self) -> Option<&Arc<Rule>> {
        match self {
            Self::NoRule => None,
            Self::Unlimited { rule } | Self::Zero { rule } | Self::Store { rule, .. } => Some(rule),
        }
    }

    fn is_report(&self) -> bool {
        matches!(self, Self::Store { report: true, .. })
    }

    /// The store call its window goes to, if it has one.
    fn kind(&self) -> Option<Kind> {
        match self {
            Self::Store { report: true, .. } => Some(Kind::Record),
            Self::Store { cost: 0, .. } => Some(Kind::Read),
            Self::Store { .. } => Some(Kind::Check),
            _ => None,
        }
    }
}

/// The decision a descriptor's window was part of.
#[derive(Debug, Clone, Copy)]
struct QuotaOutcome<'a> {
    decision: &'a Decision,
    /// The window's quota in that decision's policy: its index and name.
    at: usize,
    name: &'a str,
    /// Only read because the request is denied anyway (nothing counted):
    /// never a denial of this descriptor.
    peeked: bool,
}

fn plan(
    domain: &config::Domain,
    descriptor: &RateLimitDescriptor,
    request_cost: u32,
    modes: Modes,
) -> Result<Plan, Status> {
    // A cost above u32::MAX never fits any limit, as u32::MAX does not.
    let cost = descriptor
        .hits_addend
        .as_ref()
        .map_or(request_cost, |v| u32::try_from(v.value).unwrap_or(u32::MAX));
    if descriptor.entries.is_empty() {
        return Ok(Plan::NoRule);
    }
    let rules_match = match_descriptor(domain, &descriptor.entries);
    let matched = match &descriptor.limit {
        // The descriptor's own limit, as envoyproxy/ratelimit applies it.
        Some(limit) => {
            let unit = Unit::try_from(limit.unit).unwrap_or(Unit::Unknown);
            let Some(window) = config::window_of(unit) else {
                return Err(Status::invalid_argument(format!(
                    "the descriptor's limit override has no valid unit ({})",
                    limit.unit
                )));
            };
            let rule_limit = if limit.requests_per_unit == 0 {
                Limit::Zero
            } else {
                let quota = config::quota(
                    "override",
                    limit.requests_per_unit,
                    window,
                    domain.algorithm,
                )
                .map_err(|e| Status::invalid_argument(format!("limit override: {e}")))?;
                Limit::Quota(quota)
            };
            // A usage report's override is the window of the entries
            // before its report entry.
            let usage_report = rules_match.as_ref().is_some_and(|m| m.usage_report);
            let counted = match descriptor.entries.split_last() {
                Some((_, before)) if usage_report => before,
                _ => &descriptor.entries[..],
            };
            Matched {
                rule: Arc::new(Rule {
                    path: "override".to_owned(),
                    limit: rule_limit,
                    requests_per_unit: limit.requests_per_unit,
                    unit,
                    shadow: false,
                    quota_mode: false,
                    detailed_metric: false,
                    metadata: None,
                    name: String::new(),
                    replaces: Vec::new(),
                }),
                instance: override_instance(counted),
                usage_report,
            }
        }
        None => match rules_match {
            Some(matched) => matched,
            None => return Ok(Plan::NoRule),
        },
    };
    Ok(match &matched.rule.limit {
        Limit::Unlimited => Plan::Unlimited { rule: matched.rule },
        Limit::Zero => Plan::Zero { rule: matched.rule },
        Limit::Quota(quota) => Plan::Store {
            // Under a service-wide mode every window counts on its own.
            quota: quota
                .clone()
                .with_instance(&matched.instance)
                .shadowed(quota.is_shadow() || modes.shadow || modes.quota),
            rule: matched.rule,
            cost,
            report: matched.usage_report,
        },
    })
}

/// Leaves out every rule whose `name` another matched rule `replaces`.
fn drop_replaced(plans: &mut [Plan]) {
    let replacing: HashSet<String> = plans
        .iter()
        .filter_map(Plan::rule)
        .flat_map(|rule| rule.replaces.iter().cloned())
        .collect();
    if replacing.is_empty() {
        return;
    }
    for plan in plans.iter_mut() {
        if plan
            .rule()
            .is_some_and(|rule| !rule.name.is_empty() && replacing.contains(&rule.name))
        {
            *plan = Plan::NoRule;
        }
    }
}

/// `quota` under a name none of `taken` has (`name`, `name-2`, ...): the
/// window is the instance's whatever the name.
fn unique_name(quota: &Quota, taken: &[Quota]) -> Result<Quota, Status> {
    let base = quota.name();
    if !taken.iter().any(|q| q.name() == base) {
        return Ok(quota.clone());
    }
    let mut name = base.to_owned();
    let mut n = 1;
    while taken.iter().any(|q| q.name() == name) {
        n += 1;
        let suffix = format!("-{n}");
        // Names are ASCII: any byte index is a character boundary.
        let keep = base.len().min(64 - suffix.len());
        name = format!("{}{suffix}", &base[..keep]);
    }
    quota
        .clone()
        .named(&name)
        .map_err(|e| Status::internal(format!("cannot name a window: {e}")))
}

fn ok_without_limit() -> DescriptorStatus {
    DescriptorStatus {
        code: Code::Ok as i32,
        ..DescriptorStatus::default()
    }
}

fn current_limit(rule: &Rule) -> RateLimit {
    RateLimit {
        name: rule.name.clone(),
        requests_per_unit: rule.requests_per_unit,
        unit: rule.unit as i32,
    }
}

fn proto_duration(d: Duration) -> ProtoDuration {
    ProtoDuration {
        seconds: i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        nanos: i32::try_from(d.subsec_nanos()).unwrap_or(0),
    }
}

fn status_of(
    plan: &Plan,
    outcome: Option<&QuotaOutcome<'_>>,
    counters: &metrics::Counters,
) -> DescriptorStatus {
    match plan {
        Plan::NoRule => {
            counters.descriptor("no_rule");
            ok_without_limit()
        }
        Plan::Unlimited { .. } => {
            counters.descriptor("unlimited");
            DescriptorStatus {
                code: Code::Ok as i32,
                limit_remaining: u32::MAX,
                ..DescriptorStatus::default()
            }
        }
        Plan::Zero { rule } => {
            let code = if rule.shadow {
                counters.descriptor("shadow_over_limit");
                Code::Ok
            } else {
                counters.descriptor("over_limit");
                Code::OverLimit
            };
            DescriptorStatus {
                code: code as i32,
                current_limit: Some(current_limit(rule)),
                limit_remaining: 0,
                duration_until_reset: config::window_of(rule.unit).map(proto_duration),
                quota: None,
            }
        }
        Plan::Store { rule, report, .. } => {
            let Some(outcome) = outcome else {
                return ok_without_limit();
            };
            let decision = outcome.decision;
            // A degraded decision may not list the policy's quotas: it
            // then speaks for every one of them.
            // A decision lists its policy's quotas in policy order.
            let own = decision
                .quotas()
                .get(outcome.at)
                .filter(|q| q.quota().name() == outcome.name);
            let (fits, remaining, reset, retry) = match own {
                Some(q) => (q.allowed(), q.remaining(), q.reset_after(), q.retry_after()),
                None => (
                    decision.allowed(),
                    decision.remaining(),
                    decision.reset_after(),
                    decision.retry_after(),
                ),
            };
            // A usage report is answered OK whatever its window holds.
            let over = !fits && !outcome.peeked && !report;
            let code = if *report {
                counters.descriptor("usage_report");
                Code::Ok
            } else if over && rule.shadow {
                counters.descriptor("shadow_over_limit");
                Code::Ok
            } else if over && (own.is_some() || !decision.allowed()) {
                counters.descriptor("over_limit");
                Code::OverLimit
            } else {
                counters.descriptor("ok");
                Code::Ok
            };
            let until = match retry {
                Some(retry) if code == Code::OverLimit => retry,
                // A cost that never fits: the window's reset (at least its
                // length when nothing counts yet), never "retry at once".
                None if over && reset.is_zero() => config::window_of(rule.unit).unwrap_or_default(),
                _ => reset,
            };
            DescriptorStatus {
                code: code as i32,
                current_limit: Some(current_limit(rule)),
                limit_remaining: remaining,
                duration_until_reset: Some(proto_duration(until)),
                quota: None,
            }
        }
    }
}

fn response(
    code: Code,
    statuses: Vec<DescriptorStatus>,
    response_headers_to_add: Vec<HeaderValue>,
) -> RateLimitResponse {
    RateLimitResponse {
        overall_code: code as i32,
        statuses,
        response_headers_to_add,
        ..RateLimitResponse::default()
    }
}

/// The per-unit headers of `statuses` (see [`Headers::per_unit`]).
fn per_unit_headers(statuses: &[DescriptorStatus], names: &HeaderNames) -> Vec<HeaderValue> {
    // (unit, limit, remaining) of the least remaining per unit.
    let mut units: Vec<(i32, u32, u32)> = Vec::new();
    for status in statuses {
        let Some(limit) = &status.current_limit else {
            continue;
        };
        match units.iter_mut().find(|(unit, _, _)| *unit == limit.unit) {
            Some(least) if status.limit_remaining < least.2 => {
                *least = (limit.unit, limit.requests_per_unit, status.limit_remaining);
            }
            Some(_) => {}
            None => units.push((limit.unit, limit.requests_per_unit, status.limit_remaining)),
        }
    }
    let mut headers = Vec::with_capacity(units.len() * 2);
    for (unit, limit, remaining) in units {
        let suffix = match Unit::try_from(unit).unwrap_or(Unit::Unknown) {
            Unit::Second => "Seconds",
            Unit::Minute => "Minutes",
            Unit::Hour => "Hours",
            Unit::Day => "Days",
            Unit::Week => "Weeks",
            Unit::Month => "Months",
            Unit::Year => "Years",
            Unit::Unknown => continue,
        };
        for (name, value) in [(&names.limit, limit), (&names.remaining, remaining)] {
            headers.push(HeaderValue {
                key: format!("{name}-{suffix}"),
                value: value.to_string(),
                ..HeaderValue::default()
            });
        }
    }
    headers
}

/// The three rate limit headers of the descriptor that binds: an
/// over-limit one, else the one with the least remaining, as
/// envoyproxy/ratelimit writes them (`limit`: `requests_per_unit`;
/// `reset`: whole seconds, rounded up).
fn rate_limit_headers(statuses: &[DescriptorStatus], names: &HeaderNames) -> Vec<HeaderValue> {
    let binding = statuses
        .iter()
        .filter(|s| s.current_limit.is_some())
        .min_by_key(|s| (s.code != Code::OverLimit as i32, s.limit_remaining));
    let Some(status) = binding else {
        return Vec::new();
    };
    let Some(limit) = &status.current_limit else {
        return Vec::new();
    };
    let reset = status.duration_until_reset.as_ref().map_or(0, |d| {
        let seconds = u64::try_from(d.seconds).unwrap_or(0);
        seconds + u64::from(d.nanos > 0)
    });
    let header = |key: &str, value: String| HeaderValue {
        key: key.to_owned(),
        value,
        ..HeaderValue::default()
    };
    vec![
        header(&names.limit, limit.requests_per_unit.to_string()),
        header(&names.remaining, status.limit_remaining.to_string()),
        header(&names.reset, reset.to_string()),
    ]
}
