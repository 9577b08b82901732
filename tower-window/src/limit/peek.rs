//! [`Limiter::peek_policy`]: a policy's usage, consuming nothing.

use crate::store::CheckRequest;
use crate::{Cost, Decision, LimitError, Limiter, Policy, QuotaCosts, WindowKey};

impl Limiter {
    /// Reads `key`'s windows under `policy` from the store without
    /// recording anything: every quota's `remaining` and `reset_after` as
    /// they stand, and `allowed` = whether `cost` would be admitted now.
    ///
    /// One store operation through the store's resilience stack; it never
    /// consults the local tier or the fallback policy, so a store failure
    /// is returned as an error.
    ///
    /// ```
    /// use tower_window::{Limiter, MemoryStore, Quota, WindowKey};
    ///
    /// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
    /// let limiter = Limiter::new(MemoryStore::new(), "10/1m".parse::<Quota>()?);
    /// let key = WindowKey::for_subject("alice");
    /// limiter.check(&key, 3).await?;
    /// let usage = limiter.peek_policy(&key, limiter.policy(), 1).await?;
    /// assert_eq!(usage.remaining(), 7);
    /// assert_eq!(limiter.peek_policy(&key, limiter.policy(), 1).await?.remaining(), 7);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # }).unwrap();
    /// ```
    pub async fn peek_policy(
        &self,
        key: &WindowKey,
        policy: &Policy,
        cost: impl crate::IntoCost,
    ) -> Result<Decision, LimitError> {
        let cost = cost.into_cost()?;
        self.peek(CheckRequest::new(key, policy, cost)).await
    }

    /// Like [`peek_policy`](Self::peek_policy), with a cost per quota
    /// (`costs[i]` for quota `i`, as
    /// [`check_policy_per_quota`](Self::check_policy_per_quota) takes
    /// them): `allowed` = whether those costs would be admitted together.
    pub async fn peek_policy_per_quota(
        &self,
        key: &WindowKey,
        policy: &Policy,
        costs: &QuotaCosts,
    ) -> Result<Decision, LimitError> {
        super::one_per_quota(policy, costs.len())?;
        // The cost becomes the largest of `costs`.
        let request = CheckRequest::new(key, policy, Cost::ONE).with_quota_costs(costs.as_slice());
        self.peek(request).await
    }

    async fn peek(&self, request: CheckRequest<'_>) -> Result<Decision, LimitError> {
        self.call_windows(request.key, request.policy, |windows, guard| {
            windows.peek(guard, request)
        })
        .await
        .map_err(LimitError::Store)
    }
}
