//! The gateway's and the rls's look at their store: at start, one log line
//! naming the store and why it cannot be reached (or a refusal to start,
//! `--require-store`); afterwards a readiness endpoint, `GET /readyz`, that
//! answers `503` while the store cannot decide.
//!
//! A probe reads a throwaway key's window (a peek: it records nothing).
//! At start it goes to the store's backend and connection pool past the
//! breakers and retries, to learn the store's own reason with a longer
//! wait than one decision's budget. Readiness goes through the store's
//! resilience stack like every decision: an open breaker answers for its
//! failure domain, and after its cooldown the readiness peek is the probe
//! that closes it again, so a node nobody sends traffic to (taken out of a
//! load balancer for being unready) still becomes ready. Breakers of other
//! domains (a cluster's other primaries) are counted from the store.

use std::sync::Arc;
use std::time::Duration;

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde_json::json;
use tower_window::{Limiter, Quota, Store, WindowKey};

/// How long the probe at start waits for the store: long enough for a
/// slow first connection (TLS, DNS), short enough not to hold a start.
pub const START_TIMEOUT: Duration = Duration::from_secs(2);

/// How long one readiness probe waits for the store.
pub const READY_TIMEOUT: Duration = Duration::from_secs(1);

/// Looks at one store: the one every decision of the binary goes to.
#[derive(Debug, Clone)]
pub struct StoreProbe {
    /// Limiters for the peek on the store (`store`) and on its backend
    /// without the resilience stack (`bare`); `None` for the embedded
    /// store, which always answers.
    peek: Option<Peek>,
    target: String,
}

#[derive(Debug, Clone)]
struct Peek {
    store: Limiter,
    bare: Limiter,
}

impl StoreProbe {
    /// A probe of `store`, named `target` in logs and answers (see
    /// [`describe_store`]; never a password).
    pub fn new(store: &Store, target: impl Into<String>) -> Self {
        // Its own quota name, so its store calls chart apart.
        let quota = Quota::per_second(1).and_then(|quota| quota.named("store-probe"));
        // The embedded store always answers: nothing to probe.
        let networked = quota.ok().filter(|_| !store.is_in_process());
        let peek = networked.map(|quota| Peek {
            store: Limiter::new(store.clone(), quota.clone()),
            bare: Limiter::new(store.without_resilience(), quota),
        });
        Self {
            peek,
            target: target.into(),
        }
    }

    /// The store, as named in logs (`redis://host:6379`, never a password).
    pub fn target(&self) -> &str {
        &self.target
    }

    /// `Ok` when the store can decide now (through its breakers and time
    /// budget, as a decision would); otherwise why not: a breaker open,
    /// the store's own error (unresolvable host, connection refused,
    /// authentication, TLS...), or no answer within `timeout`.
    pub async fn check(&self, timeout: Duration) -> Result<(), String> {
        let Some(peek) = &self.peek else {
            return Ok(());
        };
        peek_once(&peek.store, timeout).await?;
        match peek.store.open_breakers() {
            0 => Ok(()),
            open => Err(format!(
                "{open} circuit breaker(s) open: part of the store failed recently and is not called until it cools down"
            )),
        }
    }

    /// The probe at start: logs one line naming the store and, when it
    /// cannot be reached, why, at `ERROR`. With `required`, an unreachable
    /// store is an error (the message to exit with) instead.
    pub async fn at_start(&self, required: bool) -> Result<(), String> {
        let reached = match &self.peek {
            Some(peek) => peek_once(&peek.bare, START_TIMEOUT).await,
            None => Ok(()),
        };
        match reached {
            Ok(()) => {
                tracing::info!(store = %self.target, "store reachable");
                Ok(())
            }
            Err(reason) if required => Err(format!(
                "store {} cannot be reached: {reason}\n  fix: check the URL and that the store is up, or leave out --require-store to start anyway and answer from the fallback until it is",
                self.target
            )),
            Err(reason) => {
                tracing::error!(
                    store = %self.target,
                    %reason,
                    "store unreachable at start: decisions use the fallback until it answers, and /readyz answers 503"
                );
                Ok(())
            }
        }
    }

    /// `GET /readyz`: `200 {"status":"ready",...}` when the store can
    /// decide, `503 {"status":"degraded",...,"reason":...}` when it cannot.
    pub fn router(self) -> Router {
        let probe = Arc::new(self);
        Router::new().route(
            "/readyz",
            get(move || {
                let probe = Arc::clone(&probe);
                async move { probe.readiness().await }
            }),
        )
    }

    async fn readiness(&self) -> Response {
        match self.check(READY_TIMEOUT).await {
            Ok(()) => Json(json!({ "status": "ready", "store": self.target })).into_response(),
            Err(reason) => (
                StatusCode::SERVICE_UNAVAILABLE,
                Json(json!({ "status": "degraded", "store": self.target, "reason": reason })),
            )
                .into_response(),
        }
    }
}

/// One peek of a throwaway key through `limiter`, bounded by `timeout`.
async fn peek_once(limiter: &Limiter, timeout: Duration) -> Result<(), String> {
    let key = WindowKey::new("tower-window", "store-probe");
    let peek = limiter.peek_policy(&key, limiter.policy(), 1);
    match tokio::time::timeout(timeout, peek).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(error)) => Err(error_chain(&error)),
        Err(_) => Err(format!("no answer within {} ms", timeout.as_millis())),
    }
}

/// An error and its causes, `: `-separated (the store's message alone
/// often leaves out the system's reason).
fn error_chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}

/// The store as a log names it: `embedded`, the Redis URL, or the cluster's
/// seed URLs, each without its password.
pub fn describe_store(redis_url: Option<&str>, redis_cluster: &[String]) -> String {
    match redis_url {
        Some(url) => redact(url),
        None if redis_cluster.is_empty() => "embedded".to_owned(),
        None => redis_cluster
            .iter()
            .map(|url| redact(url))
            .collect::<Vec<_>>()
            .join(","),
    }
}

/// `url` with the password of its user info replaced by `***`
/// (`redis://app:***@host:6379`).
pub fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, path) = rest.split_at(authority_end);
    let Some((user_info, host)) = authority.rsplit_once('@') else {
        return url.to_owned();
    };
    let user = match user_info.split_once(':') {
        Some((user, _password)) => format!("{user}:***"),
        // `redis://app@host`: a user name alone.
        None => user_info.to_owned(),
    };
    format!("{scheme}://{user}@{host}{path}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redact_hides_the_password_only() {
        assert_eq!(
            redact("rediss://app:s3cr%40t@cache.example:6380/2"),
            "rediss://app:***@cache.example:6380/2"
        );
        assert_eq!(redact("redis://:pw@h:1"), "redis://:***@h:1");
        assert_eq!(redact("redis://h:1/0"), "redis://h:1/0");
        assert_eq!(
            redact("redis+unix:///tmp/r.sock"),
            "redis+unix:///tmp/r.sock"
        );
        assert_eq!(
            describe_store(
                None,
                &["redis://a:x@h:1".to_owned(), "redis://h:2".to_owned()]
            ),
            "redis://a:***@h:1,redis://h:2"
        );
        assert_eq!(describe_store(None, &[]), "embedded");
    }
}
