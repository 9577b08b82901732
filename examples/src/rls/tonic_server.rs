//! The rls served by tonic's own gRPC server (`--grpc-server tonic`): the
//! same [`RlsService`] behind `RateLimitServiceServer` from `envoy-types`,
//! for those who want tonic's server (its router, layers and `grpc-timeout`
//! enforcement). The default, [`serve`](super::serve), answers the same on
//! `h2` directly at about two thirds of tonic's CPU per call
//! (`benches/README.md`, "the rls's per-call cost").

use std::future::Future;

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::RateLimitServiceServer;
use tokio::net::TcpListener;
use tonic::transport::server::TcpIncoming;

use super::service::RlsService;

/// Serves `service` on `listener` with tonic's server until `shutdown`
/// resolves; then stops accepting and returns once the calls in flight
/// are answered, and once its limiter's audit log (`--audit`) has written
/// what it buffered (bounded: see [`audit`](super::audit)).
pub async fn serve_with_tonic(
    listener: TcpListener,
    service: RlsService,
    shutdown: impl Future<Output = ()>,
) -> Result<(), tonic::transport::Error> {
    let audit = service.limiter().audit().cloned();
    let incoming = TcpIncoming::from(listener).with_nodelay(Some(true));
    let served = tonic::transport::Server::builder()
        .add_service(RateLimitServiceServer::new(service))
        .serve_with_incoming_shutdown(incoming, shutdown)
        .await;
    super::audit::flush(audit.as_ref()).await;
    served
}
