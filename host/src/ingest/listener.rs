//! The HTTP listener the front door and the operator endpoints share: a
//! cap on open connections (past it a connection gets a bare 503 and is
//! closed, before anything is read), a deadline for a request's headers
//! (which also closes idle keep-alive connections), TLS when `[tls]` is
//! set (the handshake within the same deadline), and a graceful stop.
//! Body deadlines and sizes are the front door's (`front_door.rs`).

use std::sync::Arc;
use std::time::Duration;

use axum::extract::ConnectInfo;
use axum::http::Request;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto::Builder;
use hyper_util::server::graceful::GracefulShutdown;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tower_service::Service;

use crate::ingest::tls::FrontDoorTls;
use crate::telemetry::Metrics;

/// Connections open at once, across clients.
pub const MAX_CONNECTIONS: usize = 1024;
/// How long a client has to send a request's headers (or, on an idle
/// keep-alive connection, to start the next request).
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// A connection's read buffer at most: what a client that sends faster
/// than its body is read can make the host hold.
const READ_BUFFER_BYTES: usize = 64 << 10;
/// How long a stop lets requests in flight finish.
const STOP_GRACE: Duration = Duration::from_secs(10);
/// What a connection past the cap is told.
const BUSY: &[u8] = b"HTTP/1.1 503 Service Unavailable\r\nRetry-After: 1\r\n\
    Content-Type: application/json\r\nContent-Length: 52\r\nConnection: close\r\n\r\n\
    {\"error\":\"too many connections; retry in a second\"}";

/// Serves `app` on `listener` (over TLS with `tls`) until `stop`, then
/// lets requests in flight finish (up to a grace period).
pub async fn serve(
    listener: TcpListener,
    app: axum::Router,
    metrics: Metrics,
    tls: Option<Arc<FrontDoorTls>>,
    stop: CancellationToken,
) {
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    let graceful = GracefulShutdown::new();
    let mut builder = Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_TIMEOUT)
        .max_buf_size(READ_BUFFER_BYTES);
    loop {
        let (stream, peer) = tokio::select! {
            () = stop.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(err) => {
                    // Out of file descriptors, say: a pause, not a stop.
                    tracing::warn!(error = %err, "cannot accept a connection");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            metrics.connections_refused.inc();
            tokio::spawn(async move {
                let mut stream = stream;
                let _ = tokio::time::timeout(Duration::from_secs(1), stream.write_all(BUSY)).await;
            });
            continue;
        };
        let _ = stream.set_nodelay(true);
        // Handlers see the peer's address (`ConnectInfo`): failed keys are
        // counted per address.
        let app = app.clone();
        let https = tls.is_some();
        let service = hyper::service::service_fn(move |mut request: Request<Incoming>| {
            request.extensions_mut().insert(ConnectInfo(peer));
            if https {
                // What a TLS proxy would say: the page's cookie is then `Secure`.
                request.headers_mut().insert(
                    "x-forwarded-proto",
                    axum::http::HeaderValue::from_static("https"),
                );
            }
            let mut app = app.clone();
            async move { app.call(request).await }
        });
        let Some(tls) = &tls else {
            let connection = builder
                .serve_connection_with_upgrades(TokioIo::new(stream), service)
                .into_owned();
            let connection = graceful.watch(connection);
            tokio::spawn(async move {
                if let Err(err) = connection.await {
                    tracing::debug!(error = %err, "HTTP connection ended with an error");
                }
                drop(slot);
            });
            continue;
        };
        // The handshake runs in the connection's task, within the header
        // deadline: a slow client holds its own slot, not the accept loop.
        let (acceptor, builder, watcher) = (tls.acceptor(), builder.clone(), graceful.watcher());
        tokio::spawn(async move {
            let stream = match tokio::time::timeout(HEADER_TIMEOUT, acceptor.accept(stream)).await {
                Ok(Ok(stream)) => stream,
                Ok(Err(err)) => {
                    tracing::debug!(error = %err, %peer, "TLS handshake failed");
                    return;
                }
                Err(_) => return,
            };
            let connection = builder
                .serve_connection_with_upgrades(TokioIo::new(stream), service)
                .into_owned();
            if let Err(err) = watcher.watch(connection).await {
                tracing::debug!(error = %err, "HTTPS connection ended with an error");
            }
            drop(slot);
        });
    }
    drop(listener);
    if tokio::time::timeout(STOP_GRACE, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::debug!("HTTP requests still running after the stop grace period");
    }
}
