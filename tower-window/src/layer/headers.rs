//! Rate-limit response headers.
//!
//! `RateLimit` and `RateLimit-Policy` follow draft-ietf-httpapi-ratelimit-headers:
//! each is a structured-field list with one item per quota, named by the quota,
//!
//! ```text
//! RateLimit-Policy: "default";q=100;w=60
//! RateLimit: "default";r=42;t=17
//! ```
//!
//! where `q` is the quota's capacity, `w` its window, `r` the units left and
//! `t` the seconds (rounded up) until every counted unit has stopped
//! counting. A denial's `Retry-After` is sooner: when enough of the oldest
//! units have stopped counting for the request to fit.
//!
//! ```
//! use std::time::Duration;
//! use tower_window::layer::{insert_rate_limit_headers, insert_retry_after};
//! use tower_window::{Limiter, ManualClock, MemoryStore, Quota, WindowKey};
//!
//! # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
//! let clock = ManualClock::new(1_700_000_000_000_000);
//! let limiter = Limiter::new(MemoryStore::builder().clock(clock.clone()).build(), "100/1m".parse::<Quota>()?);
//! let key = WindowKey::for_subject("ann");
//! limiter.check(&key, 1).await?; // the first request, 2 s ago
//! clock.advance(Duration::from_secs(2));
//! for _ in 0..99 {
//!     limiter.check(&key, 1).await?;
//! }
//! let denied = limiter.check(&key, 1).await?;
//! let mut headers = http::HeaderMap::new();
//! insert_rate_limit_headers(&mut headers, &denied, false);
//! insert_retry_after(&mut headers, denied.retry_after().unwrap());
//! assert_eq!(headers["retry-after"], "58");
//! assert_eq!(headers["ratelimit"], r#""default";r=0;t=60"#);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! # }).unwrap();
//! ```

use std::cell::RefCell;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::header::{HeaderMap, HeaderName, HeaderValue, RETRY_AFTER};

use super::ceil_secs;
use crate::{Decision, Quota};

pub(crate) const RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");
pub(crate) const RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
pub(crate) const X_RATELIMIT_LIMIT: HeaderName = HeaderName::from_static("x-ratelimit-limit");
pub(crate) const X_RATELIMIT_REMAINING: HeaderName =
    HeaderName::from_static("x-ratelimit-remaining");
pub(crate) const X_RATELIMIT_RESET: HeaderName = HeaderName::from_static("x-ratelimit-reset");

/// Adds `RateLimit` and `RateLimit-Policy` for `decision` to `headers`,
/// and with `legacy` also `X-RateLimit-Limit`, `-Remaining` and `-Reset`.
///
/// `RateLimit-Policy` lists every quota of the policy; `RateLimit` (and the
/// legacy headers) the tightest enforced one, so a policy of
/// [shadow](crate::Quota::shadowed) quotas only sends no `RateLimit`. Both
/// are appended (nested limiters each add their members); the legacy
/// headers are replaced.
///
/// A policy item states the sustained rate as `q` units per `w` whole
/// seconds (`250/500ms` is `q=500;w=1`), plus a GCRA burst other than the
/// limit (`burst=20`) and `shadow` for a shadow quota.
///
/// ```
/// use std::time::Duration;
/// use tower_window::{layer::insert_rate_limit_headers, Decision, Quota};
///
/// let quota: Quota = "100/1m".parse()?;
/// let decision = Decision::allow(quota, 42, Duration::from_millis(16_200));
/// let mut headers = http::HeaderMap::new();
/// insert_rate_limit_headers(&mut headers, &decision, false);
/// assert_eq!(headers["ratelimit-policy"], r#""default";q=100;w=60"#);
/// assert_eq!(headers["ratelimit"], r#""default";r=42;t=17"#);
/// # Ok::<(), tower_window::QuotaError>(())
/// ```
pub fn insert_rate_limit_headers(headers: &mut HeaderMap, decision: &Decision, legacy: bool) {
    RateLimitHeaders::new(decision, legacy).append_to(headers);
}

/// The headers of [`insert_rate_limit_headers`], built from a decision
/// that then moves on (into the request's extensions), added later.
#[derive(Debug, Clone)]
pub struct RateLimitHeaders {
    policy: Option<HeaderValue>,
    state: Option<HeaderValue>,
    /// Numbers, not header values: this travels in the response future.
    legacy: Option<Legacy>,
}

