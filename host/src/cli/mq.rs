//! `weir mq`: what an operator applies to NATS for a config, as files or
//! applied directly.

use std::path::{Path, PathBuf};

use anyhow::Context as _;
use weir::config::{Config, Overrides};
use weir::topology::{Manifest, ManifestFile, Mismatch, Permissions, Severity};

use super::target::{NatsArgs, router_of};

#[derive(clap::Subcommand)]
pub enum MqCommand {
    /// Print the streams, consumers, KV bucket and object store the config
    /// needs (JSON), or write one file per object with --out.
    Manifests {
        /// The TOML config file.
        #[arg(short, long, env = "WEIR_CONFIG")]
        config: PathBuf,
        /// `nats`: the JetStream API's JSON (`nats stream add --config FILE`,
        /// `nats consumer add STREAM --config FILE`); `nack`: Kubernetes
        /// resources for the NATS controllers (`kubectl apply -f DIR`).
        #[arg(short, long, value_enum, default_value_t = ManifestFormat::Nats)]
        format: ManifestFormat,
        /// Split this many bytes of file store between the streams
        /// (e.g. 500GB, 64GiB, 1T), instead of each partition's `max_bytes`.
        #[arg(long, value_parser = parse_bytes, value_name = "SIZE")]
        file_store: Option<i64>,
        /// Write one file per object into this directory (created if needed)
        /// instead of printing one document.
        #[arg(short, long, value_name = "DIR")]
        out: Option<PathBuf>,
    },
    /// Create what the config needs on a NATS server, or update it to the
    /// config, and say what changed.
    Apply {
        /// The TOML config file.
        #[arg(short, long, env = "WEIR_CONFIG")]
        config: PathBuf,
        #[command(flatten)]
        nats: NatsArgs,
    },
    /// Print the least-privilege NATS user permissions a host needs, or
    /// with --producer those a producer of one tenant needs.
    Permissions {
        /// The TOML config file.
        #[arg(short, long, env = "WEIR_CONFIG")]
        config: PathBuf,
        /// Print what a producer of this tenant needs to send rows through
        /// the NATS door (its own ingest subjects and answer inbox, nothing
        /// of another tenant's) instead of the host's.
        #[arg(long, value_name = "TENANT")]
        producer: Option<String>,
    },
}

#[derive(Clone, Copy, clap::ValueEnum)]
pub enum ManifestFormat {
    Nats,
    Nack,
}

impl MqCommand {
    pub async fn run(self) -> anyhow::Result<()> {
        match self {
            MqCommand::Manifests {
                config,
                format,
                file_store,
                out,
            } => {
                let config = Config::load(&config, &Overrides::default())?;
                let manifest = manifest_of(&config, file_store);
                match (out, format) {
                    (Some(dir), ManifestFormat::Nats) => write_files(&dir, &manifest.files()),
                    (Some(dir), ManifestFormat::Nack) => write_files(&dir, &manifest.nack_files()),
                    (None, ManifestFormat::Nats) => print_json(&manifest.to_json()),
                    (None, ManifestFormat::Nack) => print_json(&manifest.to_nack()),
                }?;
                // On stderr: stdout stays the JSON an operator applies.
                for note in publish_notes(&config) {
                    eprintln!("{note}");
                }
                Ok(())
            }
            MqCommand::Apply { config, nats } => {
                let config = Config::load(&config, &nats.overrides())?;
                let url = config.nats.url.clone().context(
                    "no NATS to apply to: pass --nats-url (or set NATS_URL or [nats] url); the embedded server creates its own topology",
                )?;
                let refusals = weir::nats::Refusals::default();
                let client = weir::nats::connect(&url, &config.nats.auth, &refusals).await?;
                let js = async_nats::jetstream::new(client.clone());
                let manifest = manifest_of(&config, None);
                let before = manifest.verify(&js).await;
                // A request the server refuses for permissions goes
                // unanswered (a timeout): its refusal is the true cause.
                tokio::select! {
                    created = manifest.create(&js) => created?,
                    refused = first_refusal(&refusals) => return Err(super::Refused(format!(
                        "NATS refused weir's user: {refused}. `weir mq apply` needs a user \
                         allowed to create streams, KV buckets and consumers (`$JS.API.>`); \
                         hosts then run on `weir mq permissions`"
                    ))
                    .into()),
                }
                let after = manifest.verify(&js).await;
                report_changes(&before, &after, &manifest);
                weir::nats::close(&client, std::time::Duration::from_secs(5))
                    .await
                    .ok();
                let left: Vec<String> = after
                    .iter()
                    .filter(|m| m.severity == Severity::Required)
                    .map(ToString::to_string)
                    .collect();
                anyhow::ensure!(
                    left.is_empty(),
                    "still different after applying:\n  {}",
                    left.join("\n  ")
                );
                Ok(())
            }
            MqCommand::Permissions {
                config,
                producer: Some(tenant),
            } => {
                let config = Config::load(&config, &Overrides::default())?;
                let known: Vec<&str> = config.tenants.iter().map(|t| t.name.as_str()).collect();
                anyhow::ensure!(
                    known.contains(&tenant.as_str()),
                    "no tenant `{tenant}` in the config (tenants: {})",
                    known.join(", ")
                );
                anyhow::ensure!(
                    config.nats.ingest,
                    "the config turns the NATS door off (`[nats] ingest = false`): producers send over HTTP"
                );
                let router = router_of(&config);
                print_json(&serde_json::to_value(Permissions::for_producer(
                    &router, &tenant,
                ))?)?;
                // On stderr: stdout stays the JSON an operator applies.
                eprintln!(
                    "note: the producer takes its answers on inbox prefix `{}` (nats CLI: --inbox-prefix; async-nats: custom_inbox_prefix; nats-py: inbox_prefix)",
                    router.tenant_inbox(&tenant)
                );
                Ok(())
            }
            MqCommand::Permissions {
                config,
                producer: None,
            } => {
                let config = Config::load(&config, &Overrides::default())?;
                let manifest = manifest_of(&config, None);
                let router = router_of(&config);
                let mut permissions =
                    Permissions::for_host(&router, &manifest).with_grants(config.plugins.values());
                if config.nats.ingest {
                    permissions = permissions.with_ingest(&router);
                }
                print_json(&serde_json::to_value(permissions)?)
            }
        }
    }
}

