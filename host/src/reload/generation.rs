//! A generation: one validated config and the plugin versions loaded for
//! it. The host runs one generation at a time; a hot reload publishes the
//! next as a whole, and delivery workers and the front door each adopt it
//! between two batches or requests.

use std::collections::HashMap;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::config::Config;
use crate::sandbox::Plugin;

/// The config and loaded plugin versions of one generation.
pub struct Generation {
    config: Arc<Config>,
    plugins: HashMap<String, Arc<Plugin>>,
}

impl Generation {
    pub fn new(config: Arc<Config>, plugins: HashMap<String, Arc<Plugin>>) -> Generation {
        Generation { config, plugins }
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
}