#[derive(Debug, Clone, Copy)]
struct Legacy {
    limit: u32,
    remaining: u32,
    reset: u64,
}

impl RateLimitHeaders {
    /// The headers of `decision`; with `legacy`, the `X-RateLimit-*` ones too.
    pub fn new(decision: &Decision, legacy: bool) -> Self {
        let reset = ceil_secs(decision.reset_after);
        // The deciding quota is a shadow one only when all are: nothing to
        // advertise (a client honouring `r=0` would back off for nothing).
        let enforced = !decision.quota().is_shadow();
        let remaining = u64::from(decision.remaining);
        let (policy, state) = match decision.quotas() {
            // One quota: one cache look-up.
            [only] => with_cached(&only.quota, |cached| {
                let state = enforced.then(|| cached.state(remaining, reset)).flatten();
                (cached.policy.clone(), state)
            }),
            quotas => {
                let items: Vec<HeaderValue> = quotas
                    .iter()
                    .filter_map(|q| with_cached(&q.quota, |cached| cached.policy.clone()))
                    .collect();
                let state = enforced
                    .then(|| with_cached(decision.quota(), |cached| cached.state(remaining, reset)))
                    .flatten();
                (join_list(&items), state)
            }
        };
        let legacy = (legacy && enforced).then(|| Legacy {
            limit: decision.limit(),
            remaining: decision.remaining,
            reset,
        });
        Self {
            policy,
            state,
            legacy,
        }
    }

    /// `response` with `headers` added, if any.
    pub(super) fn added_to<B>(
        headers: Option<Self>,
        mut response: http::Response<B>,
    ) -> http::Response<B> {
        if let Some(headers) = headers {
            headers.append_to(response.headers_mut());
        }
        response
    }

    /// Adds them to `headers` (see [`insert_rate_limit_headers`]).
    pub fn append_to(self, headers: &mut HeaderMap) {
        if let Some(policy) = self.policy {
            headers.append(RATELIMIT_POLICY, policy);
        }
        if let Some(state) = self.state {
            headers.append(RATELIMIT, state);
        }
        if let Some(Legacy {
            limit,
            remaining,
            reset,
        }) = self.legacy
        {
            headers.insert(X_RATELIMIT_LIMIT, HeaderValue::from(limit));
            headers.insert(X_RATELIMIT_REMAINING, HeaderValue::from(remaining));
            headers.insert(X_RATELIMIT_RESET, HeaderValue::from(reset));
        }
    }
}

/// The largest integer a structured field may carry.
const MAX_SF_INTEGER: u64 = 999_999_999_999_999;

/// A quota's sustained rate as `(q, w)`: `q` units per `w` whole seconds,
/// `w` the shortest whole-second span that holds a whole number of windows.
pub(crate) fn sustained_rate(quota: &Quota) -> (u64, u64) {
    let window_ms = (quota.window_micros() / 1_000).max(1);
    let w_ms = lcm(window_ms, 1_000);
    let windows = w_ms / window_ms;
    let q = u64::from(quota.limit()).saturating_mul(windows);
    (q.min(MAX_SF_INTEGER), (w_ms / 1_000).min(MAX_SF_INTEGER))
}

fn lcm(a: u64, b: u64) -> u64 {
    let (mut x, mut y) = (a, b);
    while y != 0 {
        (x, y) = (y, x % y);
    }
    (a / x).saturating_mul(b)
}

/// How many quotas' header parts a thread keeps: one policy's quotas.
const POLICY_CACHE: usize = crate::quota::MAX_QUOTAS;

/// What the headers of every decision of one quota share, built once per
/// thread and quota.
struct Cached {
    /// The quota's id (name and definition).
    id: Arc<str>,
    /// Its `RateLimit-Policy` member (`None`: a name that cannot be sent).
    policy: Option<HeaderValue>,
    /// The start of its `RateLimit` member, `"<name>";r=` (empty: a name
    /// that cannot be sent).
    state_prefix: Box<[u8]>,
}

impl Cached {
    fn new(quota: &Quota) -> Self {
        let name = quota.name();
        let state_prefix = if valid_name(name) {
            [b"\"", name.as_bytes(), b"\";r="]
                .concat()
                .into_boxed_slice()
        } else {
            Box::default()
        };
        Self {
            id: quota.shared_id(),
            policy: policy_item(quota),
            state_prefix,
        }
    }

