//! `[nats]`: where NATS is, how weir logs in, and how the embedded
//! nats-server runs when no URL is set.

use std::path::PathBuf;

use serde::Deserialize;
use toml::Spanned;

use super::Overrides;
use super::checker::Checker;
use super::keys::{Fallback, Key, Reload, keep};

/// The embedded server's durability when `sync` is not set.
pub const DEFAULT_SYNC: SyncPolicy = SyncPolicy::Always;

/// `[nats]`, all of it a restart's: the connection lives as long as the process.
pub(super) const KEYS: &[Key] = &[
    Key::new(
        "nats",
        "url",
        Fallback::Off,
        Reload::Restart(|n, r| keep(&mut n.nats.url, &r.nats.url)),
    ),
    Key::new(
        "nats",
        "creds",
        Fallback::Off,
        Reload::Restart(|n, r| keep(&mut n.nats.auth.creds, &r.nats.auth.creds)),
    ),
    Key::new(
        "nats",
        "nkey",
        Fallback::Off,
        Reload::Restart(|n, r| keep(&mut n.nats.auth.nkey, &r.nats.auth.nkey)),
    ),
    Key::new(
        "nats",
        "token",
        Fallback::Off,
        Reload::Restart(|n, r| keep(&mut n.nats.auth.token, &r.nats.auth.token)),
    ),
    Key::new(
        "nats",
        "user",
        Fallback::Off,
        Reload::Restart(|n, r| keep(&mut n.nats.auth.user, &r.nats.auth.user)),
    ),
    Key::new(
        "nats",
        "password",
        Fallback::Off,
        Reload::Restart(|n, r| keep(&mut n.nats.auth.password, &r.nats.auth.password)),
    ),
    Key::new(
        "nats",
        "tls_ca",
        Fallback::Off,
        Reload::Restart(|n, r| keep(&mut n.nats.auth.tls_ca, &r.nats.auth.tls_ca)),
    ),
    Key::new(
        "nats",
        "tls_cert",
        Fallback::Off,
        Reload::Restart(|n, r| keep(&mut n.nats.auth.tls_cert, &r.nats.auth.tls_cert)),
    ),
    Key::new(
        "nats",
        "tls_key",
        Fallback::Off,
        Reload::Restart(|n, r| keep(&mut n.nats.auth.tls_key, &r.nats.auth.tls_key)),
    ),
    Key::new(
        "nats",
        "sync",
        Fallback::Text(DEFAULT_SYNC.as_str()),
        Reload::Restart(|n, r| keep(&mut n.nats.embedded.sync, &r.nats.embedded.sync)),
    ),
    Key::new(
        "nats",
        "ingest",
        Fallback::Bool(true),
        Reload::Restart(|n, r| keep(&mut n.nats.ingest, &r.nats.ingest)),
    ),
    Key::new(
        "nats",
        "server_binary",
        Fallback::Derived,
        Reload::Restart(|n, r| keep(&mut n.nats.embedded.binary, &r.nats.embedded.binary)),
    ),
];

/// Where NATS is. `url: None` means weir starts its own nats-server.
#[derive(Debug, Clone, PartialEq)]
pub struct NatsConfig {
    /// A URL or a comma-separated seed list.
    pub url: Option<String>,
    pub auth: NatsAuth,
    pub embedded: EmbeddedConfig,
    /// Serve the NATS door: rows sent as requests to
    /// `<prefix>.ingest.<tenant>.<table>`.
    pub ingest: bool,
}

/// How weir proves who it is to an operator's NATS, as the `nats` CLI
/// takes it: at most one of creds, nkey, token or user/password, plus TLS.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct NatsAuth {
    /// A `.creds` file (user JWT and nkey seed).
    pub creds: Option<PathBuf>,
    /// A file holding an nkey seed.
    pub nkey: Option<PathBuf>,
    pub token: Option<String>,
    pub user: Option<String>,
    pub password: Option<String>,
    /// PEM CA bundle that signs the server's certificate.
    pub tls_ca: Option<PathBuf>,
    /// PEM client certificate and its key, for servers that verify clients.
    pub tls_cert: Option<PathBuf>,
    pub tls_key: Option<PathBuf>,
}

impl NatsAuth {
    /// Each setting of `self`, else the one of `fallback`.
    pub fn or(self, fallback: NatsAuth) -> NatsAuth {
        NatsAuth {
            creds: self.creds.or(fallback.creds),
            nkey: self.nkey.or(fallback.nkey),
            token: self.token.or(fallback.token),
            user: self.user.or(fallback.user),
            password: self.password.or(fallback.password),
            tls_ca: self.tls_ca.or(fallback.tls_ca),
            tls_cert: self.tls_cert.or(fallback.tls_cert),
            tls_key: self.tls_key.or(fallback.tls_key),
        }
    }

