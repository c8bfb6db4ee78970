//! A generation: one validated config and the plugin versions loaded for
//! it. The host runs one generation at a time; a hot reload publishes the
//! next as a whole, and delivery workers and the front door each adopt it
//! between two batches or requests.
//!
//! With canaries, a pipeline runs in variants: one per combination of its
//! canaried plugins' versions (serving or candidate). A row's variant is
//! its tenant's (`Canary::serves`), so a tenant's rows see one version.
//! A shadow (`reload::shadow`) makes no variant: the release serves, and
//! the candidate runs beside it on copies.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::config::Config;
use crate::reload::canary::{Auto, Canary, Counts, Ended, Tally};
use crate::reload::shadow::Diff;
use crate::sandbox::Plugin;
use crate::topology::route::Unit;

/// At most this many canaried plugins in one pipeline (2^N variants);
/// those past it serve with their release only.
const MAX_CANARIES_PER_PIPELINE: usize = 4;

/// A candidate loaded beside its release, and who it serves.
#[derive(Clone)]
pub struct CanaryVersion {
    pub plugin: Arc<Plugin>,
    pub canary: Canary,
}

/// One way to run a pipeline: which of its canaried plugins run their
/// candidate.
struct Variant {
    pipeline: usize,
    candidates: Vec<String>,
}

/// The config and loaded plugin versions of one generation.
pub struct Generation {
    config: Arc<Config>,
    plugins: HashMap<String, Arc<Plugin>>,
    canaries: BTreeMap<String, CanaryVersion>,
    variants: Vec<Variant>,
    /// Per pipeline: its first variant and its canaried plugins, in bit order.
    pipeline_variants: Vec<(usize, Vec<String>)>,
    counts: Arc<Counts>,
}

impl Generation {
    pub fn new(config: Arc<Config>, plugins: HashMap<String, Arc<Plugin>>) -> Generation {
        Generation::with_canaries(config, plugins, BTreeMap::new(), Arc::default())
    }

    /// A generation where each of `canaries` serves its tenants' rows beside
    /// its release; what both versions did is added to `counts`.
    pub fn with_canaries(
        config: Arc<Config>,
        plugins: HashMap<String, Arc<Plugin>>,
        canaries: BTreeMap<String, CanaryVersion>,
        counts: Arc<Counts>,
    ) -> Generation {
        let mut variants = Vec::new();
        let mut pipeline_variants = Vec::new();
        for (index, pipeline) in config.pipelines.iter().enumerate() {
            let mut canaried: Vec<String> = Vec::new();
            for name in pipeline.transforms.iter().chain(pipeline.sink.iter()) {
                // A shadow serves no tenant: no variant runs it.
                if canaries.get(name).is_some_and(|c| !c.canary.shadow)
                    && !canaried.contains(name)
                    && canaried.len() < MAX_CANARIES_PER_PIPELINE
                {
                    canaried.push(name.clone());
                }
            }
            pipeline_variants.push((variants.len(), canaried.clone()));
            for mask in 0..1usize << canaried.len() {
                let candidates = canaried
                    .iter()
                    .enumerate()
                    .filter(|(bit, _)| mask & (1 << bit) != 0)
                    .map(|(_, name)| name.clone())
                    .collect();
                variants.push(Variant {
                    pipeline: index,
                    candidates,
                });
            }
        }
        Generation {
            config,
            plugins,
            canaries,
            variants,
            pipeline_variants,
            counts,
        }
    }

    /// The candidates running beside their releases, by plugin name.
    pub fn canaries(&self) -> &BTreeMap<String, CanaryVersion> {
        &self.canaries
    }

    /// Plugin `name`'s candidate, if it has one.
    pub fn canary(&self, name: &str) -> Option<&CanaryVersion> {
        self.canaries.get(name)
    }

    /// The shadows of variant `variant`'s transforms: each candidate runs
    /// on copies of what the release answers there.
    pub fn variant_shadows(&self, variant: usize) -> Vec<(&str, &CanaryVersion)> {
        let Some(pipeline) = self
            .variants
            .get(variant)
            .and_then(|v| self.config.pipelines.get(v.pipeline))
        else {
            return Vec::new();
        };
        self.canaries
            .iter()
            .filter(|(name, c)| c.canary.shadow && pipeline.transforms.contains(name))
            .map(|(name, c)| (name.as_str(), c))
            .collect()
    }

