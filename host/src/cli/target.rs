//! How an operator command finds the fleet's NATS.

use std::path::PathBuf;

use anyhow::Context as _;
use weir::client::{default_url, fetch_status};
use weir::config::{Config, Overrides};
use weir::host::embedded_url_file;
use weir::topology::route::Router;

/// A running host's HTTP address: `--url`, else the config's `listen`,
/// else weir's default listen address.
#[derive(clap::Args)]
pub struct HostTarget {
    /// The host's URL (e.g. http://127.0.0.1:8080); default: the `listen`
    /// address of --config, else http://127.0.0.1:8080.
    #[arg(short, long, env = "WEIR_URL")]
    pub url: Option<String>,
    /// A config file whose `listen` address names the host.
    #[arg(short, long, env = "WEIR_CONFIG")]
    pub config: Option<PathBuf>,
}

impl HostTarget {
    pub fn url(&self) -> anyhow::Result<String> {
        if let Some(url) = &self.url {
            return Ok(url.clone());
        }
        match &self.config {
            Some(path) => {
                let config = Config::load(path, &Overrides::default())?;
                Ok(format!("http://{}", config.listen))
            }
            None => Ok(default_url()),
        }
    }
}

/// A fleet's NATS: from the flag, the config, or the running host.
#[derive(clap::Args)]
pub struct FleetTarget {
    /// The TOML config file the fleet runs.
    #[arg(long, env = "WEIR_CONFIG")]
    pub config: PathBuf,
    /// NATS URL; default: the config's, else the running host's (asked at
    /// the config's listen address).
    #[arg(long, env = "WEIR_NATS_URL")]
    pub nats_url: Option<String>,
}

impl FleetTarget {
    pub async fn connect(&self) -> anyhow::Result<(Config, async_nats::Client)> {
        let config = Config::load(&self.config, &Overrides::default())?;
        let url = match (&self.nats_url, &config.nats.url) {
            (Some(url), _) | (None, Some(url)) => url.clone(),
            (None, None) if embedded_url_file(&config.data_dir).is_file() => {
                // A host on this machine runs the embedded server: its URL
                // (and password) are in the data dir, readable by us only.
                let path = embedded_url_file(&config.data_dir);
                std::fs::read_to_string(&path)
                    .with_context(|| format!("cannot read {}", path.display()))?
                    .trim()
                    .to_string()
            }
            (None, None) => {
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
        let client = weir::nats::connection::connect(&url, &Default::default()).await?;
        Ok((config, client))
    }
}

pub fn router_of(config: &Config) -> Router {
    Router::new(
        &config.stream.prefix,
        config.stream.partitions,
        config.stream.shards,
    )
}
