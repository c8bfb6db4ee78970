//! The NATS connection a host (or an operator command) uses: a URL or seed
//! list, a login as the `nats` CLI takes it (creds, nkey, token, user,
//! TLS), connect errors by cause, connection events logged, and permission
//! violations kept so a failed boot can name what the server refused.

use std::sync::Arc;
use std::time::Duration;

use super::NatsError;
use crate::config::NatsAuth;

/// How long a first connection is retried while no server answers (the
/// server may still be starting).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long one server of the list may take to answer.
const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(3);
const RETRY_EVERY: Duration = Duration::from_millis(250);
/// The longest wait between reconnect attempts once a connection is lost
/// (async-nats' default grows to 4 s): a host is ready again within about
/// this long of its server coming back.
const MAX_RECONNECT_DELAY: Duration = Duration::from_millis(500);
/// Permission violations remembered for the boot report.
const MAX_REMEMBERED_REFUSALS: usize = 32;

/// A NATS URL (or a comma-separated list) fit to show: passwords and
/// tokens replaced by `***`, user names kept.
pub fn redact(urls: &str) -> String {
    urls.split(',')
        .map(|url| {
            let Some(scheme_end) = url.find("://") else {
                return url.to_string();
            };
            let (scheme, rest) = (&url[..scheme_end], &url[scheme_end + 3..]);
            let authority = &rest[..rest.find('/').unwrap_or(rest.len())];
            let Some(at) = authority.rfind('@') else {
                return url.to_string();
            };
            let host = &rest[at + 1..];
            match authority[..at].split_once(':') {
                Some((user, _password)) => format!("{scheme}://{user}:***@{host}"),
                None => format!("{scheme}://***@{host}"),
            }
        })
        .collect::<Vec<_>>()
        .join(",")
}

/// Why there is no connection, by cause (the URL shown redacted), found
/// before anything else is asked of the server.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    #[error("cannot reach NATS at {url}: {reason}")]
    Unreachable { url: String, reason: String },
    #[error("NATS at {url} refused weir's login: {reason} (check the user, creds, nkey or token)")]
    LoginRefused { url: String, reason: String },
    #[error("TLS with NATS at {url} failed: {reason}")]
    Tls { url: String, reason: String },
    #[error("NATS setting {what}: {reason}")]
    Setting { what: String, reason: String },
}

/// Permission violations the server reported, kept to explain a failed boot.
#[derive(Debug, Clone, Default)]
pub struct Refusals(Arc<std::sync::Mutex<Vec<String>>>);

impl Refusals {
    /// What the server refused so far.
    pub fn list(&self) -> Vec<String> {
        self.0.lock().map(|list| list.clone()).unwrap_or_default()
    }

    fn remember(&self, text: String) {
        if let Ok(mut list) = self.0.lock()
            && list.len() < MAX_REMEMBERED_REFUSALS
        {
            list.push(text);
        }
    }
}

/// Connects to `urls` (one URL or a comma-separated seed list) with `auth`,
/// remembering permission violations in `refusals`. A server that is not
/// up yet is retried for a while; a refused login or a TLS failure is
/// reported at once.
pub async fn connect(
    urls: &str,
    auth: &NatsAuth,
    refusals: &Refusals,
) -> Result<async_nats::Client, ConnectError> {
    connect_with(urls, auth, refusals, None).await
}

/// The same, for a producer of the NATS door: its answers come on
/// `inbox_prefix` (`_INBOX.<prefix>.<tenant>`), the one inbox its
/// permissions let it read.
pub async fn connect_producer(
    urls: &str,
    auth: &NatsAuth,
    refusals: &Refusals,
    inbox_prefix: &str,
) -> Result<async_nats::Client, ConnectError> {
    connect_with(urls, auth, refusals, Some(inbox_prefix)).await
}

