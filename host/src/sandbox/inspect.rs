//! What a component is, without running it (`weir plugin check`): the world
//! it implements or the exports each world misses, what it imports, the
//! grants those imports would need, its size and what compiling it cost.

use std::path::Path;
use std::time::{Duration, Instant};

use super::cache::Origin;
use super::*;
use crate::capability::{CAPABILITIES, Check};

/// A component as `weir plugin check` reports it.
#[derive(Debug, Clone)]
pub struct Inspection {
    /// Size of the `.wasm`, in bytes.
    pub bytes: usize,
    /// Content digest, as status and logs show it.
    pub version: String,
    /// Time to get the compiled component (Cranelift, or the cache).
    pub compile: Duration,
    pub origin: Origin,
    /// For each world, the exports the component lacks for it.
    pub worlds: Vec<(World, Vec<&'static str>)>,
    /// A `weir:plugin` version this host does not serve, when it imports one.
    pub foreign_version: Option<String>,
    /// The `weir:plugin` version it was built for (today's when it
    /// imports none of weir's interfaces).
    pub wit_version: String,
    pub imports: Vec<String>,
    pub exports: Vec<String>,
    /// The grants its imports would need, each with why.
    pub grants: Vec<GrantNeed>,
}

/// One grant a component's imports call for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GrantNeed {
    /// The TOML key (`grants.http`), or what is never granted.
    pub grant: &'static str,
    /// The import that calls for it.
    pub import: String,
    /// What happens without it.
    pub without: &'static str,
}

impl Inspection {
    /// The worlds whose every export the component has.
    pub fn implemented(&self) -> Vec<World> {
        self.worlds
            .iter()
            .filter(|(_, missing)| missing.is_empty())
            .map(|(world, _)| *world)
            .collect()
    }
}

impl Sandbox {
    /// Compiles (or loads from the cache) the component at `path` and
    /// describes it; nothing of it runs.
    pub async fn inspect(&self, path: &Path) -> Result<Inspection, LoadError> {
        let shown = path.display().to_string();
        let name = path
            .file_stem()
            .map_or_else(|| shown.clone(), |stem| stem.to_string_lossy().into_owned());
        let bytes = tokio::fs::read(path)
            .await
            .map_err(|source| LoadError::Read {
                plugin: name.clone(),
                path: shown.clone(),
                source,
            })?;
        let (size, version) = (bytes.len(), version_of(&bytes));
        let started = Instant::now();
        let compiled = self.compile(&name, &shown, bytes).await?;
        let compile = started.elapsed();
        let component = &compiled.component;
        let ty = component.component_type();
        let imports: Vec<String> = ty
            .imports(&self.engine)
            .map(|(n, _)| n.to_string())
            .collect();
        let exports: Vec<String> = ty
            .exports(&self.engine)
            .map(|(n, _)| n.to_string())
            .collect();
        Ok(Inspection {
            bytes: size,
            version,
            compile,
            origin: compiled.origin,
            worlds: World::all()
                .map(|world| (world, missing_exports(&self.engine, component, world)))
                .collect(),
            foreign_version: foreign_version(&self.engine, component),
            wit_version: built_for(&self.engine, component),
            grants: grant_needs(&imports),
            imports,
            exports,
        })
    }
}

/// The grants a component with these imports would need, as
/// [`crate::capability::CAPABILITIES`] says: one per grant, in the table's
/// order. Of the checks sharing a grant (`wasi:http` and `http-batch`),
/// each one's first choice of import is tried before any second choice,
/// so the import named is the one that says most. Every std guest imports
/// the filesystem and environment interfaces whether it uses them or not,
/// so those are said to matter only if the plugin reads files or variables.
fn grant_needs(imports: &[String]) -> Vec<GrantNeed> {
    let first = |prefix: &str| {
        imports
            .iter()
            .find(|name| name.starts_with(prefix))
            .cloned()
    };
    let checks: Vec<&Check> = CAPABILITIES.iter().flat_map(|spec| spec.checks).collect();
    let mut needs: Vec<GrantNeed> = Vec::new();
    for check in &checks {
        if needs.iter().any(|need| need.grant == check.grant) {
            continue;
        }
        let sharing: Vec<&&Check> = checks.iter().filter(|c| c.grant == check.grant).collect();
        let most = sharing.iter().map(|c| c.imports.len()).max().unwrap_or(0);
        let import = (0..most).find_map(|rank| {
            sharing
                .iter()
                .filter_map(|c| c.imports.get(rank))
                .find_map(|prefix| first(prefix))
        });
        if let Some(import) = import {
            needs.push(GrantNeed {
                grant: check.grant,
                import,
                without: check.without,
            });
        }
    }
    needs
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn http_is_named_by_its_outgoing_handler_or_http_batch_and_sockets_are_never_granted() {
        let imports: Vec<String> = [
            "wasi:http/types@0.2.3",
            "wasi:http/outgoing-handler@0.2.3",
            "wasi:sockets/tcp@0.2.3",
            "weir:plugin/host@0.3.0",
        ]
        .map(String::from)
        .to_vec();
        let needs = grant_needs(&imports);
        let grants: Vec<(&str, &str)> = needs
            .iter()
            .map(|need| (need.grant, need.import.as_str()))
            .collect();
        assert_eq!(
            grants,
            [
                ("grants.http", "wasi:http/outgoing-handler@0.2.3"),
                ("(never granted)", "wasi:sockets/tcp@0.2.3")
            ]
        );
        assert!(grant_needs(&["weir:plugin/host@0.3.0".to_string()]).is_empty());
        let batch = grant_needs(&["weir:plugin/http-batch@0.3.0".to_string()]);
        assert_eq!(batch.len(), 1);
        assert_eq!(
            (batch[0].grant, batch[0].import.as_str()),
            ("grants.http", "weir:plugin/http-batch@0.3.0")
        );
        // http-batch says more than a `wasi:http` import that is not the handler.
        let both = grant_needs(&[
            "wasi:http/types@0.2.3".to_string(),
            "weir:plugin/http-batch@0.3.0".to_string(),
        ]);
        assert_eq!(both.len(), 1);
        assert_eq!(both[0].import, "weir:plugin/http-batch@0.3.0");
    }

    #[test]
    fn a_sinks_destinations_are_named_by_their_grants() {
        let needs = grant_needs(&[
            "weir:plugin/nats@0.3.0".to_string(),
            "weir:plugin/postgres@0.3.0".to_string(),
            "weir:plugin/state@0.3.0".to_string(),
        ]);
        let grants: Vec<&str> = needs.iter().map(|need| need.grant).collect();
        assert_eq!(grants, ["grants.state", "grants.postgres", "grants.nats"]);
    }
}
