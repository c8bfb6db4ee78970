//! `weir status`: a host's report, optionally waiting until it is drained.

use std::time::{Duration, Instant};

use weir::client::fetch_status;

use super::target::HostTarget;

#[derive(clap::Args)]
pub struct StatusArgs {
    #[command(flatten)]
    host: HostTarget,
    /// Wait (up to this many seconds) until every row is settled.
    #[arg(long)]
    wait_drained: Option<u64>,
    /// Print the whole report as JSON.
    #[arg(long)]
    json: bool,
    /// An admin key (every tenant's usage, where NATS is) or a tenant's
    /// key (its own usage).
    #[arg(long, env = "WEIR_STATUS_KEY")]
    key: Option<String>,
}

impl StatusArgs {
    pub async fn run(self) -> anyhow::Result<()> {
        let url = &self.host.url()?;
        let key = self.key.as_deref();
        let mut report = fetch_status(url, key).await?;
        if let Some(seconds) = self.wait_drained {
            let deadline = Instant::now() + Duration::from_secs(seconds);
            while !report.drained() && Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(200)).await;
                report = fetch_status(url, key).await?;
            }
            anyhow::ensure!(
                report.drained(),
                "not drained after {seconds} s: {}",
                report.summary()
            );
        }
        if self.json {
            println!("{}", serde_json::to_string_pretty(&report)?);
            return Ok(());
        }
        println!("{}", report.summary());
        for member in &report.fleet.members {
            let units = report
                .units
                .iter()
                .filter(|u| u.owner.as_deref() == Some(member.id.as_str()))
                .count();
            println!(
                "  member {} at {} ({} units, up {} s)",
                member.id,
                member.http,
                units,
                member.age_ms / 1000
            );
        }
        if !report.fleet.unowned.is_empty() {
            println!("  unowned: {}", report.fleet.unowned.join(", "));
        }
        for plugin in &report.plugins {
            println!(
                "  plugin {} ({}) version {}",
                plugin.name, plugin.world, plugin.version
            );
        }
        Ok(())
    }
}
