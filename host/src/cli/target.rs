//! How an operator command finds the fleet's NATS.

use std::path::PathBuf;

use anyhow::Context as _;
use weir::client::{default_url, fetch_status};
use weir::config::{Config, NatsAuth, Overrides};
use weir::host::embedded_url_file;
use weir::topology::Names;

/// A running host's HTTP address: `--url`, else the config's `listen`,
/// else weir's default listen address.
#[derive(clap::Args)]
pub struct HostTarget {
    /// The host's URL (e.g. http://127.0.0.1:8080); default: the `listen`
    /// address of --config, else http://127.0.0.1:8080.
    #[arg(short, long, env = "WEIR_URL")]
    pub url: Option<String>,
    /// A config file whose `listen` address names the host (https:// when
    /// it has `[tls]`).
    #[arg(short, long, env = "WEIR_CONFIG")]
    pub config: Option<PathBuf>,
    /// A PEM file of CA certificates to trust, besides the system's, for
    /// an https:// host (a private CA that signed its `[tls]` cert).
    #[arg(long, env = "WEIR_CA", value_name = "FILE")]
    pub ca: Option<PathBuf>,
}

impl HostTarget {
    pub fn url(&self) -> anyhow::Result<String> {
        if let Some(url) = &self.url {
            return Ok(url.clone());
        }
        match &self.config {
            Some(path) => {
                let config = Config::load(path, &Overrides::default())?;
                let scheme = if config.tls.is_some() {
                    "https"
                } else {
                    "http"
                };
                Ok(format!("{scheme}://{}", config.listen))
            }
            None => Ok(default_url()),
        }
    }
}

/// A fleet's NATS: from the flag, the config, or the running host.
#[derive(clap::Args)]
pub struct FleetTarget {
    /// The TOML config file the fleet runs.
    #[arg(short, long, env = "WEIR_CONFIG")]
    pub config: PathBuf,
    /// Where NATS is and how to log in; default: the config's `[nats]`,
    /// else the embedded server of a host on this machine, else the running
    /// host's (asked at the config's listen address).
    #[command(flatten)]
    pub nats: NatsArgs,
}

impl FleetTarget {
    pub async fn connect(&self) -> anyhow::Result<(Config, async_nats::Client)> {
        let config = Config::load(&self.config, &self.nats.overrides())?;
        let url = match &config.nats.url {
            Some(url) => url.clone(),
            None if embedded_url_file(&config.data_dir).is_file() => {
                // A host on this machine runs the embedded server: its URL
                // (and password) are in the data dir, readable by us only.
                let path = embedded_url_file(&config.data_dir);
                std::fs::read_to_string(&path)
                    .with_context(|| format!("cannot read {}", path.display()))?
                    .trim()
                    .to_string()
            }
            None => {
                let host = format!("http://{}", config.listen);
                let admin_key = config.admin_api_keys.first().map(String::as_str);
                let url = fetch_status(&host, admin_key)
                    .await
                    .context("no NATS URL given and no running weir host to ask")?
                    .nats
                    .url;
                anyhow::ensure!(
                    !url.is_empty(),
                    "the running host tells where NATS is only to an admin key: set `admin_api_keys` in {} or pass --nats-url",
                    self.config.display()
                );
                url
            }
        };
        let client = weir::nats::connect(&url, &config.nats.auth, &Default::default()).await?;
        Ok((config, client))
    }
}

pub fn router_of(config: &Config) -> Names {
    Names::new(
        &config.stream.prefix,
        config.stream.partitions,
        config.stream.shards,
    )
}

/// How to reach and log in to NATS, as the `nats` CLI takes it; each flag
/// wins over its environment variable, which wins over `[nats]` in the file.
#[derive(clap::Args, Clone, Default)]
pub struct NatsArgs {
    /// NATS server URL or comma-separated seed list (also NATS_URL);
    /// absent everywhere: `weir run` starts its own nats-server.
    #[arg(long, short = 's', visible_alias = "server", env = "WEIR_NATS_URL")]
    pub nats_url: Option<String>,
    #[command(flatten)]
    pub login: NatsLogin,
}

/// How to log in to NATS, as the `nats` CLI takes it.
#[derive(clap::Args, Clone, Default)]
pub struct NatsLogin {
    /// A .creds file (user JWT and nkey seed) to log in with.
    #[arg(long, env = "NATS_CREDS", value_name = "FILE")]
    pub nats_creds: Option<PathBuf>,
    /// A file holding an nkey seed to log in with.
    #[arg(long, env = "NATS_NKEY", value_name = "FILE")]
    pub nats_nkey: Option<PathBuf>,
    /// A token to log in with.
    #[arg(long, env = "NATS_TOKEN", hide_env_values = true)]
    pub nats_token: Option<String>,
    /// A user name to log in with (with --nats-password).
    #[arg(long, env = "NATS_USER")]
    pub nats_user: Option<String>,
    /// The password of --nats-user.
    #[arg(long, env = "NATS_PASSWORD", hide_env_values = true)]
    pub nats_password: Option<String>,
    /// PEM CA bundle that signs the server's certificate (turns TLS on).
    #[arg(long, env = "NATS_CA", value_name = "FILE")]
    pub tls_ca: Option<PathBuf>,
    /// PEM client certificate, for servers that verify clients (with --tls-key).
    #[arg(long, env = "NATS_CERT", value_name = "FILE")]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key of --tls-cert.
    #[arg(long, env = "NATS_KEY", value_name = "FILE")]
    pub tls_key: Option<PathBuf>,
}

impl NatsArgs {
    /// The URL from the flag, WEIR_NATS_URL or NATS_URL.
    pub fn url(&self) -> Option<String> {
        self.nats_url
            .clone()
            .or_else(|| std::env::var("NATS_URL").ok().filter(|url| !url.is_empty()))
    }

    pub fn auth(&self) -> NatsAuth {
        self.login.auth()
    }

    /// Overrides carrying these settings (for `Config::load`).
    pub fn overrides(&self) -> Overrides {
        Overrides {
            nats_url: self.url(),
            nats_auth: self.auth(),
            ..Overrides::default()
        }
    }
}

impl NatsLogin {
    pub fn auth(&self) -> NatsAuth {
        NatsAuth {
            creds: self.nats_creds.clone(),
            nkey: self.nats_nkey.clone(),
            token: self.nats_token.clone(),
            user: self.nats_user.clone(),
            password: self.nats_password.clone(),
            tls_ca: self.tls_ca.clone(),
            tls_cert: self.tls_cert.clone(),
            tls_key: self.tls_key.clone(),
        }
    }
}
