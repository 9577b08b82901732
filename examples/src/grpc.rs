//! The tonic example (`--bin grpc`): a gRPC service behind
//! [`SlidingWindowLayer`] in [`Grpc`](tower_window::layer::Grpc) mode, with
//! a quota per method and caller.
//!
//! * The service is `inventory.v1.Inventory` from `proto/inventory.proto`,
//!   compiled at build time (build.rs: protox, then tonic-prost-build).
//! * A call's key is its `x-api-key` metadata entry ([`Metadata`]) within
//!   the called method ([`GrpcMethod`], `inventory.v1.Inventory.GetItem`):
//!   the method is the key's tenant, so a [`TenantRegistry`] whose tenants
//!   are method names gives each method its own policy, and each caller its
//!   own windows in it. Methods without an entry get the default policy.
//! * A denial is `RESOURCE_EXHAUSTED` with a `google.rpc.RetryInfo` detail
//!   and the `RateLimit` metadata; a call without `x-api-key` is
//!   `INVALID_ARGUMENT`; an admitted call's response metadata carries
//!   `RateLimit` and `RateLimit-Policy`, and its handler reads the
//!   [`Decision`] from the request's extensions.

use std::net::SocketAddr;

use clap::Parser;
use tokio::net::TcpListener;
use tonic::transport::server::TcpIncoming;
use tonic::transport::Server;
use tonic::{Request, Response, Status};
use tower_window::key::{GrpcMethod, KeyExtractorExt, Metadata};
use tower_window::tenant::{TenantRegistry, TenantSpec, TenantsConfig};
use tower_window::{Decision, Limiter, MemoryStore, Quota, SlidingWindowLayer};

/// The messages, client and server generated from `proto/inventory.proto`.
#[allow(missing_docs, unreachable_pub, clippy::all)]
pub mod pb {
    tonic::include_proto!("inventory.v1");
}

use pb::inventory_server::{Inventory, InventoryServer};
use pb::{GetItemRequest, Item, Reservation, ReserveRequest};

/// The metadata entry naming the caller.
pub const API_KEY: &str = "x-api-key";

/// A boxed error.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A call as the layer sees it.
type Call = tower_window::http::Request<tonic::body::Body>;

/// The example's flags (each also read from a `TW_GRPC_*` environment variable).
#[derive(Debug, Clone, Parser)]
#[command(
    name = "grpc",
    version,
    about = "A tonic service with per-method quotas"
)]
pub struct GrpcArgs {
    /// Address to serve gRPC (HTTP/2 without TLS) on.
    #[arg(long, env = "TW_GRPC_LISTEN", default_value = "127.0.0.1:50051")]
    pub listen: SocketAddr,
    /// Quota of `GetItem` per API key (the quota DSL, e.g. `5/1m`).
    #[arg(long, env = "TW_GRPC_GET_ITEM", default_value = "5/1m")]
    pub get_item: String,
    /// Quota of `Reserve` per API key.
    #[arg(long, env = "TW_GRPC_RESERVE", default_value = "2/1m")]
    pub reserve: String,
    /// Quota of any other method per API key.
    #[arg(long, env = "TW_GRPC_DEFAULT", default_value = "20/1m")]
    pub default: String,
}

impl Default for GrpcArgs {
    fn default() -> Self {
        Self::parse_from(["grpc"])
    }
}

/// The per-method policies: tenants named by the methods' full names.
pub fn method_quotas(args: &GrpcArgs) -> Result<TenantsConfig, BoxError> {
    let spec = |name: &str, dsl: &str| TenantSpec::builder().quota(name, dsl)?.build();
    Ok(TenantsConfig::new()
        .with_default(spec("calls", &args.default)?)
        .with_tenant(
            "inventory.v1.Inventory.GetItem",
            spec("reads", &args.get_item)?,
        )?
        .with_tenant(
            "inventory.v1.Inventory.Reserve",
            spec("reservations", &args.reserve)?,
        )?)
}

/// The service's handlers: answers from a fixed stock.
#[derive(Debug, Clone, Copy, Default)]
pub struct InventoryService;

#[tonic::async_trait]
impl Inventory for InventoryService {
    async fn get_item(&self, request: Request<GetItemRequest>) -> Result<Response<Item>, Status> {
        // The layer's decision, handed to the handler.
        let remaining = request
            .extensions()
            .get::<Decision>()
            .map_or(0, Decision::remaining);
        let sku = request.into_inner().sku;
        if sku.is_empty() {
            return Err(Status::invalid_argument("sku is empty"));
        }
        Ok(Response::new(Item {
            sku,
            in_stock: 42,
            quota_remaining: remaining,
        }))
    }

    async fn reserve(
        &self,
        request: Request<ReserveRequest>,
    ) -> Result<Response<Reservation>, Status> {
        let ReserveRequest { sku, units } = request.into_inner();
        Ok(Response::new(Reservation { sku, units }))
    }
}

/// Serves the limited service on `listener` until the task is dropped.
pub async fn serve(listener: TcpListener, args: &GrpcArgs) -> Result<(), BoxError> {
    let registry = TenantRegistry::new(method_quotas(args)?);
    // Every method resolves to a policy of the registry (the default for
    // unlisted ones); the limiter's own policy is never used.
    let limiter = Limiter::new(MemoryStore::new(), args.default.parse::<Quota>()?);
    let key = KeyExtractorExt::<Call>::with_tenant(Metadata::new(API_KEY)?, GrpcMethod::new());
    let layer = SlidingWindowLayer::new(limiter, key)
        .grpc()
        .tenants(registry);
    Server::builder()
        .layer(layer)
        .add_service(InventoryServer::new(InventoryService))
        .serve_with_incoming(TcpIncoming::from(listener))
        .await?;
    Ok(())
}