    /// Where delivery adds what canaried versions did with their rows.
    pub fn canary_counts(&self) -> &Arc<Counts> {
        &self.counts
    }

    /// How many variants of pipelines there are (at least one per pipeline).
    pub fn variant_count(&self) -> usize {
        self.variants.len()
    }

    /// The pipeline (its index in the config) variant `variant` runs.
    pub fn variant_pipeline(&self, variant: usize) -> Option<usize> {
        self.variants.get(variant).map(|v| v.pipeline)
    }

    /// The variant `tenant`'s rows of `table` in `unit` run in, if a
    /// pipeline takes it.
    pub fn variant_index(&self, table: &str, tenant: &str, unit: Unit) -> Option<usize> {
        let pipeline = self.pipeline_index(table)?;
        let (first, canaried) = self.pipeline_variants.get(pipeline)?;
        let mask = canaried
            .iter()
            .enumerate()
            .filter(|(_, name)| {
                self.canaries
                    .get(*name)
                    .is_some_and(|c| c.canary.serves(name, tenant, unit))
            })
            .fold(0usize, |mask, (bit, _)| mask | 1 << bit);
        Some(first + mask)
    }

    /// The canaried plugins of variant `variant`: each name and whether it
    /// runs its candidate there.
    pub fn variant_canaries(&self, variant: usize) -> Vec<(&str, bool)> {
        let Some(v) = self.variants.get(variant) else {
            return Vec::new();
        };
        self.pipeline_variants
            .get(v.pipeline)
            .map(|(_, canaried)| {
                canaried
                    .iter()
                    .map(|name| (name.as_str(), v.candidates.contains(name)))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// The version of plugin `name` variant `variant` runs.
    pub fn plugin_in(&self, variant: usize, name: &str) -> Option<&Arc<Plugin>> {
        let candidate = self
            .variants
            .get(variant)
            .is_some_and(|v| v.candidates.iter().any(|c| c == name));
        match candidate {
            true => self.canaries.get(name).map(|c| &c.plugin),
            false => self.plugins.get(name),
        }
    }

    pub fn plugins(&self) -> impl Iterator<Item = &Arc<Plugin>> {
        self.plugins.values()
    }

    pub fn config(&self) -> &Arc<Config> {
        &self.config
    }

    /// The loaded version of plugin `name`, if this generation has it.
    pub fn plugin(&self, name: &str) -> Option<&Arc<Plugin>> {
        self.plugins.get(name)
    }

    /// The index of the pipeline that takes `table`, if one does.
    pub fn pipeline_index(&self, table: &str) -> Option<usize> {
        self.config
            .pipelines
            .iter()
            .position(|pipeline| pipeline.tables.iter().any(|t| t == table))
    }

    /// What runs now, one line per plugin, by name.
    pub fn plugin_status(&self) -> Vec<PluginStatus> {
        let mut list: Vec<PluginStatus> = self
            .plugins()
            .map(|plugin| PluginStatus {
                name: plugin.name().to_string(),
                world: plugin.config.world.as_str().to_string(),
                version: plugin.version.clone(),
                canary: None,
                last_canary: None,
            })
            .collect();
        list.sort_by(|a, b| a.name.cmp(&b.name));
        list
    }
}

/// A running plugin version, as status and member keys show it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PluginStatus {
    pub name: String,
    pub world: String,
    pub version: String,
    /// A candidate serving some tenants beside it, fleet-wide counts of both.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub canary: Option<CanaryStatus>,
    /// How its last canary ended, and why.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_canary: Option<Ended>,
}

/// A running canary as status shows it: both versions side by side.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CanaryStatus {
    /// The candidate's version.
    pub version: String,
    /// Who it serves (`25% of tenants`).
    pub serves: String,
    pub started_ms: u64,
    #[serde(default)]
    pub auto: Option<Auto>,
    /// What the fleet's hosts counted, serving version and candidate.
    pub serving: Tally,
    pub candidate: Tally,
    /// A shadow's differences from the release, fleet-wide (`None`: a
    /// canary).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shadow: Option<Diff>,
}
