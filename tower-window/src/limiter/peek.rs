//! [`Limiter::peek_policy`]: a policy's usage read from the store, consuming nothing.

use crate::store::{CheckRequest, Store};
use crate::{Decision, LimitError, Limiter, Policy, WindowKey};

impl Limiter {
    /// Reads `key`'s windows under `policy` from the store without
    /// recording anything: every quota's `remaining` and `reset_after` as
    /// they stand, and `allowed` = whether `cost` would be admitted now.
    /// For usage reports (the admin API's usage endpoint).
    ///
    /// It is one store operation through the limiter's resilience stack
    /// (the failure domain's breaker, the in-flight bound, the time budget,
    /// retries of calls the store certainly did not apply) but it never
    /// consults the local tier or the fallback policy: when the store
    /// cannot answer, the error is returned.
    ///
    /// ```
    /// use tower_window::{Limiter, MemoryStore, Quota, WindowKey};
    ///
    /// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
    /// let limiter = Limiter::new(MemoryStore::new(), "10/1m".parse::<Quota>()?);
    /// let key = WindowKey::for_subject("alice");
    /// limiter.check(&key, 3).await?;
    /// let usage = limiter.peek_policy(&key, limiter.policy(), 1).await?;
    /// assert_eq!(usage.remaining, 7);
    /// assert_eq!(limiter.peek_policy(&key, limiter.policy(), 1).await?.remaining, 7);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # }).unwrap();
    /// ```
    pub async fn peek_policy(
        &self,
        key: &WindowKey,
        policy: &Policy,
        cost: u32,
    ) -> Result<Decision, LimitError> {
        if cost == 0 {
            return Err(LimitError::ZeroCost);
        }
        let request = CheckRequest::new(key, policy, cost);
        let store: &dyn Store = self.store();
        let domain = self
            .has_breaker()
            .then(|| store.failure_domain(key, policy))
            .flatten();
        self.run(domain, policy, || None, move || store.peek(request))
            .await
            .map_err(|failure| LimitError::Store(failure.into_error()))
    }
}
