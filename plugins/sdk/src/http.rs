//! Many outbound HTTP requests sent at once (`grants.http` in the plugin's
//! TOML): the host sends them concurrently and [`fetch_all`] returns when
//! every one is done, one result per request, in order. A transform that
//! enriches 256 rows waits for about the slowest lookup times
//! 256 / `http_max_in_flight`, not for 256 round trips. Both worlds with
//! rows (`transform`, `sink`) import it.
//!
//! What the host promises (the WIT's `http-batch` interface):
//! - a request to an authority outside `grants.http` (every request,
//!   without a grant) is [`FetchError::Refused`] with the reason
//!   `` `host:port` is not in plugin `NAME`'s grants.http ``, and never sent;
//! - at most `http_max_in_flight` requests of the plugin version are in
//!   flight at once (across its instances); the others wait for a place;
//! - each request has [`FetchOptions::timeout_ms`] from when it is sent,
//!   and every one ends a tenth of the call's deadline before it (that
//!   tenth is left to answer the rows; the deadline keeps running while
//!   the call waits): past either it is [`FetchError::Timeout`];
//! - with [`FetchOptions::dedupe`], identical `GET`s of one call are sent
//!   once and share their response (a cache for the batch).
//!
//! ```no_run
//! use weir_plugin::http::{self, FetchOptions, Request};
//!
//! let requests: Vec<Request> = ["a", "b"]
//!     .iter()
//!     .map(|key| http::get(&format!("http://lookup:8080/{key}")))
//!     .collect();
//! for result in http::fetch_all(&requests, FetchOptions { timeout_ms: 500, dedupe: true }) {
//!     match result {
//!         Ok(response) if response.status == 200 => { /* use response.body */ }
//!         Ok(response) => { /* another status */ }
//!         Err(err) => weir_plugin::log::warn(&http::reason(&err)),
//!     }
//! }
//! ```
//!
//! Outside wasm (a plugin's own tests) there is no host: a test answers
//! requests with [`respond_with`].

pub use crate::bindings::transform::weir::plugin::http_batch::{
    FetchError, FetchOptions, Request, Response,
};

/// Sends every request at once; one result per request, in order.
pub fn fetch_all(requests: &[Request], options: FetchOptions) -> Vec<Result<Response, FetchError>> {
    imp::fetch_all(requests, options)
}

/// A `GET` of `url` with no headers.
pub fn get(url: &str) -> Request {
    Request {
        method: "GET".to_string(),
        url: url.to_string(),
        headers: Vec::new(),
        body: Vec::new(),
    }
}

/// A `POST` of `body` to `url`, with its `content-type`.
pub fn post(url: &str, content_type: &str, body: Vec<u8>) -> Request {
    Request {
        method: "POST".to_string(),
        url: url.to_string(),
        headers: vec![("content-type".to_string(), content_type.to_string())],
        body,
    }
}

/// A failed request as a row's reason: `refused: …`, `timed out`, `failed: …`.
pub fn reason(err: &FetchError) -> String {
    match err {
        FetchError::Refused(why) => format!("refused: {why}"),
        FetchError::Timeout => "timed out".to_string(),
        FetchError::Failed(why) => format!("failed: {why}"),
    }
}

/// The first value of header `name` (compared case-insensitively).
pub fn header<'a>(response: &'a Response, name: &str) -> Option<&'a str> {
    response
        .headers
        .iter()
        .find(|(found, _)| found.eq_ignore_ascii_case(name))
        .map(|(_, value)| value.as_str())
}

#[cfg(target_family = "wasm")]
mod imp {
    use super::{FetchError, FetchOptions, Request, Response};
    use crate::bindings::transform::weir::plugin::http_batch as raw;

    pub fn fetch_all(
        requests: &[Request],
        options: FetchOptions,
    ) -> Vec<Result<Response, FetchError>> {
        raw::fetch_all(requests, options)
    }
}

#[cfg(not(target_family = "wasm"))]
pub use imp::respond_with;

/// No host: a native test's responder answers, or every request is refused.
#[cfg(not(target_family = "wasm"))]
mod imp {
    use std::cell::RefCell;

    use super::{FetchError, FetchOptions, Request, Response};

    type Responder = Box<dyn Fn(&Request) -> Result<Response, FetchError>>;

    thread_local! {
        static RESPONDER: RefCell<Option<Responder>> = const { RefCell::new(None) };
    }

    /// Answers this thread's requests with `respond` (native tests only).
    pub fn respond_with(respond: impl Fn(&Request) -> Result<Response, FetchError> + 'static) {
        RESPONDER.with(|responder| *responder.borrow_mut() = Some(Box::new(respond)));
    }

    pub fn fetch_all(requests: &[Request], _: FetchOptions) -> Vec<Result<Response, FetchError>> {
        RESPONDER.with(|responder| {
            let responder = responder.borrow();
            requests
                .iter()
                .map(|request| match responder.as_ref() {
                    Some(respond) => respond(request),
                    None => Err(FetchError::Refused(
                        "no host outside wasm: answer with weir_plugin::http::respond_with".into(),
                    )),
                })
                .collect()
        })
    }
}
