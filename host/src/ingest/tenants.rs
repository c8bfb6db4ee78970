//! Per-tenant settings for the budget policy: `tenants.<tenant>` in the
//! coordination bucket, a JSON object checked against the keys the budget
//! policy's settings in the config declare. `weir tenant` writes and reads
//! them here; every host's ledger follows them through its coordination
//! watch (`usage.rs`).

use std::collections::BTreeMap;

use async_nats::Client;
use bytes::Bytes;
use futures::StreamExt;

use crate::config::Config;
use crate::nats::kv::{KvError, KvWatch, KvWrite, NatsKv, WatchEvent, WatchStart};
use crate::topology::route::{Names, decode_token, encode_token};

/// Key prefix of per-tenant settings (`tenants.<tenant>`, a JSON object).
pub const TENANTS: &str = "tenants.";

/// `tenants.<tenant>`: the name encoded as a subject token, with `=` for
/// its escape character (a KV key cannot hold `~`).
pub fn tenant_key(tenant: &str) -> String {
    format!("{TENANTS}{}", encode_token(tenant).replace('~', "="))
}

/// The tenant a `tenants.` key (without the prefix) names.
pub(super) fn tenant_of_key(encoded: &str) -> Option<String> {
    decode_token(&encoded.replace('=', "~")).map(|name| name.into_owned())
}

/// Why tenant settings could not be written or read.
#[derive(Debug, thiserror::Error)]
pub enum TenantSettingsError {
    #[error("tenant settings must be a JSON object, e.g. '{{\"queued_bytes\": 1000000}}': {0}")]
    NotAnObject(String),
    #[error(
        "{config}: no budget policy reads tenant settings (set `[policies] budget` to a budget plugin first)"
    )]
    NoBudgetPolicy { config: String },
    #[error(
        "refused: {unknown} not declared by the budget policy `{policy}`; fix the key, declare it in [plugins.{policy}.settings], or pass --force"
    )]
    UnknownKeys { policy: String, unknown: String },
    #[error("cannot reach tenant settings in the coordination bucket: {0}")]
    Kv(#[from] KvError),
}

/// A settings key the budget policy does not declare.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownKey {
    pub key: String,
    /// The declared key it most likely misspells.
    pub suggestion: Option<String>,
}

/// Tenant settings checked against the config's budget policy.
#[derive(Debug, Clone)]
pub struct CheckedSettings {
    /// The budget plugin that reads them.
    pub policy: String,
    /// The keys its settings in the config declare, sorted.
    pub known: Vec<String>,
    pub unknown: Vec<UnknownKey>,
}

impl CheckedSettings {
    /// One line per unknown key, naming the known ones.
    pub fn warnings(&self) -> Vec<String> {
        let known = if self.known.is_empty() {
            "it declares none".to_string()
        } else {
            format!("it declares {}", quoted(&self.known))
        };
        self.unknown
            .iter()
            .map(|unknown| {
                let hint = unknown
                    .suggestion
                    .as_ref()
                    .map(|s| format!(" (did you mean `{s}`?)"))
                    .unwrap_or_default();
                format!(
                    "key `{}` is not one the budget policy `{}` declares{hint}; {known}",
                    unknown.key, self.policy
                )
            })
            .collect()
    }

    /// The refusal of these settings, if any key is unknown.
    pub fn refusal(&self) -> Option<TenantSettingsError> {
        if self.unknown.is_empty() {
            return None;
        }
        let keys: Vec<String> = self.unknown.iter().map(|u| u.key.clone()).collect();
        let noun = if keys.len() == 1 { "key" } else { "keys" };
        Some(TenantSettingsError::UnknownKeys {
            policy: self.policy.clone(),
            unknown: format!("{noun} {}", quoted(&keys)),
        })
    }
}

