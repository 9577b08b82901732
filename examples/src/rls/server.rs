//! The rls's gRPC endpoint: `ShouldRateLimit` served like envoy-types'
//! generated `RateLimitServiceServer`, with one difference: the messages
//! are encoded and decoded through small buffers. A `ShouldRateLimit`
//! request and answer are a few hundred bytes, and tonic's default buffer
//! (8 KiB per call, each way) made every call allocate, copy and free
//! more than it carries (`benches/README.md`, issue 25).

use std::convert::Infallible;
use std::task::{Context, Poll};

use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use tonic::codec::{BufferSettings, Codec};
use tonic::codegen::{http, Body, BoxFuture, Service, StdError};
use tonic::server::{NamedService, UnaryService};
use tonic_prost::ProstCodec;

use super::RlsService;

/// The method's path.
const PATH: &str = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";

/// Buffer size of one call's encoding and decoding (it grows when a
/// message needs more), and how much is buffered before yielding.
fn buffers() -> BufferSettings {
    BufferSettings::new(512, 32 * 1024)
}

type Prost = ProstCodec<RateLimitResponse, RateLimitRequest>;

/// prost's codec with [`buffers`].
#[derive(Debug, Clone, Copy, Default)]
struct SmallBuffers;

impl Codec for SmallBuffers {
    type Encode = RateLimitResponse;
    type Decode = RateLimitRequest;
    type Encoder = <Prost as Codec>::Encoder;
    type Decoder = <Prost as Codec>::Decoder;

    fn encoder(&mut self) -> Self::Encoder {
        Prost::raw_encoder(buffers())
    }

    fn decoder(&mut self) -> Self::Decoder {
        Prost::raw_decoder(buffers())
    }
}

/// `envoy.service.ratelimit.v3.RateLimitService` for a tonic server
/// (`Server::builder().add_service(RlsServer::new(service))`).
#[derive(Debug, Clone)]
pub struct RlsServer {
    service: RlsService,
}

impl RlsServer {
    /// Serves `service`.
    pub fn new(service: RlsService) -> Self {
        Self { service }
    }
}

impl NamedService for RlsServer {
    const NAME: &'static str = "envoy.service.ratelimit.v3.RateLimitService";
}

impl<B> Service<http::Request<B>> for RlsServer
where
    B: Body + Send + 'static,
    B::Error: Into<StdError> + Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        if request.uri().path() != PATH {
            // As the generated server answers an unknown method.
            return Box::pin(async {
                let mut response = http::Response::new(tonic::body::Body::default());
                let headers = response.headers_mut();
                headers.insert(
                    tonic::Status::GRPC_STATUS,
                    (tonic::Code::Unimplemented as i32).into(),
                );
                headers.insert(
                    http::header::CONTENT_TYPE,
                    tonic::metadata::GRPC_CONTENT_TYPE,
                );
                Ok(response)
            });
        }
        let method = ShouldRateLimit(self.service.clone());
        Box::pin(async move {
            let mut grpc = tonic::server::Grpc::new(SmallBuffers);
            Ok(grpc.unary(method, request).await)
        })
    }
}

/// The one method.
struct ShouldRateLimit(RlsService);

impl UnaryService<RateLimitRequest> for ShouldRateLimit {
    type Response = RateLimitResponse;
    type Future = BoxFuture<tonic::Response<RateLimitResponse>, tonic::Status>;

    fn call(&mut self, request: tonic::Request<RateLimitRequest>) -> Self::Future {
        let service = self.0.clone();
        Box::pin(async move {
            service
                .decide(request.get_ref())
                .await
                .map(tonic::Response::new)
        })
    }
}
