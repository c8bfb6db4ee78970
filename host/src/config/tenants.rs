//! `[[tenants]]`: who may send rows, by api key (over HTTP) or by the
//! subject (over the NATS door).

use std::collections::HashSet;

use serde::Deserialize;
use toml::Spanned;

use super::checker::Checker;
use super::keys::{Fallback, Key, Reload};
use super::nats::NatsConfig;
use super::top::MIN_API_KEY_CHARS;

/// `[[tenants]]`: the front door takes them before its next request.
pub(super) const KEYS: &[Key] = &[
    Key::new("tenants", "name", Fallback::Required, Reload::Hot),
    Key::new("tenants", "api_keys", Fallback::Empty, Reload::Hot),
    Key::new("tenants", "api_keys_file", Fallback::Off, Reload::Hot),
];

#[derive(Debug, Clone)]
pub struct Tenant {
    pub name: String,
    pub api_keys: Vec<String>,
}

/// One `[[tenants]]` table as written in the file.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawTenant {
    name: Spanned<String>,
    #[serde(default)]
    api_keys: Vec<Spanned<String>>,
    /// A file of more keys, one per line (`#` comments): secrets kept out
    /// of the TOML, rotated by a reload.
    api_keys_file: Option<Spanned<String>>,
}

impl Checker<'_> {
    /// The tenants; every key they use goes into `seen_keys`. A tenant
    /// without keys sends over the NATS door only, so it needs one that an
    /// outside producer can reach (`nats`: an operator's server, the door on).
    pub(super) fn tenants(
        &self,
        raw: Vec<RawTenant>,
        seen_keys: &mut HashSet<String>,
        nats: &NatsConfig,
    ) -> Vec<Tenant> {
        let mut tenants = Vec::new();
        let mut seen_tenants: HashSet<String> = HashSet::new();
        for tenant in raw {
            self.check_name("tenant", &tenant.name);
            if !seen_tenants.insert(tenant.name.get_ref().clone()) {
                self.report(
                    tenant.name.span().start,
                    format!("tenant `{}` is defined twice", tenant.name.get_ref()),
                );
            }
            let mut keys: Vec<Spanned<String>> = tenant.api_keys;
            keys.extend(self.keys_from_file(tenant.api_keys_file.as_ref()));
            if keys.is_empty() {
                let why_not = if !nats.ingest {
                    Some("and the NATS door is off (`[nats] ingest = false`)")
                } else if nats.url.is_none() {
                    Some(
                        "and the NATS door is on the embedded nats-server, which lets in no one but weir (set `[nats] url`)",
                    )
                } else {
                    None
                };
                if let Some(why_not) = why_not {
                    self.report(
                        tenant.name.span().start,
                        format!(
                            "tenant `{}` has no api_keys {why_not}: it could send no rows",
                            tenant.name.get_ref()
                        ),
                    );
                }
            }
            for key in &keys {
                self.check_key_whitespace("this api key", key);
                if key.get_ref().len() < MIN_API_KEY_CHARS {
                    self.report(key.span().start, "an api key must be at least 8 characters");
                }
                if !seen_keys.insert(key.get_ref().clone()) {
                    self.report(key.span().start, "this api key is used twice");
                }
            }
            tenants.push(Tenant {
                name: tenant.name.into_inner(),
                api_keys: keys.into_iter().map(Spanned::into_inner).collect(),
            });
        }
        tenants
    }
}
