//! What a component is, without running it (`weir plugin check`): the world
//! it implements or the exports each world misses, what it imports, the
//! grants those imports would need, its size and what compiling it cost.

use std::path::Path;
use std::time::{Duration, Instant};

use super::cache::Origin;
use super::*;

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
    /// A `weir:plugin` version other than this host's, when it imports one.
    pub foreign_version: Option<String>,
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
            grants: grant_needs(&imports),
            imports,
            exports,
        })
    }
}

/// The grants a component with these imports would need. Every std guest
/// imports the filesystem and environment interfaces whether it uses them
/// or not, so those are said to matter only if the plugin reads files or
/// variables.
fn grant_needs(imports: &[String]) -> Vec<GrantNeed> {
    let first = |prefix: &str| {
        imports
            .iter()
            .find(|name| name.starts_with(prefix))
            .cloned()
    };
    let mut needs = Vec::new();
    if let Some(import) = first("wasi:http/outgoing-handler")
        .or_else(|| first("weir:plugin/http-batch"))
        .or_else(|| first("wasi:http/"))
    {
        needs.push(GrantNeed {
            grant: "grants.http",
            import,
            without: "it loads, and every request it makes is refused (HttpRequestDenied, or http-batch's `refused`)",
        });
    }
    if let Some(import) = first("weir:plugin/state") {
        needs.push(GrantNeed {
            grant: "grants.state",
            import,
            without: "it loads, and every state call returns an error",
        });
    }
    if let Some(import) = first("wasi:filesystem/") {
        needs.push(GrantNeed {
            grant: "grants.dirs",
            import,
            without: "only if it opens files: it sees no directory, so opening fails",
        });
    }
    if let Some(import) = first("wasi:cli/environment") {
        needs.push(GrantNeed {
            grant: "grants.env",
            import,
            without: "only if it reads variables: it sees none",
        });
    }
    if let Some(import) = first("wasi:sockets/") {
        needs.push(GrantNeed {
            grant: "(never granted)",
            import,
            without: "sockets are never granted: every connection fails",
        });
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
            "weir:plugin/host@0.2.0",
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
        assert!(grant_needs(&["weir:plugin/host@0.2.0".to_string()]).is_empty());
        let batch = grant_needs(&["weir:plugin/http-batch@0.2.0".to_string()]);
        assert_eq!(batch.len(), 1);
        assert_eq!(
            (batch[0].grant, batch[0].import.as_str()),
            ("grants.http", "weir:plugin/http-batch@0.2.0")
        );
    }
}