    /// Problems no server could fix: two ways to log in, half a pair.
    pub fn problems(&self) -> Vec<String> {
        let mut problems = Vec::new();
        let ways: Vec<&str> = [
            ("creds", self.creds.is_some()),
            ("nkey", self.nkey.is_some()),
            ("token", self.token.is_some()),
            ("user", self.user.is_some()),
        ]
        .into_iter()
        .filter_map(|(name, set)| set.then_some(name))
        .collect();
        if ways.len() > 1 {
            problems.push(format!(
                "[nats] sets {}: use one way to log in",
                ways.join(" and ")
            ));
        }
        if self.password.is_some() && self.user.is_none() {
            problems.push("[nats] password is set without user".to_string());
        }
        if self.tls_cert.is_some() != self.tls_key.is_some() {
            problems
                .push("[nats] a client certificate needs both tls_cert and tls_key".to_string());
        }
        problems
    }

    /// Whether any setting asks for TLS.
    pub fn wants_tls(&self) -> bool {
        self.tls_ca.is_some() || self.tls_cert.is_some()
    }
}

/// How the embedded nats-server runs when no URL is configured.
#[derive(Debug, Clone, PartialEq)]
pub struct EmbeddedConfig {
    /// The nats-server binary; `None` looks at `WEIR_NATS_SERVER`, then PATH.
    pub binary: Option<PathBuf>,
    pub sync: SyncPolicy,
}

/// When the embedded server makes a write durable before acknowledging it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SyncPolicy {
    /// fsync every write before the PubAck: a 2xx survives power loss.
    /// About 30× slower (docs/deployment.md, "Durability: the fsync trade-off").
    Always,
    /// nats-server's default: flush every two minutes. A weir or nats-server
    /// crash loses nothing; an OS crash or power loss can lose acknowledged rows.
    Periodic,
}

impl SyncPolicy {
    /// As the TOML writes it.
    pub const fn as_str(self) -> &'static str {
        match self {
            SyncPolicy::Always => "always",
            SyncPolicy::Periodic => "periodic",
        }
    }
}

/// `[nats]` as written in the file.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawNats {
    url: Option<String>,
    creds: Option<String>,
    nkey: Option<String>,
    token: Option<String>,
    user: Option<String>,
    password: Option<String>,
    tls_ca: Option<String>,
    tls_cert: Option<String>,
    tls_key: Option<String>,
    server_binary: Option<String>,
    sync: Option<SyncPolicy>,
    ingest: Option<bool>,
}

impl Checker<'_> {
    /// `[nats]` with the command line's settings over it; `replicas` is
    /// `[stream] replicas`, which needs a cluster.
    pub(super) fn nats(
        &self,
        raw: RawNats,
        overrides: &Overrides,
        replicas: Option<&Spanned<u32>>,
    ) -> NatsConfig {
        let path = |value: &Option<String>| value.as_deref().map(|p| self.resolve(p));
        let file_auth = NatsAuth {
            creds: path(&raw.creds),
            nkey: path(&raw.nkey),
            token: raw.token.clone(),
            user: raw.user.clone(),
            password: raw.password.clone(),
            tls_ca: path(&raw.tls_ca),
            tls_cert: path(&raw.tls_cert),
            tls_key: path(&raw.tls_key),
        };
        let auth = overrides.nats_auth.clone().or(file_auth);
        for problem in auth.problems() {
            self.report(0, problem);
        }
        let url = overrides.nats_url.clone().or(raw.url);
        if url.is_none() && auth != NatsAuth::default() {
            self.report(
                0,
                "[nats] has a login or TLS setting but no url (or NATS_URL): the embedded server needs neither",
            );
        }
        if url.is_none()
            && let Some(set) = replicas.filter(|r| *r.get_ref() > 1)
        {
            self.report(
                set.span().start,
                "replicas above 1 need a NATS cluster (set [nats] url): the embedded server is one node",
            );
        }
        NatsConfig {
            url,
            auth,
            embedded: EmbeddedConfig {
                binary: raw.server_binary.as_deref().map(|b| self.resolve(b)),
                sync: raw.sync.unwrap_or(DEFAULT_SYNC),
            },
            ingest: raw.ingest.unwrap_or(true),
        }
    }
}
