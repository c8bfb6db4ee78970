//! `weir mq`: what an operator applies to NATS for a config.

use std::path::PathBuf;

use weir::config::{Config, Overrides};
use weir::topology::manifest::Manifest;
use weir::topology::permissions::Permissions;

use super::target::router_of;

#[derive(clap::Subcommand)]
pub enum MqCommand {
    /// Print the streams and consumers (JSON) the config needs.
    Manifests {
        /// The TOML config file.
        #[arg(long, env = "WEIR_CONFIG")]
        config: PathBuf,
        /// `nats`: the JetStream API's JSON (for the nats CLI and clients);
        /// `nack`: Kubernetes resources for the NATS controllers.
        #[arg(long, value_enum, default_value_t = ManifestFormat::Nats)]
        format: ManifestFormat,
        /// Split this many bytes of file store between the streams
        /// (e.g. 500G), instead of each partition's `max_bytes`.
        #[arg(long, value_parser = parse_bytes)]
        file_store: Option<i64>,
    },
    /// Print the least-privilege NATS user permissions a host needs.
    Permissions {
        /// The TOML config file.
        #[arg(long, env = "WEIR_CONFIG")]
        config: PathBuf,
    },
}

#[derive(Clone, Copy, clap::ValueEnum)]
pub enum ManifestFormat {
    Nats,
    Nack,
}

impl MqCommand {
    pub async fn run(self) -> anyhow::Result<()> {
        let output = match self {
            MqCommand::Manifests {
                config,
                format,
                file_store,
            } => {
                let config = Config::load(&config, &Overrides::default())?;
                let manifest = manifest_of(&config, file_store);
                match format {
                    ManifestFormat::Nats => serde_json::to_value(&manifest)?,
                    ManifestFormat::Nack => manifest.to_nack(),
                }
            }
            MqCommand::Permissions { config } => {
                let config = Config::load(&config, &Overrides::default())?;
                let manifest = manifest_of(&config, None);
                serde_json::to_value(Permissions::for_host(&router_of(&config), &manifest))?
            }
        };
        println!("{}", serde_json::to_string_pretty(&output)?);
        Ok(())
    }
}

fn manifest_of(config: &Config, file_store: Option<i64>) -> Manifest {
    Manifest::new(
        &router_of(config),
        &config.stream,
        &config.delivery,
        file_store,
    )
}

/// Bytes with an optional binary suffix: 1024, 64K, 500M, 2G, 1T.
fn parse_bytes(text: &str) -> Result<i64, String> {
    let text = text.trim();
    let (digits, shift) = match text.char_indices().last() {
        Some((at, unit)) if unit.is_ascii_alphabetic() => {
            let shift = match unit.to_ascii_uppercase() {
                'K' => 10,
                'M' => 20,
                'G' => 30,
                'T' => 40,
                other => return Err(format!("unknown unit `{other}`: use K, M, G or T")),
            };
            (&text[..at], shift)
        }
        _ => (text, 0),
    };
    let value: i64 = digits
        .parse()
        .map_err(|_| format!("`{text}` is not a size"))?;
    value
        .checked_shl(shift)
        .filter(|bytes| *bytes > 0)
        .ok_or_else(|| format!("`{text}` is out of range"))
}
