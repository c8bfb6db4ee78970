//! Outbound HTTP for plugins with `grants.http`: each request must go to a
//! granted authority, within what is left of the call's deadline.

use std::time::{Duration, Instant};

use wasmtime_wasi_http::{RequestOptions, WasiBody, WasiHttpHooks};

/// Lets a plugin's outbound HTTP request out only to an authority in its
/// `grants.http`, and never for longer than what is left of its call.
pub(super) struct HttpGate {
    pub(super) plugin: String,
    /// Normalized `host:port` authorities (see `config::parse_authority`).
    pub(super) allowed: Vec<String>,
    /// The running call's deadline (a copy of `PluginState::call_ends`).
    pub(super) call_ends: Instant,
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

    /// The guest's timeouts, none longer than what is left of the call: a
    /// call blocked in the host on a response is not interrupted by the
    /// epoch, so these are what keep it within its deadline.
    pub(super) fn bounded(&self, options: Option<RequestOptions>) -> RequestOptions {
        let left = self
            .call_ends
            .saturating_duration_since(Instant::now())
            .max(Duration::from_millis(1));
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
        request: axum::http::Request<WasiBody>,
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
        let options = self.bounded(options);
        Box::new(async move {
            let (response, io) =
                wasmtime_wasi_http::default_send_request(request, Some(options)).await?;
            Ok((
                response.map(WasiBody::new),
                Box::new(io) as Box<dyn Future<Output = _> + Send>,
            ))
        })
    }
}
