//! The NATS connection a host (or an operator command) uses: credentials
//! taken from the URL, connection events logged, and permission violations
//! kept so a failed boot can name what the server refused.

use std::sync::Arc;
use std::time::Duration;

/// How long the first connection to NATS may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
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

/// Why there is no connection (the URL shown redacted).
#[derive(Debug, thiserror::Error)]
#[error("cannot connect to NATS at {url}: {reason}")]
pub struct ConnectError {
    pub url: String,
    pub reason: String,
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

/// Connects to `url`, remembering permission violations in `refusals`.
pub async fn connect(url: &str, refusals: &Refusals) -> Result<async_nats::Client, ConnectError> {
    let error = |reason: String| ConnectError {
        url: redact(url),
        reason,
    };
    // Credentials in the URL (`nats://user:password@host`) are not used by
    // async-nats on their own: pass them explicitly.
    let address: async_nats::ServerAddr = url.parse().map_err(|err| error(format!("{err}")))?;
    let options = match (address.username(), address.password()) {
        (Some(user), Some(password)) => {
            async_nats::ConnectOptions::with_user_and_password(user.into(), password.into())
        }
        _ => async_nats::ConnectOptions::new(),
    };
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
        .connection_timeout(CONNECT_TIMEOUT)
        .retry_on_initial_connect();
    tokio::time::timeout(CONNECT_TIMEOUT, options.connect(url))
        .await
        .map_err(|_| error(format!("no answer within {CONNECT_TIMEOUT:?}")))?
        .map_err(|err| error(err.to_string()))
}

/// Closes a connection for a planned stop: what was published is flushed,
/// subscriptions end, and the connection is closed before `within` ends, so
/// a server stopped next is not seen as a connection lost.
pub async fn close(client: &async_nats::Client, within: Duration) -> Result<(), String> {
    client.drain().await.map_err(|err| err.to_string())?;
    // `drain` returns before the connection has closed; a flush fails once
    // it has (nobody takes commands any more).
    let closed = async {
        while client.flush().await.is_ok() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    };
    tokio::time::timeout(within, closed)
        .await
        .map_err(|_| format!("not closed within {within:?}"))
}

#[cfg(test)]
mod tests {
    use super::redact;

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
