//! `weir check`: everything `weir run` checks before it connects.

use std::path::PathBuf;

use weir::config::{Config, Overrides, PluginConfig, Problem};
use weir::sandbox::LoadError;

#[derive(clap::Args)]
pub struct CheckArgs {
    /// The TOML config file.
    #[arg(short, long, env = "WEIR_CONFIG")]
    config: PathBuf,
}

impl CheckArgs {
    pub async fn run(self) -> anyhow::Result<()> {
        let config = Config::load(&self.config, &Overrides::default())?;
        refuse_failing_plugins(&config).await?;
        refuse_unreachable_stores(&config).await?;
        use weir::telemetry::plural;
        println!(
            "{}: ok ({}, {}, {})",
            config.source.display(),
            plural(config.plugins.len(), "plugin", "plugins"),
            plural(config.pipelines.len(), "pipeline", "pipelines"),
            plural(config.tenants.len(), "tenant", "tenants")
        );
        Ok(())
    }
}

/// What `weir run` does before it connects: compile, link against the
/// world and `init` each plugin. Every failure is printed at its line, and
/// refused (exit code 5). With the config's compiled cache: a check warms
/// it for `weir run`.
pub async fn refuse_failing_plugins(config: &Config) -> anyhow::Result<()> {
    let sandbox = weir::sandbox::Sandbox::new(weir::telemetry::Metrics::default())?.with_cache(
        config.compile_cache_dir.clone(),
        config.compile_cache_max_bytes,
    );
    let mut failures = Vec::new();
    for plugin in config.plugins.values() {
        if let Err(err) = sandbox.load(plugin).await {
            failures.push(at_its_line(config, plugin, &err));
        }
    }
    if failures.is_empty() {
        return Ok(());
    }
    for failure in &failures {
        eprintln!("{failure}");
    }
    Err(super::Refused(format!(
        "{} of {} cannot run",
        failures.len(),
        weir::telemetry::plural(config.plugins.len(), "plugin", "plugins")
    ))
    .into())
}

/// Asks each granted object store for one listing under the grant's
/// prefix, so a missing bucket, refused keys or an unreachable endpoint
/// show here, named by the grant. Only `weir check` asks: at run time a
/// store that cannot answer makes the rows wait.
async fn refuse_unreachable_stores(config: &Config) -> anyhow::Result<()> {
    let sandbox = weir::sandbox::Sandbox::new(weir::telemetry::Metrics::default())?.with_cache(
        config.compile_cache_dir.clone(),
        config.compile_cache_max_bytes,
    );
    let mut failures = Vec::new();
    for plugin in config.plugins.values() {
        if plugin.grants.objects.is_none() {
            continue;
        }
        let probed = match sandbox.load(plugin).await {
            Ok(loaded) => loaded.probe_objects().await,
            Err(err) => Err(err.to_string()),
        };
        if let Err(message) = probed {
            let problem = match config.plugin_places.get(&plugin.name) {
                Some(places) => places.table.problem(message),
                None => Problem {
                    file: config.source.clone(),
                    line: 1,
                    column: 1,
                    message,
                },
            };
            failures.push(problem);
        }
    }
    if failures.is_empty() {
        return Ok(());
    }
    for failure in &failures {
        eprintln!("{failure}");
    }
    Err(super::Refused(format!(
        "{} cannot be reached",
        weir::telemetry::plural(failures.len(), "object store", "object stores")
    ))
    .into())
}

/// A plugin that cannot be loaded, at the line of the key it comes from:
/// the component at `wasm`, its world at `world`, a grant's directory at
/// its `host`, anything else at the plugin's table.
pub fn at_its_line(config: &Config, plugin: &PluginConfig, err: &LoadError) -> Problem {
    let message = err.to_string();
    let Some(places) = config.plugin_places.get(&plugin.name) else {
        return Problem {
            file: config.source.clone(),
            line: 1,
            column: 1,
            message,
        };
    };
    let place = match err {
        LoadError::Read { .. } | LoadError::Compile { .. } | LoadError::Link { .. } => &places.wasm,
        LoadError::WrongWorld { .. } | LoadError::WrongVersion { .. } => &places.world,
        LoadError::Grant { dir, .. } => plugin
            .grants
            .dirs
            .iter()
            .position(|grant| grant.host.display().to_string() == *dir)
            .and_then(|at| places.dirs.get(at))
            .unwrap_or(&places.table),
        _ => &places.table,
    };
    place.problem(message)
}
