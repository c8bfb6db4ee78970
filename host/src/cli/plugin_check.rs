//! `weir plugin check FILE.wasm`: the world a component implements (or
//! what each world misses), its imports, the grants it would need, its
//! size and what compiling it cost. Nothing of the plugin runs.

use std::path::PathBuf;

use weir::sandbox::{Inspection, Origin, WIT_VERSION, megabytes};

#[derive(clap::Args)]
pub struct CheckArgs {
    /// The component to look at.
    file: PathBuf,
    /// Print one JSON object instead of text, for scripts.
    #[arg(long)]
    json: bool,
}

impl CheckArgs {
    pub async fn run(self) -> anyhow::Result<()> {
        let sandbox = super::plugin_test::sandbox(None)?;
        let inspection = sandbox.inspect(&self.file).await?;
        if self.json {
            println!("{}", as_json(&inspection));
        } else {
            print!("{}", as_text(&self.file.display().to_string(), &inspection));
        }
        if let Some(found) = &inspection.foreign_version {
            return Err(super::Refused(format!(
                "{} {}",
                self.file.display(),
                weir::sandbox::wrong_version(found)
            ))
            .into());
        }
        if inspection.implemented().is_empty() {
            return Err(super::Refused(format!(
                "{} implements no weir world",
                self.file.display()
            ))
            .into());
        }
        Ok(())
    }
}

fn compiled(inspection: &Inspection) -> String {
    let secs = inspection.compile.as_secs_f64();
    match inspection.origin {
        Origin::Compiled => format!("compiled in {secs:.2} s"),
        Origin::Cache => format!("loaded from the compiled cache in {secs:.2} s"),
        Origin::Fleet => format!("loaded the fleet's compiled artifact in {secs:.2} s"),
    }
}

fn as_text(file: &str, inspection: &Inspection) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{file}: {}, version {}, {}",
        megabytes(inspection.bytes),
        inspection.version,
        compiled(inspection)
    );
    let implemented = inspection.implemented();
    match implemented.as_slice() {
        [] => {
            let _ = writeln!(out, "world: none; missing exports against each world:");
        }
        worlds => {
            let names: Vec<String> = worlds
                .iter()
                .map(|world| format!("weir:plugin/{}@{}", world.as_str(), inspection.wit_version))
                .collect();
            let _ = writeln!(out, "world: {}", names.join(", "));
            let _ = writeln!(out, "other worlds, and the exports they miss:");
        }
    }
    for (world, missing) in &inspection.worlds {
        if !missing.is_empty() {
            let missing: Vec<String> = missing.iter().map(|name| format!("`{name}`")).collect();
            let _ = writeln!(out, "  {}: missing {}", world.as_str(), missing.join(", "));
        }
    }
    if let Some(found) = &inspection.foreign_version {
        let _ = writeln!(
            out,
            "wit: built for weir:plugin@{found}; this weir speaks {WIT_VERSION}: rebuild it with the current SDK"
        );
    } else if inspection.wit_version != WIT_VERSION {
        let _ = writeln!(
            out,
            "wit: built for weir:plugin@{}, the previous version, which this weir still serves \
             (it speaks {WIT_VERSION}); rebuild it with the current SDK before the next one",
            inspection.wit_version
        );
    }
    let _ = writeln!(out, "exports: {}", inspection.exports.join(", "));
    let _ = writeln!(out, "imports:");
    for import in &inspection.imports {
        let _ = writeln!(out, "  {import}");
    }
    if inspection.grants.is_empty() {
        let _ = writeln!(out, "grants: none needed");
    } else {
        let _ = writeln!(out, "grants:");
        for need in &inspection.grants {
            let _ = writeln!(
                out,
                "  {} (imports {}): without it, {}",
                need.grant, need.import, need.without
            );
        }
    }
    out
}

fn as_json(inspection: &Inspection) -> serde_json::Value {
    let worlds: serde_json::Map<String, serde_json::Value> = inspection
        .worlds
        .iter()
        .map(|(world, missing)| {
            (
                world.as_str().to_string(),
                serde_json::json!({ "missing": missing }),
            )
        })
        .collect();
    let implemented: Vec<&str> = inspection
        .implemented()
        .iter()
        .map(|world| world.as_str())
        .collect();
    let grants: Vec<serde_json::Value> = inspection
        .grants
        .iter()
        .map(|need| {
            serde_json::json!({ "grant": need.grant, "import": need.import, "without": need.without })
        })
        .collect();
    serde_json::json!({
        "bytes": inspection.bytes,
        "version": inspection.version,
        "compile_ms": u64::try_from(inspection.compile.as_millis()).unwrap_or(u64::MAX),
        "from_cache": inspection.origin == Origin::Cache,
        "implements": implemented,
        "worlds": worlds,
        "wit_version": inspection.wit_version,
        "wit_served": inspection.foreign_version.is_none(),
        "imports": inspection.imports,
        "exports": inspection.exports,
        "grants": grants,
    })
}
