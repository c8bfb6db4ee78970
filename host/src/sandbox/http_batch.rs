//! The `http-batch` interface: a plugin's requests sent at once through
//! its `grants.http` gate and pooled client, at most `http_max_in_flight`
//! of its version in flight, each within its own timeout and all within
//! the call's deadline; the call returns when every one has its result.

use std::collections::HashMap;
use std::time::Duration;

use bytes::Bytes;
use std::sync::atomic::{AtomicUsize, Ordering};

use http_body_util::{BodyExt, Full};
use wasmtime_wasi_http::WasiBody;

use super::bindings::transform::weir::plugin::http_batch::{
    self as api, FetchError, FetchOptions, Request, Response,
};
use super::http::{HttpGate, HttpPool};
use super::instance::PluginState;

/// The share of a call's deadline kept for the plugin after its requests.
const ANSWER_SHARE: u32 = 10;

impl api::Host for PluginState {
    async fn fetch_all(
        &mut self,
        requests: Vec<Request>,
        options: FetchOptions,
    ) -> Vec<Result<Response, FetchError>> {
        let answers = fetch_all(&self.gate, requests, options).await;
        count_results(&self.plugin, &answers);
        answers
    }
}

/// `weir_plugin_http_requests_total`: each answer by how it ended (a copy
/// of a deduplicated GET counts as its own request).
fn count_results(plugin: &super::Plugin, answers: &[Result<Response, FetchError>]) {
    let mut counts = [0u64; 4];
    for answer in answers {
        counts[match answer {
            Ok(_) => 0,
            Err(FetchError::Refused(_)) => 1,
            Err(FetchError::Timeout) => 2,
            Err(FetchError::Failed(_)) => 3,
        }] += 1;
    }
    let results = ["response", "refused", "timeout", "failed"];
    for (result, count) in results.into_iter().zip(counts) {
        if count > 0 {
            plugin
                .metrics
                .plugin_http_requests
                .get_or_create(&crate::telemetry::PluginHttpLabels {
                    plugin: plugin.config.name.clone(),
                    result,
                })
                .inc_by(count);
        }
    }
}

/// What one request of a batch needs once it is checked.
struct Checked {
    request: axum::http::Request<WasiBody>,
    pool: HttpPool,
}

async fn fetch_all(
    gate: &HttpGate,
    requests: Vec<Request>,
    options: FetchOptions,
) -> Vec<Result<Response, FetchError>> {
    // A tenth of the deadline is left for the plugin to answer its rows
    // once the requests are done, so a lookup that times out fails its own
    // row rather than the whole call.
    let answer_time = gate.deadline / ANSWER_SHARE;
    let ends = tokio::time::Instant::from_std(
        gate.call_ends
            .checked_sub(answer_time)
            .unwrap_or(gate.call_ends),
    );
    let own_timeout =
        (options.timeout_ms > 0).then(|| Duration::from_millis(u64::from(options.timeout_ms)));
    // Each request's index is its own, or that of the first identical GET.
    let sent_as = if options.dedupe {
        same_gets(&requests)
    } else {
        (0..requests.len()).collect()
    };
    let mut refused = 0usize;
    let mut pending = Vec::new();
    let mut results: Vec<Option<Result<Response, FetchError>>> = vec![None; requests.len()];
    for (index, request) in requests.into_iter().enumerate() {
        if sent_as[index] != index {
            continue;
        }
        match check(gate, request) {
            Ok(checked) => pending.push((index, checked)),
            Err(reason) => {
                refused += 1;
                results[index] = Some(Err(FetchError::Refused(reason)));
            }
        }
    }
    if refused > 0 {
        tracing::warn!(
            plugin = %gate.plugin,
            refused,
            "http-batch requests refused (not in grants.http, or malformed)"
        );
    }
    // Every body of the call lands in the guest's memory at once: together
    // they get no more than its cap, so a hostile server cannot make the
    // host hold more than that for one call.
    let body_budget = AtomicUsize::new(gate.max_body_bytes);
    let budget = &body_budget;
    let sends = pending.into_iter().map(|(index, checked)| {
        let in_flight = gate.in_flight.clone();
        async move {
            let result = send(checked, &in_flight, own_timeout, ends, budget).await;
            (index, result)
        }
    });
    for (index, result) in futures::future::join_all(sends).await {
        results[index] = Some(result);
    }
    // From the end: a request's copies all come after it, so each is
    // cloned before the original is taken out.
    let mut answers = Vec::with_capacity(sent_as.len());
    for (index, &first) in sent_as.iter().enumerate().rev() {
        let answer = if first == index {
            results[index].take()
        } else {
            results[first].clone()
        };
        answers.push(answer.unwrap_or_else(|| Err(FetchError::Failed("not sent".into()))));
    }
    answers.reverse();
    answers
}

/// A header's name and value.
type Header = (String, String);

/// For each request, the index of the first `GET` with the same URL and
/// headers (its own for any other request): what one batch sends once.
fn same_gets(requests: &[Request]) -> Vec<usize> {
    let mut first: HashMap<(&str, &[Header]), usize> = HashMap::new();
    requests
        .iter()
        .enumerate()
        .map(|(index, request)| {
            if !request.method.eq_ignore_ascii_case("GET") || !request.body.is_empty() {
                return index;
            }
            *first
                .entry((request.url.as_str(), request.headers.as_slice()))
                .or_insert(index)
        })
        .collect()
}

