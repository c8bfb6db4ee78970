//! The benchmark report: reads what `host/benches/report.sh` captured from
//! each benchmark (`DIR/<bench>.txt`: JSON figure lines, then tables) and
//! writes `DIR/report.md` with one SVG bar chart per benchmark and unit
//! (`DIR/<bench>-<unit>.svg`), the targets, and each benchmark's tables.
//!
//! `cargo bench -p weir --bench report -- DIR` (the script runs it last);
//! without a directory it says so and does nothing.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// The benchmarks in report order, with what each measures.
const BENCHES: &[(&str, &str)] = &[
    (
        "delivery",
        "weir's delivery path (pass-through transform, null sink) against a hand-written async-nats pull consumer on the same server; allocations per row on the host side; throughput and memory as units grow",
    ),
    (
        "front_door",
        "HTTP ingest of 1000-row requests against raw pipelined JetStream publish from the same process; latency at half load",
    ),
    (
        "boundary",
        "the same masking transform natively and as a weir plugin at batch sizes 1–1000; a no-op plugin for the boundary alone",
    ),
    (
        "peer",
        "the same masking transform in weir and in Extism (its Rust host SDK), Extism called once per row and once per NDJSON batch",
    ),
    (
        "policy",
        "budget and router plugin calls as the front door makes them, against no policy",
    ),
    (
        "kv_watch_cost",
        "nats-server memory and consumers when hosts watch KV prefixes through weir's one-consumer watcher or one consumer per prefix",
    ),
    (
        "coordination_cost",
        "KV operations and watch messages per host at steady state for a fleet of real coordination members",
    ),
];

/// The targets of issue #9, printed next to the figures.
const TARGETS: &[&str] = &[
    "delivery path ≥ 0.7 × the raw consumer limit, same run",
    "WASM transform ≤ 1.3 × native per row at batch ≥ 100; the boundary alone ≤ 25 ns per row at batch ≥ 100",
    "≥ 1.7 × faster per row than Extism's best batched mode, ≥ 4 × faster than Extism called per row",
    "≤ 2 allocations per row on the delivery path outside the plugin",
    "front door ≥ 100,000 rows/s with 1000-row requests; p99 ≤ 50 ms at half that load",
];

/// Which way a figure must go to meet its target.
#[derive(Clone, Copy)]
enum Goal {
    AtLeast(f64),
    AtMost(f64),
}

impl Goal {
    /// How far along the figure is: 1 meets the target, above 1 beats it.
    fn progress(self, value: f64) -> f64 {
        match self {
            Goal::AtLeast(goal) => value / goal,
            Goal::AtMost(goal) if value > 0.0 => goal / value,
            Goal::AtMost(_) => f64::INFINITY,
        }
    }

    fn describe(self) -> String {
        match self {
            Goal::AtLeast(goal) => format!("≥ {}", format_value(goal)),
            Goal::AtMost(goal) => format!("≤ {}", format_value(goal)),
        }
    }
}

/// Each target as (bench, figure, goal): the figures the targets are read from.
const TARGET_FIGURES: &[(&str, &str, Goal)] = &[
    ("delivery", "ratio_weir_to_limit", Goal::AtLeast(0.7)),
    ("delivery", "weir_allocs_per_row", Goal::AtMost(2.0)),
    (
        "boundary",
        "ratio_plugin_to_native_batch_100",
        Goal::AtMost(1.3),
    ),
    (
        "boundary",
        "ratio_plugin_to_native_batch_1000",
        Goal::AtMost(1.3),
    ),
    ("boundary", "noop_ns_per_row", Goal::AtMost(25.0)),
    (
        "peer",
        "ratio_extism_best_batched_to_weir_batch_100",
        Goal::AtLeast(1.7),
    ),
    (
        "peer",
        "ratio_extism_per_row_calls_to_weir_batch_100",
        Goal::AtLeast(4.0),
    ),
    ("front_door", "weir_rows_per_sec", Goal::AtLeast(100_000.0)),
    ("front_door", "latency_p99_ms", Goal::AtMost(50.0)),
];

/// Units a figure's name may carry, most specific first; figures are
/// charted together when they share one.
const UNITS: &[&str] = &[
    "alloc_bytes_per_row",
    "allocs_per_row",
    "publish_rows_per_sec",
    "rows_per_sec",
    "ns_per_row",
    "ns_per_request",
    "ns_per_call",
    "us_per_row",
    "kib_per_unit",
    "ratio",
    "_ms",
    "_us",
    "kib",
    "per_sec",
];

fn main() -> ExitCode {
    // cargo passes `--bench`; the directory is the first other argument.
    let Some(dir) = std::env::args().skip(1).find(|arg| !arg.starts_with("--")) else {
        println!(
            "report: give a directory (host/benches/report.sh DIR runs every benchmark into it)"
        );
        return ExitCode::SUCCESS;
    };
    match write_report(Path::new(&dir)) {
        Ok(path) => {
            println!("report: {}", path.display());
            ExitCode::SUCCESS
        }
        Err(err) => {
            eprintln!("report: {err}");
            ExitCode::FAILURE
        }
    }
}