fn quoted(keys: &[String]) -> String {
    keys.iter()
        .map(|k| format!("`{k}`"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Checks tenant settings before they are written: a JSON object, a budget
/// policy in `config` to read it, and keys that policy declares. A
/// plugin's declared keys are those of its own settings in the config
/// (and of its per-tenant tables under `tenants`, the shape weir's
/// tenant-budget uses): the config is all weir knows of what it reads.
pub fn check_tenant_settings(
    config: &Config,
    text: &str,
) -> Result<CheckedSettings, TenantSettingsError> {
    let value = parse_object(text)?;
    let policy =
        config
            .policies
            .budget
            .clone()
            .ok_or_else(|| TenantSettingsError::NoBudgetPolicy {
                config: config.source.display().to_string(),
            })?;
    let mut known: Vec<String> = Vec::new();
    if let Some(settings) = config
        .plugins
        .get(&policy)
        .and_then(|plugin| plugin.settings.as_object())
    {
        for (key, value) in settings {
            let per_tenant = value
                .as_object()
                .filter(|tenants| key == "tenants" && tenants.values().all(|v| v.is_object()));
            match per_tenant {
                Some(tenants) => known.extend(
                    tenants
                        .values()
                        .flat_map(|t| t.as_object())
                        .flat_map(|t| t.keys().cloned()),
                ),
                None => known.push(key.clone()),
            }
        }
    }
    known.sort();
    known.dedup();
    let unknown = value
        .keys()
        .filter(|key| !known.contains(key))
        .map(|key| UnknownKey {
            key: key.clone(),
            suggestion: closest(key, &known),
        })
        .collect();
    Ok(CheckedSettings {
        policy,
        known,
        unknown,
    })
}

fn parse_object(
    text: &str,
) -> Result<serde_json::Map<String, serde_json::Value>, TenantSettingsError> {
    match serde_json::from_str::<serde_json::Value>(text) {
        Ok(serde_json::Value::Object(map)) => Ok(map),
        Ok(other) => Err(TenantSettingsError::NotAnObject(format!("got {other}"))),
        Err(err) => Err(TenantSettingsError::NotAnObject(err.to_string())),
    }
}

/// The known key within a few edits of `key` (a third of its length).
fn closest(key: &str, known: &[String]) -> Option<String> {
    let limit = (key.chars().count() / 3).max(1);
    known
        .iter()
        .map(|candidate| (edit_distance(key, candidate), candidate))
        .filter(|(distance, _)| *distance <= limit)
        .min_by_key(|(distance, _)| *distance)
        .map(|(_, candidate)| candidate.clone())
}

/// Levenshtein distance, by characters.
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let above = row[j + 1];
            row[j + 1] = (above + 1)
                .min(row[j] + 1)
                .min(diagonal + usize::from(ca != *cb));
            diagonal = above;
        }
    }
    row[b.len()]
}

/// Writes (or with `None`, deletes) a tenant's settings in the coordination
/// bucket; every host's budget sees them within its watch's latency.
pub async fn set_tenant_settings(
    client: &Client,
    router: &Names,
    tenant: &str,
    settings: Option<&str>,
) -> Result<(), TenantSettingsError> {
    let kv = NatsKv::open(client, &router.coordination_bucket()).await?;
    let key = tenant_key(tenant);
    match settings {
        Some(text) => {
            let value = parse_object(text)?;
            let value = serde_json::Value::Object(value);
            kv.put(&key, Bytes::from(value.to_string())).await?;
        }
        None => {
            kv.delete(&key).await?;
        }
    }
    Ok(())
}

/// A tenant's settings in the coordination bucket, if any are set.
pub async fn tenant_settings(
    client: &Client,
    router: &Names,
    tenant: &str,
) -> Result<Option<String>, TenantSettingsError> {
    let kv = NatsKv::open(client, &router.coordination_bucket()).await?;
    let entry = kv.entry(&tenant_key(tenant)).await?;
    Ok(entry
        .filter(|entry| entry.operation.is_put())
        .map(|entry| String::from_utf8_lossy(&entry.value).into_owned()))
}

