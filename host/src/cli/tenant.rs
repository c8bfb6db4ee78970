//! `weir tenant`: the per-tenant settings budget policies read.

use super::target::{FleetTarget, router_of};

#[derive(clap::Subcommand)]
pub enum TenantCommand {
    /// Set a tenant's settings for the budget policy (a JSON object, e.g.
    /// '{"queued_bytes": 1000000}'); every host sees them at once, no reload.
    Set {
        #[command(flatten)]
        fleet: FleetTarget,
        /// The tenant's name in the config.
        tenant: String,
        /// The settings, a JSON object the budget policy reads.
        settings: String,
    },
    /// Remove a tenant's settings: the policy's own settings apply again.
    Unset {
        #[command(flatten)]
        fleet: FleetTarget,
        /// The tenant's name in the config.
        tenant: String,
    },
}

impl TenantCommand {
    pub async fn run(self) -> anyhow::Result<()> {
        let (fleet, tenant, settings) = match &self {
            TenantCommand::Set {
                fleet,
                tenant,
                settings,
            } => (fleet, tenant, Some(settings.as_str())),
            TenantCommand::Unset { fleet, tenant } => (fleet, tenant, None),
        };
        let (config, client) = fleet.connect().await?;
        anyhow::ensure!(
            config.tenants.iter().any(|t| &t.name == tenant),
            "{}: no tenant `{tenant}` in the config",
            fleet.config.display()
        );
        weir::ingest::usage::set_tenant_settings(&client, &router_of(&config), tenant, settings)
            .await?;
        client.flush().await?;
        match settings {
            Some(settings) => println!("tenant {tenant}: settings are now {settings}"),
            None => println!("tenant {tenant}: settings removed"),
        }
        Ok(())
    }
}
