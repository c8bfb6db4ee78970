//! `[[pipelines]]`: which tables go through which plugins, in order.

use std::collections::{BTreeMap, HashMap};

use serde::Deserialize;
use toml::Spanned;

use super::World;
use super::checker::Checker;
use super::keys::{Fallback, Key, Reload};
use super::plugins::PluginConfig;

/// `[[pipelines]]`: workers take them before their next batch.
pub(super) const KEYS: &[Key] = &[
    Key::new("pipelines", "tables", Fallback::Required, Reload::Hot),
    Key::new("pipelines", "transforms", Fallback::Empty, Reload::Hot),
    Key::new("pipelines", "sink", Fallback::Off, Reload::Hot),
    Key::new(
        "pipelines",
        "bad_lines",
        Fallback::Text("refuse"),
        Reload::Hot,
    ),
];

/// What the front door does with a request's rows that are not JSON
/// objects (or not UTF-8, or carry an unusable key field).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum BadLines {
    /// The whole request is refused (400), nothing stored.
    #[default]
    Refuse,
    /// The good rows are stored, each bad one goes to the dead-letter
    /// stream with its line number and reason.
    DeadLetter,
}

impl BadLines {
    /// The setting as written in the config and the `Weir-Bad-Lines` header.
    pub fn parse(text: &str) -> Option<BadLines> {
        match text.trim() {
            "refuse" => Some(BadLines::Refuse),
            "dead-letter" => Some(BadLines::DeadLetter),
            _ => None,
        }
    }
}

/// Which tables go through which plugins, in order.
#[derive(Debug, Clone)]
pub struct Pipeline {
    pub tables: Vec<String>,
    pub transforms: Vec<String>,
    pub sink: Option<String>,
    pub bad_lines: BadLines,
}

/// One `[[pipelines]]` table as written in the file.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawPipeline {
    /// Spanned as a whole: an empty list is reported where it is written.
    tables: Spanned<Vec<Spanned<String>>>,
    #[serde(default)]
    transforms: Vec<Spanned<String>>,
    sink: Option<Spanned<String>>,
    bad_lines: Option<Spanned<String>>,
}

impl Checker<'_> {
    pub(super) fn pipelines(
        &self,
        raw: Vec<RawPipeline>,
        plugins: &BTreeMap<String, PluginConfig>,
    ) -> Vec<Pipeline> {
        let mut table_owner: HashMap<String, usize> = HashMap::new();
        let mut pipelines = Vec::new();
        for (index, pipeline) in raw.into_iter().enumerate() {
            if pipeline.tables.get_ref().is_empty() {
                self.report(
                    pipeline.tables.span().start,
                    format!("pipeline #{} takes no tables", index + 1),
                );
            }
            for table in pipeline.tables.get_ref() {
                self.check_name("table", table);
                if let Some(other) = table_owner.insert(table.get_ref().clone(), index) {
                    self.report(
                        table.span().start,
                        format!(
                            "table `{}` is already taken by pipeline #{}",
                            table.get_ref(),
                            other + 1
                        ),
                    );
                }
            }
            self.check_steps(index, &pipeline, plugins);
            let bad_lines = match &pipeline.bad_lines {
                None => BadLines::Refuse,
                Some(text) => BadLines::parse(text.get_ref()).unwrap_or_else(|| {
                    self.report(
                        text.span().start,
                        format!(
                            "bad_lines must be \"refuse\" or \"dead-letter\", not \"{}\"",
                            text.get_ref()
                        ),
                    );
                    BadLines::Refuse
                }),
            };
            pipelines.push(Pipeline {
                tables: pipeline
                    .tables
                    .into_inner()
                    .into_iter()
                    .map(Spanned::into_inner)
                    .collect(),
                transforms: pipeline
                    .transforms
                    .into_iter()
                    .map(Spanned::into_inner)
                    .collect(),
                sink: pipeline.sink.map(Spanned::into_inner),
                bad_lines,
            });
        }
        pipelines
    }

    /// Each step names a plugin of its world, and at most one keeps state.
    fn check_steps(
        &self,
        index: usize,
        pipeline: &RawPipeline,
        plugins: &BTreeMap<String, PluginConfig>,
    ) {
        let uses = pipeline
            .transforms
            .iter()
            .map(|t| (t, World::Transform))
            .chain(pipeline.sink.iter().map(|s| (s, World::Sink)));
        let mut stateful: Option<&String> = None;
        for (used, world) in uses {
            self.check_plugin_world(plugins, used, world, "pipeline");
            let keeps_state = plugins
                .get(used.get_ref())
                .is_some_and(|p| p.grants.state.is_some());
            match stateful {
                // One scope per row and pipeline: two plugins' writes
                // could not be committed together with the row's ack.
                Some(first) if keeps_state => self.report(
                    used.span().start,
                    format!(
                        "pipeline #{} has two plugins granted state, `{first}` and `{}`: \
                         at most one step of a pipeline keeps state",
                        index + 1,
                        used.get_ref()
                    ),
                ),
                None if keeps_state => stateful = Some(used.get_ref()),
                _ => {}
            }
        }
        self.check_objects_alone(index, pipeline, plugins, stateful);
    }

    /// A sink granted `objects` acks its rows only once their object
    /// stands, a minute later; a scope or a PostgreSQL ledger records
    /// them as applied at once, and a row that comes back after a crash
    /// would be settled without reaching its object. Refused until the
    /// two commit together.
    fn check_objects_alone(
        &self,
        index: usize,
        pipeline: &RawPipeline,
        plugins: &BTreeMap<String, PluginConfig>,
        stateful: Option<&String>,
    ) {
        let Some(sink) = &pipeline.sink else {
            return;
        };
        let Some(grants) = plugins.get(sink.get_ref()).map(|p| &p.grants) else {
            return;
        };
        if grants.objects.is_none() {
            return;
        }
        let other = match (stateful, &grants.postgres) {
            (Some(step), _) => Some(format!("`{step}` keeps state")),
            (None, Some(_)) => Some("it is also granted postgres".to_string()),
            (None, None) => None,
        };
        if let Some(other) = other {
            self.report(
                sink.span().start,
                format!(
                    "pipeline #{}: sink `{}` is granted objects and {other}: a row's object commits \
                     after the state or the database recorded it, so a row coming back after a \
                     crash would miss its object; give the objects sink a pipeline without state \
                     or postgres",
                    index + 1,
                    sink.get_ref()
                ),
            );
        }
    }

    /// `used` names a plugin of `world`.
    pub(super) fn check_plugin_world(
        &self,
        plugins: &BTreeMap<String, PluginConfig>,
        used: &Spanned<String>,
        world: World,
        user: &str,
    ) {
        match plugins.get(used.get_ref()) {
            None => self.report(
                used.span().start,
                format!("{user} uses unknown plugin `{}`", used.get_ref()),
            ),
            Some(plugin)
                if plugin.world != world
                    && !self.unknown_world.borrow().contains(used.get_ref()) =>
            {
                self.report(
                    used.span().start,
                    format!(
                        "plugin `{}` is a {} but is used here as a {}",
                        used.get_ref(),
                        plugin.world.as_str(),
                        world.as_str()
                    ),
                )
            }
            Some(_) => {}
        }
    }
}
