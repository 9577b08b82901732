//! [`SlidingWindowLayer`]: the middleware's configuration.

use std::fmt;
use std::sync::Arc;

use tower_layer::Layer;

use super::service::SlidingWindow;
use super::{Http, Status, Typed, UnitCost};
use crate::tenant::TenantRegistry;
use crate::Limiter;

/// What to do with a request from which the key extractor gets no key (a
/// key too long is always [`Rejection::KeyTooLong`](super::Rejection::KeyTooLong)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum MissingKey {
    /// Answer with this status (default `400`), as a
    /// [`Rejection::MissingKey`](super::Rejection::MissingKey).
    Reject(Status),
    /// Let the request through unlimited and without rate-limit headers.
    Skip,
}

impl Default for MissingKey {
    fn default() -> Self {
        Self::Reject(Status::BAD_REQUEST)
    }
}

/// Applies a [`Limiter`] to every request of a service.
///
/// `K` is the [`KeyExtractor`](crate::KeyExtractor), `C` the
/// [`RequestCost`](super::RequestCost), `M` the mode ([`Http`], [`Typed`] or
/// `Grpc`). Every service built, and every clone, shares the one `Limiter`;
/// `K` and `C` are shared behind an `Arc` and need not be `Clone`.
///
/// Nested layers decide outer first, so an inner denial has already
/// consumed the outer quotas; for all-or-nothing limits use one layer whose
/// [`Policy`](crate::Policy) holds every quota. Examples: [module docs](crate::layer).
pub struct SlidingWindowLayer<K, C = UnitCost, M = Http> {
    pub(super) limiter: Limiter,
    pub(super) key: Arc<K>,
    pub(super) cost: Arc<C>,
    pub(super) missing_key: MissingKey,
    pub(super) degraded_status: Status,
    pub(super) mode: M,
    pub(super) tenants: Option<TenantRegistry>,
}

impl<K> SlidingWindowLayer<K> {
    /// A layer checking every request against `limiter`, keyed by `key`,
    /// each request costing one unit, answering over HTTP.
    pub fn new(limiter: Limiter, key: K) -> Self {
        Self {
            limiter,
            key: Arc::new(key),
            cost: Arc::new(UnitCost),
            missing_key: MissingKey::default(),
            degraded_status: Status::SERVICE_UNAVAILABLE,
            mode: Http::default(),
            tenants: None,
        }
    }
}

impl<K, C, M> SlidingWindowLayer<K, C, M> {
    /// Weighs each request with `cost`, a [`RequestCost`](super::RequestCost)
    /// such as a closure `Fn(&Req) -> u32`.
    pub fn cost<C2>(self, cost: C2) -> SlidingWindowLayer<K, C2, M> {
        self.map(|_| Arc::new(cost), |mode| mode)
    }

    /// What to do when a request has no key (default: reject with 400).
    pub fn on_missing_key(mut self, policy: MissingKey) -> Self {
        self.missing_key = policy;
        self
    }

    /// The status of a [`Rejection::Degraded`](super::Rejection::Degraded)
    /// (default `503`; `429` makes an outage look like rate limiting).
    pub fn degraded_status(mut self, status: impl Into<Status>) -> Self {
        self.degraded_status = status.into();
        self
    }

    /// Switches to [`Typed`] mode, for any `Service<Req>`.
    pub fn typed_errors(self) -> SlidingWindowLayer<K, C, Typed> {
        self.mode(Typed)
    }

    /// Switches to [`Grpc`](super::Grpc) mode, for tonic services.
    #[cfg(feature = "grpc")]
    pub fn grpc(self) -> SlidingWindowLayer<K, C, super::Grpc> {
        self.mode(super::Grpc::new())
    }

    /// Switches to another mode (a custom [`Respond`](super::Respond)).
    pub fn mode<M2>(self, mode: M2) -> SlidingWindowLayer<K, C, M2> {
        self.map(|cost| cost, |_| mode)
    }

    /// Switches to [`Metered`](super::Metered) mode around the current
    /// mode: each request reserves its cost, and its usage, counted from
    /// the response by `usage`, is settled when the response ends (tokens
    /// of a streamed answer). Set the current mode's options first.
    #[cfg(feature = "http")]
    pub fn metered<U>(self, usage: U) -> SlidingWindowLayer<K, C, super::Metered<U, M>> {
        self.map(|cost| cost, |mode| super::Metered::new(usage, mode))
    }

    fn map<C2, M2>(
        self,
        cost: impl FnOnce(Arc<C>) -> Arc<C2>,
        mode: impl FnOnce(M) -> M2,
    ) -> SlidingWindowLayer<K, C2, M2> {
        SlidingWindowLayer {
            limiter: self.limiter,
            key: self.key,
            cost: cost(self.cost),
            missing_key: self.missing_key,
            degraded_status: self.degraded_status,
            mode: mode(self.mode),
            tenants: self.tenants,
        }
    }