/// One benchmark's capture: its figures in order, and its other lines.
struct Capture {
    figures: Vec<(String, f64)>,
    text: String,
}

fn read_capture(path: &Path) -> Result<Capture, String> {
    let text = std::fs::read_to_string(path).map_err(|err| format!("{}: {err}", path.display()))?;
    let mut capture = Capture {
        figures: Vec::new(),
        text: String::new(),
    };
    for line in text.lines() {
        match serde_json::from_str::<serde_json::Value>(line) {
            Ok(value) if value.get("figure").is_some() => {
                let name = value["figure"].as_str().unwrap_or_default().to_string();
                let figure = value["value"]
                    .as_f64()
                    .ok_or_else(|| format!("{}: figure `{name}` has no number", path.display()))?;
                capture.figures.push((name, figure));
            }
            _ => {
                capture.text.push_str(line);
                capture.text.push('\n');
            }
        }
    }
    Ok(capture)
}

fn unit_of(figure: &str) -> &'static str {
    UNITS
        .iter()
        .find(|unit| figure.contains(*unit))
        .copied()
        .unwrap_or("other")
}

fn write_report(dir: &Path) -> Result<PathBuf, String> {
    let mut report = String::new();
    let _ = writeln!(report, "# weir benchmark report\n");
    let _ = writeln!(report, "{}\n", machine());
    let _ = writeln!(
        report,
        "Every figure is measured side by side with its reference in the same run; on a shared machine the ratios are the figures to trust.\n"
    );
    let _ = writeln!(report, "## Targets\n");
    for target in TARGETS {
        let _ = writeln!(report, "- {target}");
    }
    let mut captures = BTreeMap::new();
    let mut missing = Vec::new();
    for (bench, _) in BENCHES {
        let path = dir.join(format!("{bench}.txt"));
        if !path.exists() {
            missing.push(*bench);
            continue;
        }
        let capture = read_capture(&path)?;
        if capture.figures.is_empty() {
            return Err(format!(
                "{}: no figures; the benchmark did not finish",
                path.display()
            ));
        }
        captures.insert(*bench, capture);
    }
    write_targets(&mut report, dir, &captures)?;
    for (bench, what) in BENCHES {
        let Some(capture) = captures.get(bench) else {
            continue;
        };
        let _ = writeln!(report, "\n## {bench}\n\n{what}.\n");
        let mut by_unit: BTreeMap<&str, Vec<(String, f64)>> = BTreeMap::new();
        for (name, value) in &capture.figures {
            by_unit
                .entry(unit_of(name))
                .or_default()
                .push((name.clone(), *value));
        }
        for (unit, figures) in &by_unit {
            let file = format!("{bench}-{}.svg", unit.trim_matches('_'));
            std::fs::write(
                dir.join(&file),
                bar_chart(&format!("{bench}: {unit}"), unit, figures),
            )
            .map_err(|err| format!("write {file}: {err}"))?;
            let _ = writeln!(report, "![{bench}: {unit}]({file})\n");
        }
        let _ = writeln!(report, "| figure | value |\n| --- | ---: |");
        for (name, value) in &capture.figures {
            let _ = writeln!(report, "| `{name}` | {} |", format_value(*value));
        }
        let _ = writeln!(report, "\n```text\n{}```", capture.text.trim_start());
    }
    if !missing.is_empty() {
        let _ = writeln!(report, "\nNot run: {}.", missing.join(", "));
    }
    let path = dir.join("report.md");
    std::fs::write(&path, report).map_err(|err| format!("write {}: {err}", path.display()))?;
    Ok(path)
}

/// The targets as a table (figure, goal, measured, met) and a chart of how
/// far along each is, 1 being the target.
fn write_targets(
    report: &mut String,
    dir: &Path,
    captures: &BTreeMap<&str, Capture>,
) -> Result<(), String> {
    let mut progress = Vec::new();
    let _ = writeln!(
        report,
        "\n| bench | figure | target | measured | met |\n| --- | --- | ---: | ---: | :---: |"
    );
    for (bench, figure, goal) in TARGET_FIGURES {
        let measured = captures.get(bench).and_then(|capture| {
            capture
                .figures
                .iter()
                .find(|(name, _)| name == figure)
                .map(|(_, value)| *value)
        });
        let (value, met) = match measured {
            Some(value) => {
                progress.push((format!("{bench} {figure}"), goal.progress(value)));
                let met = if goal.progress(value) >= 1.0 {
                    "yes"
                } else {
                    "no"
                };
                (format_value(value), met)
            }
            None => ("not run".to_string(), "—"),
        };
        let _ = writeln!(
            report,
            "| {bench} | `{figure}` | {} | {value} | {met} |",
            goal.describe()
        );
    }
    if progress.is_empty() {
        return Ok(());
    }
    let file = "targets.svg";
    std::fs::write(dir.join(file), target_chart(&progress))
        .map_err(|err| format!("write {file}: {err}"))?;
    let _ = writeln!(report, "\n![progress to each target]({file})");
    Ok(())
}

