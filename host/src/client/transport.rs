//! How a chunk's request is made through either door: an HTTP POST to
//! the front door, or a NATS request to the NATS door as the tenant's
//! producer; both give the same [`Answered`] or [`Unanswered`].

use std::time::Duration;

use bytes::Bytes;

use super::*;

/// The headers a request of `weir send` carries, beside its body, and what
/// over NATS they may take of the server's `max_payload`.
pub(super) const HEADER_ROOM: usize = 1024;
/// The NATS door's answer header with its status code (the door's
/// `STATUS_HEADER`).
pub(super) const STATUS_HEADER: &str = "Weir-Status";
/// How often a NATS request waiting for its answer looks at what the
/// server refused (a publish it refused is never answered).
pub(super) const REFUSALS_EVERY: Duration = Duration::from_millis(100);

/// How the chunks' requests are made: one of [`Door`], ready.
pub(super) enum Transport {
    Http {
        client: reqwest::Client,
        endpoint: String,
        api_key: String,
    },
    Nats(NatsDoor),
}

/// One request of a chunk.
pub(super) struct Offer<'a> {
    pub(super) key: &'a str,
    pub(super) first_line: usize,
    pub(super) bad_lines: Option<&'a str>,
    pub(super) body: Bytes,
    /// How long to wait for its answer.
    pub(super) timeout: Duration,
}

/// A door's answer: its status, `Retry-After` and body (the first
/// `MAX_ANSWER_BYTES`).
pub(super) struct Answered {
    pub(super) status: StatusCode,
    pub(super) retry_after: Option<Duration>,
    pub(super) body: Vec<u8>,
}

/// Why a request got no answer from a host.
pub(super) enum Unanswered {
    /// It could not be made (never retried).
    BadUrl(String),
    /// Not taken, nor answered, in time; `connect`: no door was reached
    /// (a refused connection, no host serving the subject).
    NoAnswer { cause: String, connect: bool },
    /// The answer broke off: the rows may be stored.
    Broken(String),
    /// The way in refused it before any host saw it (a NATS message over
    /// the server's `max_payload`, a publish its permissions forbid).
    Refused { status: u16, message: String },
    /// Something answered that is not a weir door.
    BadReply(String),
}

impl Transport {
    /// Where requests go, for errors: the URL or the subject.
    pub(super) fn target(&self) -> &str {
        match self {
            Transport::Http { endpoint, .. } => endpoint,
            Transport::Nats(door) => &door.subject,
        }
    }

    pub(super) async fn offer(&self, offer: Offer<'_>) -> Result<Answered, Unanswered> {
        match self {
            Transport::Http {
                client,
                endpoint,
                api_key,
            } => offer_http(client, endpoint, api_key, offer).await,
            Transport::Nats(door) => offer_nats(door, offer).await,
        }
    }
}

pub(super) async fn offer_http(
    client: &reqwest::Client,
    endpoint: &str,
    api_key: &str,
    offer: Offer<'_>,
) -> Result<Answered, Unanswered> {
    let mut request = client
        .post(endpoint)
        .bearer_auth(api_key)
        .header(reqwest::header::CONTENT_TYPE, "application/x-ndjson")
        .header("idempotency-key", offer.key)
        // The server numbers lines as the input does.
        .header("weir-first-line", offer.first_line.to_string());
    if let Some(mode) = offer.bad_lines {
        request = request.header("weir-bad-lines", mode);
    }
    let response = match request.timeout(offer.timeout).body(offer.body).send().await {
        Ok(response) => response,
        Err(err) if err.is_builder() => return Err(Unanswered::BadUrl(cause_of(&err))),
        Err(err) => {
            return Err(Unanswered::NoAnswer {
                cause: cause_of(&err),
                connect: err.is_connect(),
            });
        }
    };
    let status = response.status();
    let retry_after = response
        .headers()
        .get(reqwest::header::RETRY_AFTER)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.trim().parse::<u64>().ok())
        .map(Duration::from_secs);
    let body = read_answer(response).await.map_err(Unanswered::Broken)?;
    Ok(Answered {
        status,
        retry_after,
        body,
    })
}