    /// The quota's `RateLimit` member: `"<name>";r=<remaining>;t=<reset>`,
    /// built for every admitted request with one exactly sized allocation.
    fn state(&self, remaining: u64, reset: u64) -> Option<HeaderValue> {
        if self.state_prefix.is_empty() {
            return None;
        }
        let (mut remaining_digits, mut reset_digits) = (itoa::Buffer::new(), itoa::Buffer::new());
        let parts: [&[u8]; 4] = [
            &self.state_prefix,
            remaining_digits.format(remaining).as_bytes(),
            b";t=",
            reset_digits.format(reset).as_bytes(),
        ];
        HeaderValue::from_maybe_shared(Bytes::from(parts.concat())).ok()
    }
}

thread_local! {
    /// The header parts last built on this thread, the newest last.
    static LAST_QUOTAS: RefCell<Vec<Cached>> = const { RefCell::new(Vec::new()) };
}

/// Calls `f` with `quota`'s cached header parts.
fn with_cached<T>(quota: &Quota, f: impl FnOnce(&Cached) -> T) -> T {
    LAST_QUOTAS.with(|last| {
        let mut last = last.borrow_mut();
        // Clones of one quota share its id: compare pointers before text.
        let id = quota.id();
        let same =
            |cached: &Arc<str>| std::ptr::eq(cached.as_ptr(), id.as_ptr()) || **cached == *id;
        if let Some(cached) = last.iter().find(|cached| same(&cached.id)) {
            return f(cached);
        }
        if last.len() == POLICY_CACHE {
            last.remove(0);
        }
        let cached = Cached::new(quota);
        let out = f(&cached);
        last.push(cached);
        out
    })
}

/// The `RateLimit-Policy` member of `quota` (see [`Cached`]).
fn policy_item(quota: &Quota) -> Option<HeaderValue> {
    let (q, w) = sustained_rate(quota);
    let mut value = match (quota.algorithm(), quota.burst()) {
        (crate::Algorithm::Gcra, Some(burst)) if burst != quota.limit() => item(
            quota.name(),
            &[(b"q", q), (b"w", w), (b"burst", u64::from(burst))],
        ),
        _ => item(quota.name(), &[(b"q", q), (b"w", w)]),
    }?;
    if quota.is_shadow() {
        // A boolean parameter: checked and reported, never enforced.
        value.extend_from_slice(b";shadow");
    }
    HeaderValue::from_maybe_shared(Bytes::from(value)).ok()
}

/// `a, b, c`: one structured-field list of the given members.
fn join_list(items: &[HeaderValue]) -> Option<HeaderValue> {
    // Exactly sized, so that `Bytes` takes the buffer without another
    // allocation: this runs for every request of a policy of several quotas.
    let len = items.iter().map(|i| i.len() + 2).sum::<usize>();
    let mut list = Vec::with_capacity(len.saturating_sub(2));
    for (i, value) in items.iter().enumerate() {
        if i > 0 {
            list.extend_from_slice(b", ");
        }
        list.extend_from_slice(value.as_bytes());
    }
    HeaderValue::from_maybe_shared(Bytes::from(list))
        .ok()
        .filter(|list| !list.is_empty())
}

/// Sets `Retry-After` to `wait` in whole seconds, rounded up and at least 1
/// (told 0, a client would retry at once).
pub fn insert_retry_after(headers: &mut HeaderMap, wait: Duration) {
    headers.insert(RETRY_AFTER, HeaderValue::from(ceil_secs(wait).max(1)));
}

/// One structured-field list member: `"<name>";<k1>=<v1>;<k2>=<v2>`.
///
/// Quota names are `[A-Za-z0-9_.-]`, so they need no escaping; anything else
/// (impossible for a valid quota) is skipped rather than sent malformed.
fn item(name: &str, params: &[(&[u8], u64)]) -> Option<Vec<u8>> {
    if !valid_name(name) {
        return None;
    }
    let mut numbers = itoa::Buffer::new();
    let mut value = [b"\"", name.as_bytes(), b"\""].concat();
    for &(key, number) in params {
        value.push(b';');
        value.extend_from_slice(key);
        value.push(b'=');
        value.extend_from_slice(numbers.format(number).as_bytes());
    }
    Some(value)
}