async fn connect_with(
    urls: &str,
    auth: &NatsAuth,
    refusals: &Refusals,
    inbox_prefix: Option<&str>,
) -> Result<async_nats::Client, ConnectError> {
    let shown = redact(urls);
    let mut servers = Vec::new();
    for url in urls.split(',').map(str::trim).filter(|url| !url.is_empty()) {
        let address: async_nats::ServerAddr = url.parse().map_err(|err| ConnectError::Setting {
            what: format!("url `{}`", redact(url)),
            reason: format!("{err}"),
        })?;
        servers.push(address);
    }
    if servers.is_empty() {
        return Err(ConnectError::Setting {
            what: "url".to_string(),
            reason: "no server in it".to_string(),
        });
    }
    let mut options = login_options(&servers, auth).await?;
    if let Some(prefix) = inbox_prefix {
        options = options.custom_inbox_prefix(prefix);
    }
    // The client logs the addresses it connects to (at DEBUG): it gets them
    // without credentials, which went into `options` above.
    let servers = servers
        .into_iter()
        .map(without_credentials)
        .collect::<Result<Vec<_>, _>>()?;
    let refusals = refusals.clone();
    let options = options
        .event_callback(move |event| {
            let refusals = refusals.clone();
            async move {
                match event {
                    async_nats::Event::ServerError(async_nats::ServerError::Other(text))
                        if text.contains("Permissions Violation") =>
                    {
                        tracing::error!(refused = %text, "NATS refused an operation to weir's user");
                        refusals.remember(text);
                    }
                    async_nats::Event::Connected => tracing::info!("connected to NATS"),
                    // Only `close` (a planned stop) closes the connection.
                    async_nats::Event::Draining | async_nats::Event::Closed => {
                        tracing::debug!(event = %event, "NATS connection closing")
                    }
                    other => tracing::warn!(event = %other, "NATS connection event"),
                }
            }
        })
        .name("weir")
        .connection_timeout(ATTEMPT_TIMEOUT)
        .reconnect_delay_callback(reconnect_delay);
    let deadline = tokio::time::Instant::now() + CONNECT_TIMEOUT;
    loop {
        // Each attempt tries every server of the list once.
        let error = match options.clone().connect(servers.clone()).await {
            Ok(client) => return Ok(client),
            Err(error) => error,
        };
        let reason = crate::telemetry::each_cause_once(&error);
        match error.kind() {
            async_nats::ConnectErrorKind::AuthorizationViolation
            | async_nats::ConnectErrorKind::Authentication => {
                return Err(ConnectError::LoginRefused { url: shown, reason });
            }
            // A refused handshake comes back as an IO error: known by its text.
            async_nats::ConnectErrorKind::Tls => {
                return Err(ConnectError::Tls { url: shown, reason });
            }
            _ if is_tls_failure(&reason) => {
                return Err(ConnectError::Tls { url: shown, reason });
            }
            _ if tokio::time::Instant::now() >= deadline => {
                return Err(ConnectError::Unreachable {
                    url: shown,
                    reason: format!("{reason} (tried for {CONNECT_TIMEOUT:?})"),
                });
            }
            _ => tokio::time::sleep(RETRY_EVERY).await,
        }
    }
}

/// `address` with no user, password or token in it.
fn without_credentials(
    address: async_nats::ServerAddr,
) -> Result<async_nats::ServerAddr, ConnectError> {
    if address.username().is_none() && address.password().is_none() {
        return Ok(address);
    }
    let mut url = address.into_inner();
    let cleared = url.set_username("").and_then(|()| url.set_password(None));
    let shown = redact(url.as_str());
    cleared
        .map_err(|()| ConnectError::Setting {
            what: format!("url `{shown}`"),
            reason: "cannot take the credentials out of it".to_string(),
        })
        .and_then(|()| {
            async_nats::ServerAddr::from_url(url).map_err(|err| ConnectError::Setting {
                what: format!("url `{shown}`"),
                reason: err.to_string(),
            })
        })
}

/// Doubling from 1 ms per attempt up to `MAX_RECONNECT_DELAY`.
fn reconnect_delay(attempts: usize) -> Duration {
    let exponent = u32::try_from(attempts).unwrap_or(u32::MAX).min(16);
    Duration::from_millis(2_u64.pow(exponent) / 2).min(MAX_RECONNECT_DELAY)
}

fn is_tls_failure(reason: &str) -> bool {
    let reason = reason.to_ascii_lowercase();
    ["certificate", "alert", "handshake", "tls"]
        .iter()
        .any(|word| reason.contains(word))
}

