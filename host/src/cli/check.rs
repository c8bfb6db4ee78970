//! `weir check`: everything `weir run` checks before it connects.

use std::path::PathBuf;

use weir::config::{Config, Overrides};

#[derive(clap::Args)]
pub struct CheckArgs {
    /// The TOML config file.
    #[arg(short, long, env = "WEIR_CONFIG")]
    config: PathBuf,
}

impl CheckArgs {
    pub async fn run(self) -> anyhow::Result<()> {
        let config = Config::load(&self.config, &Overrides::default())?;
        // What `weir run` does before it connects: compile, link against
        // the world and `init` each plugin; every failure is reported.
        // With the config's compiled cache: a check warms it for `weir run`.
        let sandbox = weir::sandbox::Sandbox::new(weir::telemetry::Metrics::default())?.with_cache(
            config.compile_cache_dir.clone(),
            config.compile_cache_max_bytes,
        );
        let mut failures = Vec::new();
        for plugin in config.plugins.values() {
            if let Err(err) = sandbox.load(plugin).await {
                failures.push(err.to_string());
            }
        }
        if !failures.is_empty() {
            for failure in &failures {
                eprintln!("{}: {failure}", config.source.display());
            }
            return Err(super::Refused(format!(
                "{} of {} plugins cannot run",
                failures.len(),
                config.plugins.len()
            ))
            .into());
        }
        println!(
            "{}: ok ({} plugins, {} pipelines, {} tenants)",
            config.source.display(),
            config.plugins.len(),
            config.pipelines.len(),
            config.tenants.len()
        );
        Ok(())
    }
}
