//! `weir tenant`: the per-tenant settings budget policies read.

use weir::config::Config;
use weir::ingest::{
    all_tenant_settings, check_tenant_settings, set_tenant_settings, tenant_settings,
};

use super::target::{FleetTarget, router_of};

/// What `get` and `list` say of a tenant with no settings of its own.
const NONE_SET: &str = "none: the policy's own settings apply";

#[derive(clap::Subcommand)]
pub enum TenantCommand {
    /// Set a tenant's settings for the budget policy (a JSON object, e.g.
    /// '{"queued_bytes": 1000000}'); every host sees them at once, no reload.
    /// Refused without a budget policy, and for keys the policy's settings
    /// in the config do not declare (unless --force).
    Set {
        #[command(flatten)]
        fleet: FleetTarget,
        /// The tenant's name in the config.
        tenant: String,
        /// The settings, a JSON object the budget policy reads.
        settings: String,
        /// Write them even with keys the budget policy does not declare
        /// (each is still warned about).
        #[arg(long)]
        force: bool,
    },
    /// Remove a tenant's settings: the policy's own settings apply again.
    Unset {
        #[command(flatten)]
        fleet: FleetTarget,
        /// The tenant's name in the config.
        tenant: String,
    },
    /// Print a tenant's settings as stored for the fleet.
    Get {
        #[command(flatten)]
        fleet: FleetTarget,
        /// The tenant's name in the config.
        tenant: String,
    },
    /// Print every configured tenant with its settings.
    List {
        #[command(flatten)]
        fleet: FleetTarget,
    },
}

impl TenantCommand {
    pub async fn run(self) -> anyhow::Result<()> {
        match self {
            TenantCommand::Set {
                fleet,
                tenant,
                settings,
                force,
            } => {
                // Checked against the config before connecting: nothing is
                // written that no budget would read.
                let config = Config::load(&fleet.config, &Default::default())?;
                configured(&config, &fleet, &tenant)?;
                let checked = check_tenant_settings(&config, &settings)?;
                for warning in checked.warnings() {
                    eprintln!("weir: warning: tenant {tenant}: {warning}");
                }
                if let Some(refusal) = checked.refusal().filter(|_| !force) {
                    return Err(refusal.into());
                }
                let (config, client) = fleet.connect().await?;
                set_tenant_settings(&client, &router_of(&config), &tenant, Some(&settings)).await?;
                client.flush().await?;
                println!("tenant {tenant}: settings are now {settings}");
            }
            TenantCommand::Unset { fleet, tenant } => {
                let (config, client) = fleet.connect().await?;
                configured(&config, &fleet, &tenant)?;
                set_tenant_settings(&client, &router_of(&config), &tenant, None).await?;
                client.flush().await?;
                println!("tenant {tenant}: settings removed");
            }
            TenantCommand::Get { fleet, tenant } => {
                let (config, client) = fleet.connect().await?;
                configured(&config, &fleet, &tenant)?;
                let settings = tenant_settings(&client, &router_of(&config), &tenant).await?;
                println!("{tenant}: {}", settings.as_deref().unwrap_or(NONE_SET));
            }
            TenantCommand::List { fleet } => {
                let (config, client) = fleet.connect().await?;
                let mut stored = all_tenant_settings(&client, &router_of(&config)).await?;
                let width = config
                    .tenants
                    .iter()
                    .map(|t| t.name.len())
                    .max()
                    .unwrap_or(0);
                for tenant in &config.tenants {
                    let settings = stored.remove(&tenant.name);
                    println!(
                        "{:<width$}  {}",
                        tenant.name,
                        settings.as_deref().unwrap_or(NONE_SET)
                    );
                }
                // Left behind by a tenant since removed from the config.
                for (tenant, settings) in stored {
                    println!("{tenant:<width$}  {settings}  (not in the config)");
                }
            }
        }
        Ok(())
    }
}

fn configured(config: &Config, fleet: &FleetTarget, tenant: &str) -> anyhow::Result<()> {
    anyhow::ensure!(
        config.tenants.iter().any(|t| t.name == tenant),
        "{}: no tenant `{tenant}` in the config",
        fleet.config.display()
    );
    Ok(())
}