/// Whether `name` can be sent unescaped: `[A-Za-z0-9_.-]`.
fn valid_name(name: &str) -> bool {
    name.bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn ceil_secs_rounds_up() {
        assert_eq!(ceil_secs(Duration::ZERO), 0);
        assert_eq!(ceil_secs(Duration::from_micros(1)), 1);
        assert_eq!(ceil_secs(Duration::from_millis(300)), 1);
        assert_eq!(ceil_secs(Duration::from_millis(1_000)), 1);
        assert_eq!(ceil_secs(Duration::from_millis(1_200)), 2);
        assert_eq!(ceil_secs(Duration::MAX), u64::MAX);
    }

    #[test]
    fn retry_after_is_never_zero() {
        let mut headers = HeaderMap::new();
        insert_retry_after(&mut headers, Duration::ZERO);
        assert_eq!(headers[RETRY_AFTER], "1");
        insert_retry_after(&mut headers, Duration::from_millis(1_200));
        assert_eq!(headers[RETRY_AFTER], "2");
        assert_eq!(headers.get_all(RETRY_AFTER).iter().count(), 1);
    }

    #[test]
    fn headers_for_a_named_quota() {
        let quota: Quota = "250/500ms"
            .parse::<Quota>()
            .unwrap()
            .named("burst.api-1")
            .unwrap();
        let decision = Decision::deny(quota, 0, Duration::from_micros(1), None);
        let mut headers = HeaderMap::new();
        insert_rate_limit_headers(&mut headers, &decision, true);
        // 250 per half second is 500 per second.
        assert_eq!(headers[RATELIMIT_POLICY], r#""burst.api-1";q=500;w=1"#);
        assert_eq!(headers[RATELIMIT], r#""burst.api-1";r=0;t=1"#);
        assert_eq!(headers[X_RATELIMIT_LIMIT], "250");
        assert_eq!(headers[X_RATELIMIT_REMAINING], "0");
        assert_eq!(headers[X_RATELIMIT_RESET], "1");
    }

    /// Items too long for the stack buffer (a name of the longest length
    /// allowed, with the largest numbers) are built alike on the heap.
    #[test]
    fn items_longer_than_the_stack_buffer() {
        let name = "n".repeat(64);
        let quota: Quota = "4294967295/1ms"
            .parse::<Quota>()
            .unwrap()
            .named(&name)
            .unwrap();
        let decision = Decision::allow(quota, u32::MAX, Duration::MAX);
        let mut headers = HeaderMap::new();
        insert_rate_limit_headers(&mut headers, &decision, false);
        assert_eq!(
            headers[RATELIMIT],
            format!("\"{name}\";r=4294967295;t={}", u64::MAX).as_str()
        );
        assert_eq!(
            headers[RATELIMIT_POLICY],
            format!("\"{name}\";q=4294967295000;w=1").as_str()
        );
        let item = item(&name, &[(b"q", u64::MAX), (b"w", u64::MAX), (b"b", 1)]).unwrap();
        assert_eq!(item.len(), 2 + 64 + 2 * 23 + 4);
    }

    #[test]
    fn policy_items_state_the_sustained_rate() {
        let rate = |dsl: &str| sustained_rate(&dsl.parse::<Quota>().unwrap());
        assert_eq!(rate("100/1m"), (100, 60));
        assert_eq!(rate("250/500ms"), (500, 1));
        assert_eq!(rate("7/1500ms"), (14, 3));
        assert_eq!(rate("10/s gcra(burst=20)"), (10, 1));
        assert_eq!(rate("3/250ms fixed-window"), (12, 1));
        assert_eq!(rate("4294967295/1ms"), (4_294_967_295_000, 1));
        let mut headers = HeaderMap::new();
        let gcra: Quota = "10/s gcra(burst=20)".parse().unwrap();
        insert_rate_limit_headers(
            &mut headers,
            &Decision::allow(gcra, 19, Duration::ZERO),
            false,
        );
        assert_eq!(headers[RATELIMIT_POLICY], r#""default";q=10;w=1;burst=20"#);
        let plain: Quota = "10/s gcra".parse().unwrap();
        let mut headers = HeaderMap::new();
        insert_rate_limit_headers(
            &mut headers,
            &Decision::allow(plain, 9, Duration::ZERO),
            false,
        );
        assert_eq!(headers[RATELIMIT_POLICY], r#""default";q=10;w=1"#);
    }

    #[test]
    fn a_policy_lists_every_quota_and_the_tightest_in_ratelimit() {
        let a: Quota = "10/s".parse::<Quota>().unwrap().named("a").unwrap();
        let b: Quota = "100/1m".parse::<Quota>().unwrap().named("b").unwrap();
        let decision = Decision::from_quotas([
            crate::QuotaDecision::allow(a, 9, Duration::from_secs(1)),
            crate::QuotaDecision::allow(b, 5, Duration::from_secs(60)),
        ])
        .unwrap();
        let mut headers = HeaderMap::new();
        insert_rate_limit_headers(&mut headers, &decision, true);
        assert_eq!(headers[RATELIMIT_POLICY], r#""a";q=10;w=1, "b";q=100;w=60"#);
        assert_eq!(headers[RATELIMIT], r#""b";r=5;t=60"#);
        assert_eq!(headers[X_RATELIMIT_LIMIT], "100");
    }

    #[test]
    fn shadow_quotas_are_never_advertised_in_ratelimit() {
        let shadow: Quota = "5/1m"
            .parse::<Quota>()
            .unwrap()
            .named("minute")
            .unwrap()
            .shadowed(true);
        // Spent, yet admitting: every quota of the policy is shadow.
        let only = Decision::from_quotas([crate::QuotaDecision::deny(
            shadow.clone(),
            0,
            Duration::from_secs(60),
            Some(Duration::from_secs(60)),
        )])
        .unwrap();
        assert!(only.allowed);
        let mut headers = HeaderMap::new();
        insert_rate_limit_headers(&mut headers, &only, true);
        assert_eq!(headers[RATELIMIT_POLICY], r#""minute";q=5;w=60;shadow"#);
        assert!(!headers.contains_key(RATELIMIT), "{headers:?}");
        assert!(!headers.contains_key(X_RATELIMIT_LIMIT), "{headers:?}");
        assert!(!headers.contains_key(X_RATELIMIT_REMAINING), "{headers:?}");
        assert!(!headers.contains_key(X_RATELIMIT_RESET), "{headers:?}");
        // Beside an enforced quota, the enforced one is described.
        let burst: Quota = "10/1s".parse::<Quota>().unwrap().named("burst").unwrap();
        let mixed = Decision::from_quotas([
            crate::QuotaDecision::allow(burst, 9, Duration::from_secs(1)),
            crate::QuotaDecision::deny(shadow, 0, Duration::from_secs(60), None),
        ])
        .unwrap();
        let mut headers = HeaderMap::new();
        insert_rate_limit_headers(&mut headers, &mixed, true);
        assert_eq!(
            headers[RATELIMIT_POLICY],
            r#""burst";q=10;w=1, "minute";q=5;w=60;shadow"#
        );
        assert_eq!(headers[RATELIMIT], r#""burst";r=9;t=1"#);
        assert_eq!(headers[X_RATELIMIT_LIMIT], "10");
    }

    #[test]
    fn nested_limiters_append_list_members() {
        let a: Quota = "10/s".parse::<Quota>().unwrap().named("a").unwrap();
        let b: Quota = "100/1m".parse::<Quota>().unwrap().named("b").unwrap();
        let mut headers = HeaderMap::new();
        let a2 = a.clone();
        insert_rate_limit_headers(&mut headers, &Decision::allow(a, 9, Duration::ZERO), false);
        insert_rate_limit_headers(&mut headers, &Decision::allow(b, 99, Duration::ZERO), false);
        let values: Vec<_> = headers.get_all(RATELIMIT).iter().collect();
        assert_eq!(values, [r#""a";r=9;t=0"#, r#""b";r=99;t=0"#]);
        assert!(!headers.contains_key(X_RATELIMIT_LIMIT));
        // The policy value kept for the last quota is never another's.
        let policies: Vec<_> = headers.get_all(RATELIMIT_POLICY).iter().collect();
        assert_eq!(policies, [r#""a";q=10;w=1"#, r#""b";q=100;w=60"#]);
        let mut again = HeaderMap::new();
        insert_rate_limit_headers(&mut again, &Decision::allow(a2, 8, Duration::ZERO), false);
        assert_eq!(again[RATELIMIT_POLICY], r#""a";q=10;w=1"#);
    }
}
