//! The benchmark report: reads what `host/benches/report.sh` captured from
//! each benchmark (`DIR/<bench>.txt`: JSON figure lines, then tables) and
//! writes `DIR/report.md` with one SVG bar chart per benchmark and unit
//! (`DIR/<bench>-<unit>.svg`), the targets, and each benchmark's tables.
//!
//! Each figure is printed next to its value in the baseline
//! (`host/benches/baseline.json`, the last accepted figures; another with
//! `WEIR_BENCH_BASELINE`) and its change, so a regression shows in one
//! look. This run's figures are written to `DIR/figures.json` in the same
//! form: copying it over the baseline accepts them.
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
    (
        "latency",
        "202 to sink (weir's HTTP sink posting to the bench) at 10 % and 50 % of the measured maximum, against PubAck to a raw pull consumer at the same offered rates, and through a host whose sink has `http_keep_alive = false` (no pooling); TCP connections per 1,000 batches; default topology",
    ),
    (
        "whole_path",
        "one host's whole path (HTTP POST → front door → JetStream → validator → NDJSON sink → ack) at saturation against raw JetStream publish + consume in the same run; CPU per row split by front door, delivery, sandbox and nats-server",
    ),
    (
        "replication",
        "raw JetStream and weir's delivery path on an R1 stream (one server) and an R3 stream (three nodes on this machine)",
    ),
    (
        "state",
        "the window plugin's tallies in durable state (grants.state, written with each batch's acks) against the same plugin keeping them in instance memory; one unit",
    ),
    (
        "postgres",
        "rows into PostgreSQL through weir's postgres-sink (one transaction per batch with weir's ledger) against a native tokio-postgres client sending the same bulk statements alone, and against a native async-nats pull consumer doing them and acking after COMMIT; same connection count",
    ),
    (
        "rollout",
        "push to serving on a fleet of three hosts (`weir plugin push --wait`) for a new and a cached 20 MB Python component and a cached small Rust one; one host's drain rate with a shadow running against without",
    ),
    (
        "memory",
        "resident memory of one `weir run` host by the number of transforms it runs (1 and 4) and their language (Rust, Python, JavaScript), each plugin warm, at a first start (compiled in the process) and a restart (mapped from the compiled cache)",
    ),
    (
        "nats_sink",
        "rows into a JetStream stream through weir's nats-sink against a raw async-nats publisher sending the same rows with the same Nats-Msg-Ids, PubAcks pipelined",
    ),
];

/// The targets (issues #9, #22 and #35), printed next to the figures.
const TARGETS: &[&str] = &[
    "delivery path ≥ 0.7 × the raw consumer limit, same run",
    "WASM transform ≤ 1.3 × native per row at batch ≥ 100; the boundary alone ≤ 25 ns per row at batch ≥ 100",
    "≥ 1.7 × faster per row than Extism's best batched mode, ≥ 4 × faster than Extism called per row",
    "≤ 2 allocations per row on the delivery path outside the plugin; allocated bytes per row ≤ 1.5 × the raw consumer's; one unit and the default topology ≥ 0.95 × the raw consumer",
    "front door ≥ 100,000 rows/s with 1000-row requests; p99 ≤ 50 ms at half that load",
    "202 to sink p99 ≤ 3 ms at 10 % load and ≤ 15 ms at 50 % load with the defaults, within 5 × the raw path's p99",
    "rows into PostgreSQL through weir ≥ 0.8 × a native consumer doing the same bulk statements over the same connections",
    "the whole path on one host (front door and delivery together, validator + NDJSON sink) ≥ 0.7 × raw JetStream publish + consume, same run",
    "durable state at 5,000 keys per window ≥ 0.9 × the same window kept in memory",
    "the NATS door ≥ 1.0 × the HTTP door's rows/s, same run",
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
    ("delivery", "ratio_weir_to_limit", Goal::AtLeast(0.95)),
    (
        "delivery",
        "ratio_weir_default_to_limit",
        Goal::AtLeast(0.95),
    ),
    ("delivery", "weir_alloc_bytes_over_limit", Goal::AtMost(1.5)),
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
    ("front_door", "ratio_retry_to_fresh", Goal::AtLeast(0.5)),
    ("latency", "p99_ms_at_10pct", Goal::AtMost(3.0)),
    ("latency", "p99_ms_at_50pct", Goal::AtMost(15.0)),
    ("latency", "ratio_p99_to_raw_at_10pct", Goal::AtMost(5.0)),
    ("latency", "ratio_p99_to_raw_at_50pct", Goal::AtMost(5.0)),
    ("postgres", "weir_over_native_consumer", Goal::AtLeast(0.8)),
    ("whole_path", "ratio_whole_path_to_raw", Goal::AtLeast(0.7)),
    (
        "state",
        "ratio_state_to_memory_5000_keys",
        Goal::AtLeast(0.9),
    ),
    ("front_door", "ratio_nats_door_to_http", Goal::AtLeast(1.0)),
];

