//! The rls's gRPC server: HTTP/2 (the `h2` crate, as under tonic and
//! hyper) straight to [`RlsService`], for its one unary method.
//!
//! Why not tonic's `Server`: a call there goes through tonic's router and
//! per-call layers (connect info, gRPC timeout, error recovery, a boxed
//! service and three boxed futures), hyper's task per HTTP/2 stream (a
//! spawn and two task wake-ups per call), and tonic's codec (an 8 KiB
//! buffer each way, a body wrapper per side). Here each connection is one
//! task: its calls are futures polled by that task (an HTTP/1.1 server's
//! shape: hyper serves the gateway so), a request's message is read as the
//! bytes it came in, looked up by those bytes in the service's cache of
//! prepared requests (decoded only when new), and the answer is encoded
//! into one buffer with its gRPC frame header. `benches/README.md` ("the
//! rls's per-call cost") has the measurements.
//!
//! What a gRPC client sees is what tonic's server answered: `UNIMPLEMENTED`
//! for another method or a compressed request (no compression is offered),
//! `INTERNAL` for a malformed frame or message, `RESOURCE_EXHAUSTED` for a
//! message over 4 MiB, and the service's own statuses; errors come as
//! trailers-only responses. HTTP/2 settings are hyper's server defaults
//! (1 MiB windows, 200 concurrent streams per connection, 16 KiB header
//! lists). A client's `grpc-timeout` is not enforced here (the client
//! gives up by itself, and a decision is bounded by the store's time
//! budget).

use std::future::Future;
use std::pin::pin;
use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse;
use futures_util::stream::{FuturesUnordered, StreamExt};
use h2::server::SendResponse;
use h2::RecvStream;
use http::{HeaderMap, HeaderValue, Response};
use prost::Message as _;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tonic::Status;

use super::service::RlsService;

/// The one method served.
pub const SHOULD_RATE_LIMIT: &str = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";

/// The largest request message (tonic's server default).
const MAX_MESSAGE: usize = 4 * 1024 * 1024;

/// A request's compression (a constant name: no parsing per lookup).
static GRPC_ENCODING: http::HeaderName = http::HeaderName::from_static("grpc-encoding");

/// The gRPC frame header: compressed flag and big-endian length.
const FRAME_HEADER: usize = 5;