/// The login `auth` asks for, else credentials in the first URL that has
/// them (async-nats does not use those on its own); TLS when asked.
async fn login_options(
    servers: &[async_nats::ServerAddr],
    auth: &NatsAuth,
) -> Result<async_nats::ConnectOptions, ConnectError> {
    let unreadable =
        |what: &str, path: &std::path::Path, err: std::io::Error| ConnectError::Setting {
            what: format!("{what} {}", path.display()),
            reason: err.to_string(),
        };
    let in_url = servers
        .iter()
        .find_map(|server| Some((server.username()?, server.password())));
    let mut options = if let Some(creds) = &auth.creds {
        async_nats::ConnectOptions::with_credentials_file(creds)
            .await
            .map_err(|err| unreadable("creds file", creds, err))?
    } else if let Some(nkey) = &auth.nkey {
        let seed =
            std::fs::read_to_string(nkey).map_err(|err| unreadable("nkey file", nkey, err))?;
        async_nats::ConnectOptions::with_nkey(seed.trim().to_string())
    } else if let Some(token) = &auth.token {
        async_nats::ConnectOptions::with_token(token.clone())
    } else if let Some(user) = &auth.user {
        async_nats::ConnectOptions::with_user_and_password(
            user.clone(),
            auth.password.clone().unwrap_or_default(),
        )
    } else {
        match in_url {
            Some((user, Some(password))) => {
                async_nats::ConnectOptions::with_user_and_password(user.into(), password.into())
            }
            Some((token, None)) => async_nats::ConnectOptions::with_token(token.into()),
            None => async_nats::ConnectOptions::new(),
        }
    };
    if let Some(ca) = &auth.tls_ca {
        if !ca.is_file() {
            return Err(unreadable(
                "tls_ca",
                ca,
                std::io::ErrorKind::NotFound.into(),
            ));
        }
        options = options.add_root_certificates(ca.clone());
    }
    if let (Some(cert), Some(key)) = (&auth.tls_cert, &auth.tls_key) {
        for (what, path) in [("tls_cert", cert), ("tls_key", key)] {
            if !path.is_file() {
                return Err(unreadable(what, path, std::io::ErrorKind::NotFound.into()));
            }
        }
        options = options.add_client_certificate(cert.clone(), key.clone());
    }
    if auth.wants_tls() {
        options = options.require_tls(true);
    }
    Ok(options)
}

/// Whether `client`'s connection to NATS is up now. A request sent while it
/// is down waits out its timeout; callers with a fallback skip it instead.
pub fn connected(client: &async_nats::Client) -> bool {
    client.connection_state() == async_nats::connection::State::Connected
}

/// Closes a connection for a planned stop: what was published is flushed,
/// subscriptions end, and the connection is closed before `within` ends, so
/// a server stopped next is not seen as a connection lost.
pub async fn close(client: &async_nats::Client, within: Duration) -> Result<(), NatsError> {
    client.drain().await?;
    // `drain` returns before the connection has closed; a flush fails once
    // it has (nobody takes commands any more).
    let closed = async {
        while client.flush().await.is_ok() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    };
    tokio::time::timeout(within, closed)
        .await
        .map_err(|_| NatsError::NotClosed { within })
}

#[cfg(test)]
mod tests {
    use super::{redact, without_credentials};

    #[test]
    fn addresses_handed_to_the_client_carry_no_credentials() {
        for (url, bare) in [
            (
                "nats://weiru:S3cret@127.0.0.1:4222",
                "nats://127.0.0.1:4222",
            ),
            ("tls://T0ken@nats.example:4443", "tls://nats.example:4443"),
            ("nats://127.0.0.1:4222", "nats://127.0.0.1:4222"),
        ] {
            let address: async_nats::ServerAddr = url.parse().unwrap();
            let stripped = without_credentials(address).unwrap();
            assert_eq!(stripped.into_inner().as_str(), bare);
        }
    }

    #[test]
    fn passwords_and_tokens_never_show() {
        assert_eq!(redact("nats://127.0.0.1:4222"), "nats://127.0.0.1:4222");
        assert_eq!(
            redact("nats://weir:s3cret@nats.example:4222"),
            "nats://weir:***@nats.example:4222"
        );
        assert_eq!(
            redact("tls://tok3n@a:1,nats://u:p@b:2"),
            "tls://***@a:1,nats://u:***@b:2"
        );
        assert_eq!(redact("nats://u:p@ss@h:1"), "nats://u:***@h:1");
    }
}