    /// Checks each request against its key's tenant's policy in `registry`
    /// instead of the limiter's: an [unlimited](crate::tenant::TenantSpec::unlimited)
    /// tenant passes unchecked and without headers, an unknown one is
    /// [`Rejection::UnknownTenant`](super::Rejection::UnknownTenant) (`403`).
    ///
    /// ```
    /// use tower::{ServiceBuilder, ServiceExt};
    /// use tower_window::key::{Header, KeyExtractorExt};
    /// use tower_window::tenant::{TenantRegistry, TenantSpec, TenantsConfig};
    /// use tower_window::{Limiter, MemoryStore, Quota, SlidingWindowLayer};
    ///
    /// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
    /// let config = TenantsConfig::new()
    ///     .with_tenant("acme", TenantSpec::builder().quota("burst", "1/1m")?.build()?)?;
    /// let registry = TenantRegistry::new(config);
    /// let limiter = Limiter::new(MemoryStore::new(), "100/1m".parse::<Quota>()?);
    /// let key = Header::new("x-user")?.with_tenant(Header::new("x-tenant")?);
    /// let service = ServiceBuilder::new()
    ///     .layer(SlidingWindowLayer::new(limiter, key).tenants(registry))
    ///     .service_fn(|_req: http::Request<String>| async {
    ///         Ok::<_, std::convert::Infallible>(http::Response::new(String::new()))
    ///     });
    /// let request = |tenant: &str| {
    ///     http::Request::builder().header("x-tenant", tenant).header("x-user", "u").body(String::new())
    /// };
    /// assert_eq!(service.clone().oneshot(request("acme")?).await?.status(), 200);
    /// assert_eq!(service.clone().oneshot(request("acme")?).await?.status(), 429);
    /// assert_eq!(service.oneshot(request("nobody")?).await?.status(), 403);
    /// # Ok::<(), Box<dyn std::error::Error + Send + Sync>>(())
    /// # }).unwrap();
    /// ```
    pub fn tenants(mut self, registry: TenantRegistry) -> Self {
        self.tenants = Some(registry);
        self
    }

    /// The limiter shared by every service of this layer.
    pub fn limiter(&self) -> &Limiter {
        &self.limiter
    }
}

impl<K, C, R> SlidingWindowLayer<K, C, Http<R>> {
    /// Also send the legacy `X-RateLimit-Limit`, `X-RateLimit-Remaining` and
    /// `X-RateLimit-Reset` headers (off by default).
    pub fn legacy_headers(self, enabled: bool) -> Self {
        self.map(|cost| cost, |mode| mode.legacy_headers(enabled))
    }

    /// Whether an admitted request carries its [`Decision`](crate::Decision)
    /// in its extensions (on by default); see [`Http::decision_extension`].
    pub fn decision_extension(self, enabled: bool) -> Self {
        self.map(|cost| cost, |mode| mode.decision_extension(enabled))
    }

    /// Builds rejection responses (status and body) with `rejection`, an
    /// [`OnRejection`](super::OnRejection) for the service's response body.
    pub fn rejection<R2>(self, rejection: R2) -> SlidingWindowLayer<K, C, Http<R2>> {
        self.map(|cost| cost, |mode| mode.rejection(rejection))
    }
}

#[cfg(feature = "http")]
impl<K, C, U, M> SlidingWindowLayer<K, C, super::Metered<U, M>> {
    /// Ends a response whose usage reaches its budget at the next frame
    /// boundary; see [`Metered::cut_off`](super::Metered::cut_off).
    pub fn cut_off(self, enabled: bool) -> Self {
        self.map(|cost| cost, |mode| mode.cut_off(enabled))
    }
}

#[cfg(feature = "grpc")]
impl<K, C> SlidingWindowLayer<K, C, super::Grpc> {
    /// Whether an admitted request carries its [`Decision`](crate::Decision)
    /// in its extensions (on by default); see [`Grpc::decision_extension`](super::Grpc::decision_extension).
    pub fn decision_extension(self, enabled: bool) -> Self {
        self.map(|cost| cost, |mode| mode.decision_extension(enabled))
    }
}

impl<K, C, M: Clone> Clone for SlidingWindowLayer<K, C, M> {
    fn clone(&self) -> Self {
        Self {
            limiter: self.limiter.clone(),
            key: Arc::clone(&self.key),
            cost: Arc::clone(&self.cost),
            missing_key: self.missing_key,
            degraded_status: self.degraded_status,
            mode: self.mode.clone(),
            tenants: self.tenants.clone(),
        }
    }
}

impl<K, C, M: fmt::Debug> fmt::Debug for SlidingWindowLayer<K, C, M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SlidingWindowLayer")
            .field("limiter", &self.limiter)
            .field("key", &std::any::type_name::<K>())
            .field("cost", &std::any::type_name::<C>())
            .field("missing_key", &self.missing_key)
            .field("degraded_status", &self.degraded_status)
            .field("mode", &self.mode)
            .finish()
    }
}

impl<S, K, C, M: Clone> Layer<S> for SlidingWindowLayer<K, C, M> {
    type Service = SlidingWindow<S, K, C, M>;

    fn layer(&self, inner: S) -> Self::Service {
        SlidingWindow::new(inner, Arc::new(self.clone().map(|cost| cost, Arc::new)))
    }
}
