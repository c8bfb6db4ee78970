//! Outbound HTTP for plugins with `grants.http`: each request must go to a
//! granted authority, within what is left of the call's deadline, over a
//! keep-alive connection of the plugin version's pool (or, with
//! `http_keep_alive = false`, a connection of its own).

use std::pin::Pin;
use std::task::{Context, Poll, ready};
use std::time::{Duration, Instant};

use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use wasmtime_wasi_http::{RequestOptions, WasiBody, WasiHttpHooks};

/// An idle connection is closed after this long: shorter than most servers'
/// own keep-alive timeouts (nginx 75 s, Go 90 s), so that it is rarely the
/// server that closes it first.
pub(crate) const IDLE_TIMEOUT: Duration = Duration::from_secs(30);
/// Idle connections kept per authority: one per instance a plugin usually
/// runs at once; more than this are closed when their request completes.
pub(crate) const MAX_IDLE_PER_AUTHORITY: usize = 32;

/// One plugin version's keep-alive connections, per authority (the client
/// keys its pool by scheme and authority), shared by all its instances.
pub(crate) type HttpPool = Client<hyper_rustls::HttpsConnector<HttpConnector>, WasiBody>;

/// The pool of a plugin version: plain HTTP or TLS (trusting the roots
/// `wasmtime_wasi_http`'s own client trusts, and `private_roots`: the
/// plugin's `http_ca`), HTTP/1 with keep-alive.
/// `connect_timeout` bounds a TCP connect; each request's own bounds are
/// applied around it by [`HttpGate`]. Without `keep_alive` nothing is kept
/// idle, which turns hyper's pool off: each request connects anew. Fails
/// only if ring's TLS provider lacks rustls's default protocol versions.
pub(crate) fn pool(
    connect_timeout: Duration,
    keep_alive: bool,
    private_roots: Vec<rustls::pki_types::CertificateDer<'static>>,
) -> Result<HttpPool, rustls::Error> {
    let mut tcp = HttpConnector::new();
    tcp.enforce_http(false);
    // A request is one or two small writes: Nagle would hold the second.
    tcp.set_nodelay(true);
    tcp.set_connect_timeout(Some(connect_timeout));
    let mut roots = rustls::RootCertStore {
        roots: webpki_roots::TLS_SERVER_ROOTS.into(),
    };
    for root in private_roots {
        roots.add(root)?;
    }
    let tls = rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()?
    .with_root_certificates(roots)
    .with_no_client_auth();
    let connector = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_or_http()
        .enable_http1()
        .wrap_connector(tcp);
    Ok(Client::builder(TokioExecutor::new())
        .pool_idle_timeout(IDLE_TIMEOUT)
        .pool_max_idle_per_host(if keep_alive {
            MAX_IDLE_PER_AUTHORITY
        } else {
            0
        })
        .pool_timer(TokioTimer::new())
        .build(connector))
}

/// Lets a plugin's outbound HTTP request out only to an authority in its
/// `grants.http`, and never for longer than what is left of its call.
pub(super) struct HttpGate {
    pub(super) plugin: String,
    /// Normalized `host:port` authorities (see `config::parse_authority`).
    pub(super) allowed: Vec<String>,
    /// The running call's deadline (a copy of `PluginState::call_ends`).
    pub(super) call_ends: Instant,
    /// How long a call may run (`deadline`): `http-batch` leaves a tenth
    /// of it for the plugin to answer after its requests.
    pub(super) deadline: Duration,
    /// The plugin version's connections; `None` without `grants.http`.
    pub(super) pool: Option<HttpPool>,
    /// `false` (`http_keep_alive = false`): each request says
    /// `Connection: close`, so the server does not hold the socket either.
    pub(super) keep_alive: bool,
    /// Places for `http-batch` requests in flight, shared by the plugin
    /// version's instances (`http_max_in_flight`).
    pub(super) in_flight: std::sync::Arc<tokio::sync::Semaphore>,
    /// Most response bytes one `http-batch` call reads, all its bodies
    /// together: the plugin's memory cap, since it could not take more.
    pub(super) max_body_bytes: usize,
}

pub(super) type ResponseFuture = Box<
    dyn Future<
            Output = wasmtime_wasi_http::Result<(
                axum::http::Response<WasiBody>,
                Box<dyn Future<Output = wasmtime_wasi_http::Result<()>> + Send>,
            )>,
        > + Send,
>;

impl HttpGate {
    /// `host:port` of a request, the port defaulted from the scheme, lowercased.
    pub(super) fn authority_of(uri: &axum::http::Uri) -> Option<String> {
        let authority = uri.authority()?;
        let port = authority.port_u16().unwrap_or(
            if uri.scheme() == Some(&axum::http::uri::Scheme::HTTPS) {
                443
            } else {
                80
            },
        );
        Some(format!("{}:{port}", authority.host().to_ascii_lowercase()))
    }

    /// What is left of the running call (at least a millisecond).
    fn left(&self) -> Duration {
        self.call_ends
            .saturating_duration_since(Instant::now())
            .max(Duration::from_millis(1))
    }