/// Every tenant's settings in the coordination bucket, by tenant (one
/// watch of `tenants.` up to the present, not a read per tenant).
pub async fn all_tenant_settings(
    client: &Client,
    router: &Names,
) -> Result<BTreeMap<String, String>, TenantSettingsError> {
    let kv = NatsKv::open(client, &router.coordination_bucket()).await?;
    let mut watch = kv
        .watch_prefixes(&[TENANTS], WatchStart::CurrentValues)
        .await?;
    let mut settings = BTreeMap::new();
    let result = loop {
        match watch.next().await {
            Some(Ok(WatchEvent::CaughtUp)) => break Ok(settings),
            Some(Ok(WatchEvent::Update(entry))) => {
                let Some(tenant) = entry.key.strip_prefix(TENANTS).and_then(tenant_of_key) else {
                    continue;
                };
                if entry.operation.is_put() {
                    settings.insert(tenant, String::from_utf8_lossy(&entry.value).into_owned());
                } else {
                    settings.remove(&tenant);
                }
            }
            Some(Err(err)) => break Err(err.into()),
            None => {
                break Err(TenantSettingsError::Kv(KvError::Unavailable {
                    bucket: kv.bucket().to_string(),
                    reason: "the watch of tenant settings ended".into(),
                }));
            }
        }
    };
    watch.close().await;
    result
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use crate::config::Overrides;

    use super::*;

    #[test]
    fn any_tenant_name_makes_a_kv_key_and_back() {
        for name in ["acme", "with space", "dots.and~tilde", "ünï"] {
            let key = tenant_key(name);
            assert!(
                key.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"._-=".contains(&b)),
                "{key}"
            );
            let suffix = key.strip_prefix(TENANTS).unwrap();
            assert_eq!(tenant_of_key(suffix).as_deref(), Some(name));
        }
    }

    fn budget_config(settings: &str) -> Config {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("plugins")).unwrap();
        std::fs::write(dir.path().join("plugins").join("b.wasm"), b"").unwrap();
        let text = format!(
            "[policies]\nbudget = \"b\"\n[plugins.b]\nwasm = \"b.wasm\"\nworld = \"budget\"\nsettings = {{ {settings} }}\n"
        );
        Config::parse(&dir.path().join("weir.toml"), &text, &Overrides::default()).unwrap()
    }

    #[test]
    fn tenant_settings_keys_are_checked_against_the_budgets_own_settings() {
        let config = budget_config("queued_bytes = 5, tenants.acme = { queued_rows = 3 }");
        let checked =
            check_tenant_settings(&config, r#"{"qeued_bytes": 5, "queued_rows": 1}"#).unwrap();
        assert_eq!(checked.known, ["queued_bytes", "queued_rows"]);
        assert_eq!(
            checked.unknown,
            [UnknownKey {
                key: "qeued_bytes".into(),
                suggestion: Some("queued_bytes".into())
            }]
        );
        let warning = &checked.warnings()[0];
        assert!(
            warning.contains("did you mean `queued_bytes`?"),
            "{warning}"
        );
        assert!(checked.refusal().is_some());
        let fine = check_tenant_settings(&config, r#"{"queued_bytes": 5}"#).unwrap();
        assert!(fine.refusal().is_none());
        assert!(matches!(
            check_tenant_settings(&config, "[1]"),
            Err(TenantSettingsError::NotAnObject(_))
        ));
        let none = Config::parse(Path::new("w.toml"), "", &Overrides::default()).unwrap();
        assert!(matches!(
            check_tenant_settings(&none, "{}"),
            Err(TenantSettingsError::NoBudgetPolicy { .. })
        ));
    }

    #[test]
    fn a_far_off_key_gets_no_suggestion() {
        let known = ["queued_bytes".to_string(), "suspended".to_string()];
        assert_eq!(closest("color", &known), None);
        assert_eq!(closest("suspend", &known).as_deref(), Some("suspended"));
        assert_eq!(edit_distance("kitten", "sitting"), 3);
    }
}