/// Units a figure's name may carry, most specific first; figures are
/// charted together when they share one.
const UNITS: &[&str] = &[
    "sockets_per_1000_batches",
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
    "seconds",
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

/// Figures by bench and name, as `baseline.json` and `figures.json` hold them.
type Figures = BTreeMap<String, BTreeMap<String, f64>>;

/// The baseline file: `WEIR_BENCH_BASELINE`, or the one kept in the repository.
fn baseline_path() -> PathBuf {
    std::env::var_os("WEIR_BENCH_BASELINE")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/baseline.json"))
}

/// The accepted figures, if there is a baseline yet.
fn read_baseline(path: &Path) -> Result<Option<Figures>, String> {
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(err) => return Err(format!("{}: {err}", path.display())),
    };
    serde_json::from_str(&text)
        .map(Some)
        .map_err(|err| format!("{}:{}:{}: {err}", path.display(), err.line(), err.column()))
}

/// A figure against its baseline value: the change in percent, and whether
/// it went the wrong way by more than run-to-run noise.
fn change(name: &str, value: f64, base: f64) -> (String, bool) {
    if base == 0.0 {
        return ("—".to_string(), false);
    }
    let percent = (value - base) / base.abs() * 100.0;
    let lower_is_better = lower_is_better(name);
    let worse = if lower_is_better {
        percent > NOISE_PERCENT
    } else {
        percent < -NOISE_PERCENT
    };
    let mark = if worse { " ⚠" } else { "" };
    (format!("{percent:+.1} %{mark}"), worse)
}

/// Whether a figure is a cost (time, latency, allocations, memory, server
/// work, consumers, a ratio of a cost to its reference), which regresses
/// upwards; rates and speed-up ratios regress downwards. Work done per
/// second while idle (`kv_ops_per_host_per_sec`, watch messages, API
/// requests) is a cost although it reads as a rate.
fn lower_is_better(name: &str) -> bool {
    let work_per_second = ["kv_ops_per", "messages_per", "requests_per"];
    if work_per_second.iter().any(|work| name.contains(work)) {
        return true;
    }
    let costs = [
        "_ns",
        "_us",
        "_ms",
        "_load_s",
        "alloc",
        "kib",
        "mib",
        "_mb",
        "kv_ops",
        "messages",
        "requests",
        "consumers",
        "sockets",
        "to_native",
        "to_raw_at",
    ];
    let rates = ["per_sec", "to_limit", "_to_weir", "weir_to_raw", "r3_to_r1"];
    costs.iter().any(|cost| name.contains(cost)) && !rates.iter().any(|rate| name.contains(rate))
}

/// Changes smaller than this are within this machine's run-to-run spread.
const NOISE_PERCENT: f64 = 10.0;

fn write_report(dir: &Path) -> Result<PathBuf, String> {
    let baseline_file = baseline_path();
    let baseline = read_baseline(&baseline_file)?;
    let mut figures = Figures::new();
    let mut regressions = Vec::new();
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
        let _ = writeln!(
            report,
            "| figure | value | baseline | change |\n| --- | ---: | ---: | ---: |"
        );
        for (name, value) in &capture.figures {
            figures
                .entry(bench.to_string())
                .or_default()
                .insert(name.clone(), *value);
            let base = baseline
                .as_ref()
                .and_then(|b| b.get(*bench))
                .and_then(|b| b.get(name));
            let (base_text, change_text) = match base {
                Some(base) => {
                    let (text, worse) = change(name, *value, *base);
                    if worse {
                        regressions.push(format!("{bench} {name}: {text}"));
                    }
                    (format_value(*base), text)
                }
                None => ("—".to_string(), "new".to_string()),
            };
            let _ = writeln!(
                report,
                "| `{name}` | {} | {base_text} | {change_text} |",
                format_value(*value)
            );
            println!(
                "{bench:>18} {name:<52} {:>12} {base_text:>12} {change_text:>10}",
                format_value(*value)
            );
        }
        let _ = writeln!(report, "\n```text\n{}```", capture.text.trim_start());
    }
    if !missing.is_empty() {
        let _ = writeln!(report, "\nNot run: {}.", missing.join(", "));
    }
    let baseline_note = match (&baseline, regressions.is_empty()) {
        (None, _) => format!(
            "No baseline yet ({}): accept these figures by copying `figures.json` there.",
            baseline_file.display()
        ),
        (Some(_), true) => format!(
            "No figure is worse than the baseline ({}) by more than {NOISE_PERCENT} %.",
            baseline_file.display()
        ),
        (Some(_), false) => format!(
            "Worse than the baseline ({}) by more than {NOISE_PERCENT} %: {}.",
            baseline_file.display(),
            regressions.join("; ")
        ),
    };
    println!("{baseline_note}");
    // The summary goes first, under the machine line.
    if let Some(at) = report.find("## Targets") {
        report.insert_str(at, &format!("{baseline_note}\n\n"));
    }
    let figures_path = dir.join("figures.json");
    let figures_text =
        serde_json::to_string_pretty(&figures).map_err(|err| format!("figures.json: {err}"))?;
    std::fs::write(&figures_path, figures_text + "\n")
        .map_err(|err| format!("write {}: {err}", figures_path.display()))?;
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