    /// The guest's timeouts, none longer than what is left of the call: a
    /// call blocked in the host on a response is not interrupted by the
    /// epoch, so these are what keep it within its deadline.
    pub(super) fn bounded(&self, options: Option<RequestOptions>) -> RequestOptions {
        let left = self.left();
        let bound = |asked: Option<Duration>| Some(asked.map_or(left, |asked| asked.min(left)));
        let options = options.unwrap_or_default();
        RequestOptions {
            connect_timeout: bound(options.connect_timeout),
            first_byte_timeout: bound(options.first_byte_timeout),
            between_bytes_timeout: bound(options.between_bytes_timeout),
        }
    }
}

impl WasiHttpHooks for HttpGate {
    fn send_request(
        &mut self,
        mut request: axum::http::Request<WasiBody>,
        options: Option<RequestOptions>,
        fut: Box<dyn Future<Output = wasmtime_wasi_http::Result<()>> + Send>,
    ) -> ResponseFuture {
        drop(fut);
        let authority = Self::authority_of(request.uri());
        let granted = authority
            .as_ref()
            .is_some_and(|authority| self.allowed.contains(authority));
        if !granted {
            let authority = authority.unwrap_or_else(|| request.uri().to_string());
            tracing::warn!(
                plugin = %self.plugin,
                %authority,
                "outbound HTTP request denied: not in grants.http"
            );
            return Box::new(async { Err(wasmtime_wasi_http::Error::HttpRequestDenied) });
        }
        let Some(pool) = self.pool.clone() else {
            return Box::new(async { Err(wasmtime_wasi_http::Error::HttpRequestDenied) });
        };
        if !self.keep_alive {
            request.headers_mut().insert(
                axum::http::header::CONNECTION,
                axum::http::HeaderValue::from_static("close"),
            );
        }
        let options = self.bounded(options);
        // A pooled request may connect first or not: its head must come
        // within connect + first-byte, and never after the call's end.
        let head_within = options
            .connect_timeout
            .unwrap_or_default()
            .saturating_add(options.first_byte_timeout.unwrap_or_default())
            .min(self.left());
        let between_bytes = options
            .between_bytes_timeout
            .unwrap_or_default()
            .max(Duration::from_nanos(1));
        Box::new(async move {
            let response = tokio::time::timeout(head_within, pool.request(request))
                .await
                .map_err(|_| wasmtime_wasi_http::Error::ConnectionReadTimeout)?
                .map_err(send_error)?;
            let mut timeout = tokio::time::interval(between_bytes);
            timeout.reset();
            let response =
                response.map(|incoming| WasiBody::new(BoundedBody { incoming, timeout }));
            // The pool drives the connection: nothing is left for the caller to await.
            let io = async { Ok(()) };
            Ok((response, Box::new(io) as Box<dyn Future<Output = _> + Send>))
        })
    }
}

/// What the guest sees of a failed pooled request.
fn send_error(err: hyper_util::client::legacy::Error) -> wasmtime_wasi_http::Error {
    use std::error::Error as _;
    use wasmtime_wasi_http::Error;
    let mut source = err.source();
    while let Some(cause) = source {
        if let Some(io) = cause.downcast_ref::<std::io::Error>() {
            return match io.kind() {
                std::io::ErrorKind::ConnectionRefused => Error::ConnectionRefused,
                std::io::ErrorKind::TimedOut => Error::ConnectionTimeout,
                kind => Error::Connect(std::io::Error::new(kind, err.to_string())),
            };
        }
        if cause.downcast_ref::<rustls::Error>().is_some() {
            return Error::TlsProtocolError;
        }
        if let Some(hyper) = cause.downcast_ref::<hyper::Error>() {
            return if hyper.is_timeout() {
                Error::HttpResponseTimeout
            } else if hyper.is_incomplete_message() || hyper.is_canceled() || hyper.is_closed() {
                Error::ConnectionTerminated
            } else {
                Error::HttpProtocolError
            };
        }
        source = cause.source();
    }
    if err.is_connect() {
        Error::DestinationUnavailable
    } else {
        Error::HttpProtocolError
    }
}

/// A response body that fails when no frame comes within `timeout` of the
/// last one (the guest's between-bytes bound, at most its call's end).
struct BoundedBody {
    incoming: hyper::body::Incoming,
    timeout: tokio::time::Interval,
}

impl hyper::body::Body for BoundedBody {
    type Data = bytes::Bytes;
    type Error = wasmtime_wasi_http::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<hyper::body::Frame<Self::Data>, Self::Error>>> {
        match Pin::new(&mut self.incoming).poll_frame(cx) {
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Ready(Some(Err(err))) => Poll::Ready(Some(Err(if err.is_timeout() {
                wasmtime_wasi_http::Error::HttpResponseTimeout
            } else {
                wasmtime_wasi_http::Error::from(err)
            }))),
            Poll::Ready(Some(Ok(frame))) => {
                self.timeout.reset();
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Pending => {
                ready!(self.timeout.poll_tick(cx));
                Poll::Ready(Some(Err(wasmtime_wasi_http::Error::ConnectionReadTimeout)))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.incoming.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.incoming.size_hint()
    }
}
