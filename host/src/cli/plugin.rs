//! `weir plugin`: roll a plugin out to the fleet, or back.

use std::path::PathBuf;

use anyhow::Context as _;
use weir::reload::releases;

use super::target::{FleetTarget, router_of};

#[derive(clap::Subcommand)]
pub enum PluginCommand {
    /// Store a `.wasm` as plugin NAME's release: every host fetches it,
    /// checks its digest and swaps it in between batches.
    Push {
        #[command(flatten)]
        fleet: FleetTarget,
        /// The plugin's name in the config.
        name: String,
        /// The component to roll out.
        file: PathBuf,
    },
    /// Go back to plugin NAME's release before the current one.
    Rollback {
        #[command(flatten)]
        fleet: FleetTarget,
        /// The plugin's name in the config.
        name: String,
    },
}

impl PluginCommand {
    pub async fn run(self) -> anyhow::Result<()> {
        let (name, release) = match &self {
            PluginCommand::Push { fleet, name, file } => {
                let bytes = std::fs::read(file)
                    .with_context(|| format!("cannot read {}", file.display()))?;
                let (config, client) = fleet.connect().await?;
                anyhow::ensure!(
                    config.plugins.contains_key(name),
                    "{}: no plugin `{name}` in the config",
                    fleet.config.display()
                );
                let release = releases::push(&client, &router_of(&config), name, &bytes).await?;
                client.flush().await?;
                (name, release)
            }
            PluginCommand::Rollback { fleet, name } => {
                let (config, client) = fleet.connect().await?;
                let release = releases::rollback(&client, &router_of(&config), name).await?;
                client.flush().await?;
                (name, release)
            }
        };
        match &release.digest {
            Some(digest) => println!("plugin {name}: the fleet now runs {digest}"),
            None => println!("plugin {name}: the fleet now runs each host's own file"),
        }
        Ok(())
    }
}