/// The request as hyper sends it, if the grant lets it out and it is well
/// formed; else the reason it is refused.
fn check(gate: &HttpGate, request: Request) -> Result<Checked, String> {
    let uri: axum::http::Uri = request
        .url
        .parse()
        .map_err(|err| format!("`{}` is not a URL: {err}", request.url))?;
    let scheme_ok = matches!(uri.scheme_str(), Some("http" | "https"));
    let authority = HttpGate::authority_of(&uri)
        .filter(|_| scheme_ok)
        .ok_or_else(|| {
            format!(
                "`{}` is not an absolute http:// or https:// URL",
                request.url
            )
        })?;
    let pool = match &gate.pool {
        Some(pool) if gate.allowed.contains(&authority) => pool.clone(),
        _ => {
            return Err(format!(
                "`{authority}` is not in plugin `{}`'s grants.http",
                gate.plugin
            ));
        }
    };
    let method = axum::http::Method::from_bytes(request.method.as_bytes())
        .map_err(|_| format!("`{}` is not an HTTP method", request.method))?;
    let mut builder = axum::http::Request::builder().method(method).uri(uri);
    for (name, value) in &request.headers {
        builder = builder.header(name.as_str(), value.as_str());
    }
    if !gate.keep_alive {
        builder = builder.header(axum::http::header::CONNECTION, "close");
    }
    let body = Full::new(Bytes::from(request.body))
        .map_err(|never| match never {})
        .boxed_unsync();
    let request = builder
        .body(body)
        .map_err(|err| format!("request to `{}` is malformed: {err}", request.url))?;
    Ok(Checked { request, pool })
}

/// Sends one request once a place is free: its own timeout runs from
/// then, and nothing outlasts the call's end.
async fn send(
    checked: Checked,
    in_flight: &tokio::sync::Semaphore,
    own_timeout: Option<Duration>,
    ends: tokio::time::Instant,
    body_budget: &AtomicUsize,
) -> Result<Response, FetchError> {
    let _place = tokio::time::timeout_at(ends, in_flight.acquire())
        .await
        .map_err(|_| FetchError::Timeout)?
        .map_err(|_| FetchError::Failed("the plugin is unloading".into()))?;
    let until = own_timeout.map_or(ends, |own| (tokio::time::Instant::now() + own).min(ends));
    let Checked { request, pool } = checked;
    let exchange = async {
        let response = pool
            .request(request)
            .await
            .map_err(|err| FetchError::Failed(causes(&err)))?;
        let (parts, mut body) = response.into_parts();
        let mut bytes = Vec::new();
        let mut reserved = Reserved {
            budget: body_budget,
            bytes: 0,
        };
        while let Some(frame) = body.frame().await {
            let frame =
                frame.map_err(|err| FetchError::Failed(format!("reading the body: {err}")))?;
            let Ok(data) = frame.into_data() else {
                continue; // trailers
            };
            if !reserved.take(data.len()) {
                return Err(FetchError::Failed(
                    "the responses of this call are larger than the plugin's memory cap".into(),
                ));
            }
            bytes.extend_from_slice(&data);
        }
        let headers = parts
            .headers
            .iter()
            .map(|(name, value)| {
                (
                    name.as_str().to_string(),
                    String::from_utf8_lossy(value.as_bytes()).into_owned(),
                )
            })
            .collect();
        // Its bytes stay counted: they go to the guest with the others.
        std::mem::forget(reserved);
        Ok(Response {
            status: parts.status.as_u16(),
            headers,
            body: bytes,
        })
    };
    tokio::time::timeout_at(until, exchange)
        .await
        .map_err(|_| FetchError::Timeout)?
}

/// Bytes of the call's body budget one response holds, given back if it
/// fails (an error, a timeout) so that the others may use them.
struct Reserved<'a> {
    budget: &'a AtomicUsize,
    bytes: usize,
}

impl Reserved<'_> {
    /// Takes `bytes` more from the budget, if it has them.
    fn take(&mut self, bytes: usize) -> bool {
        let taken = self
            .budget
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |left| {
                left.checked_sub(bytes)
            })
            .is_ok();
        if taken {
            self.bytes += bytes;
        }
        taken
    }
}

impl Drop for Reserved<'_> {
    fn drop(&mut self) {
        self.budget.fetch_add(self.bytes, Ordering::SeqCst);
    }
}

/// An error and its causes, `outer: inner: …`, as a plugin's reason.
fn causes(err: &dyn std::error::Error) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.ends_with(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(method: &str, url: &str) -> Request {
        Request {
            method: method.into(),
            url: url.into(),
            headers: Vec::new(),
            body: Vec::new(),
        }
    }

    #[test]
    fn identical_gets_are_sent_once_and_anything_else_each_time() {
        let requests = [
            request("GET", "http://a/1"),
            request("GET", "http://a/2"),
            request("get", "http://a/1"),
            request("POST", "http://a/1"),
            request("POST", "http://a/1"),
            Request {
                headers: vec![("x".into(), "y".into())],
                ..request("GET", "http://a/1")
            },
        ];
        assert_eq!(same_gets(&requests), [0, 1, 0, 3, 4, 5]);
    }
}