pub(super) async fn offer_nats(door: &NatsDoor, offer: Offer<'_>) -> Result<Answered, Unanswered> {
    let mut headers = async_nats::HeaderMap::new();
    headers.insert("Content-Type", "application/x-ndjson");
    headers.insert("Idempotency-Key", offer.key);
    headers.insert("Weir-First-Line", offer.first_line.to_string().as_str());
    if let Some(mode) = offer.bad_lines {
        headers.insert("Weir-Bad-Lines", mode);
    }
    let request = async_nats::Request::new()
        .headers(headers)
        .payload(offer.body)
        .timeout(Some(offer.timeout));
    let refused_before = (door.refused)().len();
    let answer = door.client.send_request(door.subject.clone(), request);
    tokio::pin!(answer);
    // A publish the server refused (permissions) is never answered: say
    // why as soon as the server does.
    let mut watch = tokio::time::interval(REFUSALS_EVERY);
    let answer = loop {
        tokio::select! {
            answer = &mut answer => break answer,
            _ = watch.tick() => {
                let refused = (door.refused)();
                if let Some(said) = refused
                    .iter()
                    .skip(refused_before)
                    .find(|said| said.contains(&door.subject))
                {
                    return Err(Unanswered::Refused {
                        status: 403,
                        message: format!("the NATS server refused the request: {said}; nothing was stored (is this user a producer of the tenant? weir mq permissions --producer)"),
                    });
                }
            }
        }
    };
    let message = match answer {
        Ok(message) => message,
        Err(err) => {
            use async_nats::client::RequestErrorKind;
            return Err(match err.kind() {
                RequestErrorKind::MaxPayloadExceeded => Unanswered::Refused {
                    status: 413,
                    message: format!(
                        "over the NATS server's max_payload ({err}); nothing was stored"
                    ),
                },
                RequestErrorKind::NoResponders => Unanswered::NoAnswer {
                    cause: "no weir host serves the NATS door (no responders)".to_string(),
                    connect: true,
                },
                RequestErrorKind::TimedOut => Unanswered::NoAnswer {
                    cause: "no answer in time".to_string(),
                    connect: false,
                },
                RequestErrorKind::InvalidSubject => Unanswered::BadUrl(err.to_string()),
                RequestErrorKind::Other => Unanswered::NoAnswer {
                    cause: err.to_string(),
                    connect: false,
                },
            });
        }
    };
    let header = |name: &str| {
        message
            .headers
            .as_ref()
            .and_then(|headers| headers.get(name))
            .map(|value| value.as_str().trim().to_string())
    };
    let status = header(STATUS_HEADER)
        .and_then(|code| code.parse::<u16>().ok())
        .and_then(|code| StatusCode::from_u16(code).ok())
        .ok_or_else(|| {
            Unanswered::BadReply(format!(
                "no {STATUS_HEADER} header in the answer: {}",
                snippet(&message.payload)
            ))
        })?;
    let retry_after = header("Retry-After")
        .and_then(|value| value.parse::<u64>().ok())
        .map(Duration::from_secs);
    let body = message.payload[..message.payload.len().min(MAX_ANSWER_BYTES)].to_vec();
    Ok(Answered {
        status,
        retry_after,
        body,
    })
}

/// The first `MAX_ANSWER_BYTES` of an answer's body.
pub(super) async fn read_answer(mut response: reqwest::Response) -> Result<Vec<u8>, String> {
    let mut body = Vec::new();
    while let Some(piece) = response.chunk().await.map_err(|err| cause_of(&err))? {
        let room = MAX_ANSWER_BYTES - body.len();
        body.extend_from_slice(&piece[..piece.len().min(room)]);
        if body.len() == MAX_ANSWER_BYTES {
            break;
        }
    }
    Ok(body)
}

/// An answer that is not what the front door says, shortened for an error.
pub(super) fn snippet(body: &[u8]) -> String {
    let text = String::from_utf8_lossy(body);
    let text = text.trim();
    match text.char_indices().nth(200) {
        Some((end, _)) => format!("{}…", &text[..end]),
        None if text.is_empty() => "an empty body".to_string(),
        None => text.to_string(),
    }
}

/// The innermost cause of a transport error, once: reqwest's own message
/// only repeats the URL, which the error names already.
pub(super) fn cause_of(err: &reqwest::Error) -> String {
    if err.is_timeout() {
        return "no answer in time".to_string();
    }
    let mut cause: &dyn std::error::Error = err;
    let mut io = None;
    while let Some(source) = cause.source() {
        if let Some(found) = source.downcast_ref::<std::io::Error>() {
            io = Some(found);
        }
        cause = source;
    }
    use std::io::ErrorKind;
    match io.map(std::io::Error::kind) {
        Some(ErrorKind::ConnectionRefused) => "connection refused".to_string(),
        Some(ErrorKind::ConnectionReset) => "connection reset".to_string(),
        Some(ErrorKind::ConnectionAborted) => "connection aborted".to_string(),
        Some(ErrorKind::TimedOut) => "connection timed out".to_string(),
        _ => cause.to_string(),
    }
}

/// An HTTP client for weir's commands: HTTPS through the ring rustls the
/// host serves `[tls]` with (not reqwest's own provider), trusting the
/// system's roots and the PEM certificates in `ca` (a private CA).
pub(super) fn http_client(ca: Option<&Path>) -> Result<reqwest::ClientBuilder, SendError> {
    use rustls::pki_types::{CertificateDer, pem::PemObject};
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls_native_certs::load_native_certs().certs {
        // A system certificate rustls cannot read is one fewer root, not an error.
        let _ = roots.add(cert);
    }
    if let Some(path) = ca {
        let bad = |reason: String| SendError::Ca {
            path: path.display().to_string(),
            reason,
        };
        let pem = std::fs::read(path).map_err(|err| bad(err.to_string()))?;
        let mut trusted = 0;
        for cert in CertificateDer::pem_slice_iter(&pem) {
            let cert = cert.map_err(|err| bad(err.to_string()))?;
            roots.add(cert).map_err(|err| bad(err.to_string()))?;
            trusted += 1;
        }
        if trusted == 0 {
            return Err(bad("no PEM certificate in it".to_string()));
        }
    }
    let tls = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|err| SendError::Setup(format!("no TLS: {err}")))?
    .with_root_certificates(roots)
    .with_no_client_auth();
    Ok(reqwest::Client::builder().tls_backend_preconfigured(tls))
}