/// Serves `service` on `listener` until `shutdown` resolves; then stops
/// accepting, tells every connection to finish (HTTP/2 `GOAWAY`: the
/// calls in flight are answered) and returns once they have, and once its
/// limiter's audit log (`--audit`) has written what it buffered (bounded:
/// see [`audit`](super::audit)).
pub async fn serve(
    listener: TcpListener,
    service: RlsService,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()> {
    let (stop, stopped) = watch::channel(false);
    {
        let mut shutdown = pin!(shutdown);
        loop {
            tokio::select! {
                () = &mut shutdown => break,
                accepted = listener.accept() => match accepted {
                    Ok((stream, _)) => {
                        // Small answers go out at once (as tonic's server
                        // set it).
                        if let Err(error) = stream.set_nodelay(true) {
                            tracing::debug!(%error, "cannot set TCP_NODELAY");
                        }
                        tokio::spawn(connection(stream, service.clone(), stopped.clone()));
                    }
                    Err(error) => {
                        // Out of file descriptors, say: wait a little
                        // rather than spin.
                        tracing::warn!(%error, "cannot accept a connection");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                },
            }
        }
        // The listening socket closes here: no new connection is taken.
    }
    drop(stopped);
    let _ = stop.send(true);
    stop.closed().await;
    super::audit::flush(service.limiter().audit()).await;
    Ok(())
}

/// One client connection: its calls, each a future of this task.
async fn connection(stream: TcpStream, service: RlsService, mut stop: watch::Receiver<bool>) {
    let mut builder = h2::server::Builder::new();
    builder
        .initial_window_size(1024 * 1024)
        .initial_connection_window_size(1024 * 1024)
        .max_concurrent_streams(200)
        .max_header_list_size(16 * 1024)
        .max_send_buffer_size(400 * 1024)
        .max_local_error_reset_streams(Some(1024));
    let handshake = builder.handshake::<_, Bytes>(stream);
    let mut connection = tokio::select! {
        handshake = handshake => match handshake {
            Ok(connection) => connection,
            Err(error) => {
                tracing::debug!(%error, "HTTP/2 handshake failed");
                return;
            }
        },
        _ = stop.changed() => return,
    };
    let mut calls = FuturesUnordered::new();
    let mut stopping = false;
    loop {
        tokio::select! {
            biased;
            Some(()) = calls.next(), if !calls.is_empty() => {}
            _ = stop.changed(), if !stopping => {
                stopping = true;
                connection.graceful_shutdown();
            }
            next = connection.accept() => match next {
                Some(Ok((request, respond))) => calls.push(call(&service, request, respond)),
                Some(Err(error)) => {
                    tracing::debug!(%error, "HTTP/2 connection failed");
                    break;
                }
                // Closed (after a `GOAWAY`, once every call was answered).
                None => break,
            },
        }
    }
}

/// One call: its answer, or its error as a trailers-only response.
async fn call(
    service: &RlsService,
    request: http::Request<RecvStream>,
    mut respond: SendResponse<Bytes>,
) {
    let (head, body) = request.into_parts();
    match answer(service, &head, body).await {
        Ok(message) => {
            let mut response = Response::new(());
            response
                .headers_mut()
                .insert(http::header::CONTENT_TYPE, grpc_content_type());
            // Errors here: the client reset the stream or left; nobody
            // to answer.
            let Ok(mut stream) = respond.send_response(response, false) else {
                return;
            };
            if stream.send_data(message, false).is_err() {
                return;
            }
            let mut trailers = HeaderMap::with_capacity(1);
            trailers.insert(Status::GRPC_STATUS, HeaderValue::from_static("0"));
            let _ = stream.send_trailers(trailers);
        }
        Err(status) => {
            let mut response = Response::new(());
            let headers = response.headers_mut();
            headers.insert(http::header::CONTENT_TYPE, grpc_content_type());
            if status.add_header(headers).is_err() {
                headers.insert(Status::GRPC_STATUS, HeaderValue::from_static("13"));
            }
            let _ = respond.send_response(response, true);
        }
    }
}

fn grpc_content_type() -> HeaderValue {
    HeaderValue::from_static("application/grpc")
}

/// The encoded answer to one call (its gRPC frame), or its status.
async fn answer(
    service: &RlsService,
    head: &http::request::Parts,
    body: RecvStream,
) -> Result<Bytes, Status> {
    if head.uri.path() != SHOULD_RATE_LIMIT {
        // As tonic's generated server answers: the code, no message.
        return Err(Status::unimplemented(""));
    }
    if let Some(encoding) = head.headers.get(&GRPC_ENCODING) {
        if encoding.as_bytes() != b"identity" {
            return Err(Status::unimplemented(format!(
                "Content is compressed with `{}` which isn't supported",
                String::from_utf8_lossy(encoding.as_bytes())
            )));
        }
    }
    let message = read_message(body).await?;
    let response = service.decide_encoded(message).await?;
    Ok(frame(&response))
}

/// The request's one message: the whole body (to its end) less the frame
/// header.
async fn read_message(mut body: RecvStream) -> Result<Bytes, Status> {
    // Mostly one DATA frame; more are gathered into one buffer.
    let mut first: Option<Bytes> = None;
    let mut gathered: Option<BytesMut> = None;
    let mut length = 0usize;
    while let Some(chunk) = body.data().await {
        let chunk = chunk.map_err(|e| Status::internal(format!("h2 protocol error: {e}")))?;
        // The connection's window is given back at once: the message is
        // ours now (bounded below).
        let _ = body.flow_control().release_capacity(chunk.len());
        length += chunk.len();
        if length > FRAME_HEADER + MAX_MESSAGE {
            return Err(too_large(length - FRAME_HEADER));
        }
        if let Some(buffer) = &mut gathered {
            buffer.extend_from_slice(&chunk);
        } else if let Some(earlier) = first.take() {
            let mut buffer = BytesMut::with_capacity(earlier.len() + chunk.len());
            buffer.extend_from_slice(&earlier);
            buffer.extend_from_slice(&chunk);
            gathered = Some(buffer);
        } else {
            first = Some(chunk);
        }
    }
    let body = match (gathered, first) {
        (Some(buffer), _) => buffer.freeze(),
        (None, Some(chunk)) => chunk,
        (None, None) => Bytes::new(),
    };
    unframe(body)
}

/// The message of a gRPC frame (one uncompressed message).
fn unframe(body: Bytes) -> Result<Bytes, Status> {
    if body.is_empty() {
        return Err(Status::internal("Missing request message."));
    }
    if body.len() < FRAME_HEADER {
        return Err(Status::internal("Unexpected EOF decoding stream."));
    }
    match body[0] {
        0 => {}
        1 => {
            return Err(Status::internal(
                "protocol error: received message with compressed-flag but no grpc-encoding was specified",
            ))
        }
        flag => {
            return Err(Status::internal(format!(
                "protocol error: received message with invalid compression flag: {flag} (valid flags are 0 and 1) while receiving request"
            )))
        }
    }
    let length = u32::from_be_bytes([body[1], body[2], body[3], body[4]]) as usize;
    if length > MAX_MESSAGE {
        return Err(too_large(length));
    }
    let end = FRAME_HEADER + length;
    if body.len() < end {
        return Err(Status::internal("Unexpected EOF decoding stream."));
    }
    if body.len() > end {
        return Err(Status::internal(
            "a unary call carries one request message, this one more",
        ));
    }
    Ok(body.slice(FRAME_HEADER..end))
}

fn too_large(length: usize) -> Status {
    Status::resource_exhausted(format!(
        "Error, decoded message length too large: found {length} bytes, the limit is: {MAX_MESSAGE} bytes"
    ))
}

/// `response` as one gRPC frame: flag, length, message, in one buffer.
fn frame(response: &RateLimitResponse) -> Bytes {
    let length = response.encoded_len();
    let mut buffer = BytesMut::with_capacity(FRAME_HEADER + length);
    buffer.put_u8(0);
    // A response is far below 4 GiB (a few descriptors' statuses).
    buffer.put_u32(u32::try_from(length).unwrap_or(u32::MAX));
    response.encode_raw(&mut buffer);
    buffer.freeze()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_frame_is_unframed_to_its_message() {
        let response = RateLimitResponse {
            overall_code: 1,
            ..RateLimitResponse::default()
        };
        let framed = frame(&response);
        assert_eq!(framed[0], 0);
        let message = unframe(framed).expect("one message");
        assert_eq!(
            RateLimitResponse::decode(message).expect("decodes"),
            response
        );
    }

    #[test]
    fn malformed_frames_are_internal_errors() {
        let cases: [&[u8]; 5] = [
            b"",
            b"\0\0\0",
            b"\x01\0\0\0\0",
            b"\x07\0\0\0\0",
            b"\0\0\0\0\x09abc",
        ];
        for body in cases {
            let status = unframe(Bytes::from_static(body)).expect_err("malformed");
            assert_eq!(status.code(), tonic::Code::Internal, "{body:?}");
        }
        let two = unframe(Bytes::from_static(b"\0\0\0\0\x01a\0\0\0\0\x01b")).expect_err("two");
        assert_eq!(two.code(), tonic::Code::Internal);
        let huge = unframe(Bytes::from_static(b"\0\xff\xff\xff\xff")).expect_err("too large");
        assert_eq!(huge.code(), tonic::Code::ResourceExhausted);
        assert_eq!(
            unframe(Bytes::from_static(b"\0\0\0\0\0")).expect("empty message"),
            Bytes::new()
        );
    }
}
