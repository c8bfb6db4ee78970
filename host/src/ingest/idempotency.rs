//! One body per `Idempotency-Key`: the first request with a key records
//! its body's digest fleet-wide (a coordination-bucket key that expires
//! with the stream's duplicate window); a retry with the same body goes
//! through (JetStream drops what it already stored), a different body
//! under the same key is refused rather than silently dropped. Once every
//! row of the body is stored the record says so, and a retry then (the
//! answer was lost) is answered from it without a publish.

use std::time::Duration;

use bytes::Bytes;
use sha2::{Digest, Sha256};

use crate::nats::kv::{KvError, KvWrite, NatsKv};

/// Prefix of the keys in the coordination bucket.
const PREFIX: &str = "idem.";
/// Before the digest in a record whose rows are all stored.
const STORED: &str = "stored:";

/// Why a request's key could not be claimed.
#[derive(Debug, thiserror::Error)]
pub enum ClaimError {
    #[error(
        "Idempotency-Key `{key}` was used within the last {window:?} for a different body; use a new key for new rows"
    )]
    Reused { key: String, window: Duration },
    #[error("cannot check the Idempotency-Key: {0}")]
    Unavailable(#[from] KvError),
}

/// What a claim found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Claim {
    /// The key is new: no row with its ids was stored in the window.
    First,
    /// The key is bound to this body already (a retry), or its record
    /// expired meanwhile: some of its rows may be stored.
    Again,
    /// Every row of this body under this key is stored: nothing to publish.
    Stored,
}

/// The fleet's record of request keys.
#[derive(Clone)]
pub struct RequestKeys {
    kv: NatsKv,
    /// How long a key stays bound to its body: the stream's duplicate window.
    window: Duration,
}

impl RequestKeys {
    pub fn new(kv: NatsKv, window: Duration) -> RequestKeys {
        RequestKeys { kv, window }
    }

    /// Binds `key` (of `tenant` and `table`) to `body`, or checks that it is
    /// bound to the same body already.
    pub async fn claim(
        &self,
        tenant: &str,
        table: &str,
        key: &str,
        body: &[u8],
    ) -> Result<Claim, ClaimError> {
        let name = record_name(tenant, table, key);
        let digest = Bytes::from(hex(&Sha256::digest(body)));
        match self
            .kv
            .create_with_ttl(
                &name,
                digest.clone(),
                self.window.max(Duration::from_secs(1)),
            )
            .await
        {
            Ok(_) => Ok(Claim::First),
            Err(KvError::AlreadyExists { .. }) => match self.kv.entry(&name).await? {
                Some(entry) if entry.value.is_empty() => Ok(Claim::Again),
                Some(entry) => {
                    let (stored, recorded) = match entry.value.strip_prefix(STORED.as_bytes()) {
                        Some(digest) => (true, digest),
                        None => (false, &entry.value[..]),
                    };
                    if recorded != digest {
                        Err(ClaimError::Reused {
                            key: key.to_string(),
                            window: self.window,
                        })
                    } else if stored {
                        Ok(Claim::Stored)
                    } else {
                        Ok(Claim::Again)
                    }
                }
                // The record expired meanwhile.
                None => Ok(Claim::Again),
            },
            Err(err) => Err(err.into()),
        }
    }
}

impl RequestKeys {
    /// Records that every row of `body` under `key` is stored. Best effort:
    /// without the record a retry publishes again, and stores nothing twice.
    pub async fn stored(&self, tenant: &str, table: &str, key: &str, body: &[u8]) {
        let name = record_name(tenant, table, key);
        let value = Bytes::from(format!("{STORED}{}", hex(&Sha256::digest(body))));
        if let Err(err) = self
            .kv
            .put_with_ttl(&name, value, self.window.max(Duration::from_secs(1)))
            .await
        {
            tracing::debug!(error = %err, "cannot record a request's rows as stored");
        }
    }
}

fn record_name(tenant: &str, table: &str, key: &str) -> String {
    format!("{PREFIX}{}", hex(&scope_digest(tenant, table, key)))
}

/// Tenant, table and key, unambiguously: each is length-prefixed.
fn scope_digest(tenant: &str, table: &str, key: &str) -> [u8; 32] {
    let mut hasher = Sha256::new();
    for part in [tenant, table, key] {
        hasher.update((part.len() as u64).to_le_bytes());
        hasher.update(part.as_bytes());
    }
    hasher.finalize().into()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scopes_do_not_run_into_each_other() {
        assert_ne!(scope_digest("ab", "c", "k"), scope_digest("a", "bc", "k"));
        assert_eq!(hex(&[0, 255, 16]), "00ff10");
    }
}
