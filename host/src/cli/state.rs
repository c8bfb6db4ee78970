//! `weir state`: the durable state plugins keep (`grants.state`).

use weir::nats::kv::{KvError, NatsKv};
use weir::state::StateStore;

use super::target::{FleetTarget, router_of};

#[derive(clap::Subcommand)]
pub enum StateCommand {
    /// Delete every plugin's state of a tenant, fleet-wide (a tenant
    /// offboarded, or state to start over). Rows a host is running when
    /// their scope goes run again on empty state.
    Purge {
        #[command(flatten)]
        fleet: FleetTarget,
        /// The tenant whose state goes (also one no longer in the config).
        #[arg(long)]
        tenant: String,
    },
}

impl StateCommand {
    pub async fn run(self) -> anyhow::Result<()> {
        match self {
            StateCommand::Purge { fleet, tenant } => {
                let (config, client) = fleet.connect().await?;
                let bucket = router_of(&config).state_bucket();
                let kv = match NatsKv::open(&client, &bucket).await {
                    Ok(kv) => kv,
                    Err(KvError::BucketNotFound { .. }) => {
                        println!("tenant {tenant}: no plugin state (no bucket {bucket})");
                        return Ok(());
                    }
                    Err(err) => return Err(err.into()),
                };
                let purged = StateStore::new(kv).purge_tenant(&tenant).await?;
                println!(
                    "tenant {tenant}: purged {} state scope{} from bucket {bucket}",
                    purged.len(),
                    if purged.len() == 1 { "" } else { "s" }
                );
                for key in purged {
                    println!("  {key}");
                }
            }
        }
        Ok(())
    }
}