/// The first permission violation the server reports.
async fn first_refusal(refusals: &weir::nats::Refusals) -> String {
    loop {
        if let Some(refused) = refusals.list().into_iter().next() {
            return refused;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

/// What each sink's `grants.nats` needs that the manifests do not hold:
/// a JetStream target is the operator's stream, never created by weir.
fn publish_notes(config: &Config) -> Vec<String> {
    config
        .plugins
        .iter()
        .filter_map(|(name, plugin)| {
            let grant = plugin.grants.nats.as_ref()?;
            let subjects = grant.publish.join(", ");
            Some(if grant.jetstream {
                format!(
                    "note: plugin `{name}` publishes to {subjects} through JetStream \
                     (grants.nats): a stream of yours, not in these manifests, must take \
                     these subjects; a duplicate_window longer than your longest outage \
                     stores each row once"
                )
            } else {
                format!(
                    "note: plugin `{name}` publishes to {subjects} on core NATS \
                     (grants.nats.jetstream = false): no stream needed"
                )
            })
        })
        .collect()
}

fn print_json(value: &serde_json::Value) -> anyhow::Result<()> {
    println!("{}", serde_json::to_string_pretty(value)?);
    Ok(())
}

fn write_files(dir: &Path, files: &[ManifestFile]) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    for file in files {
        let path = dir.join(&file.name);
        let text = serde_json::to_string_pretty(&file.json)? + "\n";
        std::fs::write(&path, text).with_context(|| format!("cannot write {}", path.display()))?;
        println!("{}", path.display());
    }
    eprintln!("{} objects written to {}", files.len(), dir.display());
    Ok(())
}

/// Each object once: created (it was missing), updated (with the fields
/// that differed) or unchanged.
fn report_changes(before: &[Mismatch], after: &[Mismatch], manifest: &Manifest) {
    let objects = manifest.objects();
    let (mut created, mut updated) = (0, 0);
    for object in &objects {
        let differences: Vec<&Mismatch> = before.iter().filter(|m| &m.object == object).collect();
        if differences.iter().any(|m| m.field == "existence") {
            created += 1;
            println!("created {object}");
        } else if !differences.is_empty() {
            let still: Vec<&str> = after
                .iter()
                .filter(|m| &m.object == object)
                .map(|m| m.field.as_str())
                .collect();
            let fields: Vec<&str> = differences
                .iter()
                .map(|m| m.field.as_str())
                .filter(|field| !still.contains(field))
                .collect();
            if !fields.is_empty() {
                updated += 1;
                println!("updated {object}: {}", fields.join(", "));
            }
        }
    }
    println!(
        "{created} created, {updated} updated, {} unchanged",
        objects.len() - created - updated
    );
}

fn manifest_of(config: &Config, file_store: Option<i64>) -> Manifest {
    let router = router_of(config);
    Manifest::new(&router, &config.stream, &config.delivery, file_store)
        .with_dead_letters(&router, &config.dead_letters)
}

/// Bytes as `[stream] max_bytes` takes them: 1024, 64K, 500GB, 2GiB, 1T.
fn parse_bytes(text: &str) -> Result<i64, String> {
    let bytes = weir::config::parse_size(text)?;
    i64::try_from(bytes)
        .ok()
        .filter(|bytes| *bytes > 0)
        .ok_or_else(|| format!("`{text}` is out of range"))
}