/// A horizontal bar per target: its progress (measured against the goal,
/// 1 = met), green when met, red when not, with a line at 1.
fn target_chart(progress: &[(String, f64)]) -> String {
    const WIDTH: f64 = 860.0;
    const LABEL: f64 = 420.0;
    const BAR: f64 = 22.0;
    const GAP: f64 = 8.0;
    const TOP: f64 = 36.0;
    // Far past the target is still drawn as "well past": the axis ends at 2.
    const AXIS_MAX: f64 = 2.0;
    let span = WIDTH - LABEL - 80.0;
    let height = TOP + progress.len() as f64 * (BAR + GAP) + 24.0;
    let mut svg = String::new();
    let _ = writeln!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(svg, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ = writeln!(
        svg,
        r#"<text x="10" y="22" font-size="14" font-weight="bold">progress to each target (1 = met)</text>"#
    );
    for (index, (name, value)) in progress.iter().enumerate() {
        let y = TOP + index as f64 * (BAR + GAP);
        let length = (value.min(AXIS_MAX) / AXIS_MAX * span).max(1.0);
        let colour = if *value >= 1.0 { "#3a9a5b" } else { "#c8553d" };
        let _ = writeln!(
            svg,
            r#"<text x="{}" y="{}" text-anchor="end">{}</text>"#,
            LABEL - 8.0,
            y + BAR * 0.7,
            escape(&name.replace('_', " "))
        );
        let _ = writeln!(
            svg,
            r#"<rect x="{LABEL}" y="{y}" width="{length:.1}" height="{BAR}" fill="{colour}"/>"#
        );
        let _ = writeln!(
            svg,
            r#"<text x="{:.1}" y="{}">{:.2}</text>"#,
            LABEL + length + 6.0,
            y + BAR * 0.7,
            value
        );
    }
    let target_x = LABEL + span / AXIS_MAX;
    let _ = writeln!(
        svg,
        r#"<line x1="{target_x:.1}" y1="{}" x2="{target_x:.1}" y2="{}" stroke="black" stroke-dasharray="4 3"/>"#,
        TOP - 6.0,
        height - 18.0
    );
    let _ = writeln!(
        svg,
        r#"<text x="{target_x:.1}" y="{}" text-anchor="middle">target</text>"#,
        height - 4.0
    );
    svg.push_str("</svg>\n");
    svg
}

/// The CPU model and count, from `/proc/cpuinfo`.
fn machine() -> String {
    let info = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = info
        .lines()
        .find_map(|line| line.strip_prefix("model name"))
        .map(|rest| rest.trim_start_matches([' ', '\t', ':']).to_string())
        .unwrap_or_else(|| "unknown CPU".to_string());
    let cpus = info
        .lines()
        .filter(|line| line.starts_with("processor"))
        .count();
    let commit = std::env::var("WEIR_BENCH_COMMIT").unwrap_or_default();
    let commit = if commit.is_empty() {
        String::new()
    } else {
        format!(", commit `{commit}`")
    };
    format!("Machine: {cpus} × {model}{commit}.")
}

fn format_value(value: f64) -> String {
    if value.abs() >= 100.0 {
        format!("{value:.0}")
    } else {
        format!("{value:.2}")
    }
}

/// A horizontal bar chart: one bar per figure, its value at the end.
fn bar_chart(title: &str, unit: &str, figures: &[(String, f64)]) -> String {
    const WIDTH: f64 = 760.0;
    const LABEL: f64 = 300.0;
    const BAR: f64 = 22.0;
    const GAP: f64 = 8.0;
    const TOP: f64 = 36.0;
    let max = figures
        .iter()
        .map(|(_, value)| value.abs())
        .fold(0.0, f64::max)
        .max(f64::MIN_POSITIVE);
    let span = WIDTH - LABEL - 110.0;
    let height = TOP + figures.len() as f64 * (BAR + GAP) + 10.0;
    let mut svg = String::new();
    let _ = writeln!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(svg, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ = writeln!(
        svg,
        r#"<text x="10" y="22" font-size="14" font-weight="bold">{}</text>"#,
        escape(title)
    );
    for (index, (name, value)) in figures.iter().enumerate() {
        let y = TOP + index as f64 * (BAR + GAP);
        let length = (value.abs() / max * span).max(1.0);
        let label = name.replace(unit, "").trim_matches('_').replace('_', " ");
        let label = if label.is_empty() {
            name.clone()
        } else {
            label
        };
        let _ = writeln!(
            svg,
            r#"<text x="{}" y="{}" text-anchor="end">{}</text>"#,
            LABEL - 8.0,
            y + BAR * 0.7,
            escape(&label)
        );
        let _ = writeln!(
            svg,
            r##"<rect x="{LABEL}" y="{y}" width="{length:.1}" height="{BAR}" fill="#4a7fb5"/>"##
        );
        let _ = writeln!(
            svg,
            r#"<text x="{:.1}" y="{}">{}</text>"#,
            LABEL + length + 6.0,
            y + BAR * 0.7,
            format_value(*value)
        );
    }
    svg.push_str("</svg>\n");
    svg
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}
