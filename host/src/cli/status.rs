//! `weir status`: a host's report as tables a person reads (or as JSON),
//! once, refreshed (`--watch`), or waiting until the fleet is drained.

use std::fmt::Write as _;
use std::io::IsTerminal as _;
use std::time::Duration;

use weir::client::fetch_status_trusting;
use weir::ops::{StatusReport, known};

use super::target::HostTarget;

/// Units listed one by one up to this many; past it, only those with rows
/// or without an owner (a fleet of 1024 units is not read line by line).
const LIST_ALL_UNITS: usize = 64;
/// Usage snapshots come as usage changes and at least every 10 s (the
/// leader's slow check): one older than this is stale.
const STALE_USAGE_MS: u64 = 15_000;
/// Reasons listed, most frequent first.
const REASONS_SHOWN: usize = 10;

#[derive(clap::Args)]
pub struct StatusArgs {
    #[command(flatten)]
    host: HostTarget,
    /// Wait (up to this many seconds) until every row is settled; exits
    /// non-zero, saying why, when it is not (an unknown backlog is not 0).
    #[arg(long, value_name = "SECONDS")]
    wait_drained: Option<u64>,
    /// Print the whole report as JSON.
    #[arg(long)]
    json: bool,
    /// Print the one-line summary only.
    #[arg(long, conflicts_with = "json")]
    brief: bool,
    /// Redraw every INTERVAL seconds (default 2) until Ctrl-C.
    #[arg(long, value_name = "INTERVAL", num_args = 0..=1, default_missing_value = "2",
          conflicts_with = "wait_drained")]
    watch: Option<u64>,
    /// An admin key (every tenant's usage, where NATS is) or a tenant's
    /// key (its own usage).
    #[arg(long, env = "WEIR_STATUS_KEY")]
    key: Option<String>,
}

impl StatusArgs {
    pub async fn run(self) -> anyhow::Result<()> {
        let url = &self.host.url()?;
        let key = self.key.as_deref();
        if let Some(interval) = self.watch {
            return self.watch(url, Duration::from_secs(interval.max(1))).await;
        }
        // The wait counts from the start: the first report may take a
        // while too (NATS frozen).
        let started = tokio::time::Instant::now();
        let mut report = fetch_status_trusting(url, key, self.host.ca.as_deref()).await?;
        if let Some(seconds) = self.wait_drained {
            let deadline = started + Duration::from_secs(seconds);
            while !report.drained() {
                let left = deadline.saturating_duration_since(tokio::time::Instant::now());
                if left.is_zero() {
                    break;
                }
                tokio::time::sleep(left.min(Duration::from_millis(200))).await;
                // A report still on its way at the deadline is not waited
                // for: the last one says why it is not drained.
                match tokio::time::timeout_at(
                    deadline,
                    fetch_status_trusting(url, key, self.host.ca.as_deref()),
                )
                .await
                {
                    Ok(fetched) => report = fetched?,
                    Err(_) => break,
                }
            }
            anyhow::ensure!(
                report.drained(),
                "not drained after {seconds} s ({}): {}",
                report.not_drained_because(),
                report.summary()
            );
        }
        print!("{}", self.render(&report)?);
        Ok(())
    }

    /// Fetches and redraws until Ctrl-C; a host that does not answer is
    /// shown as such and asked again.
    async fn watch(&self, url: &str, interval: Duration) -> anyhow::Result<()> {
        let clear = std::io::stdout().is_terminal();
        // One listener for the whole watch: a Ctrl-C that comes while a
        // report is fetched or drawn is not lost.
        let mut stop = std::pin::pin!(tokio::signal::ctrl_c());
        loop {
            let fetched = tokio::select! {
                fetched = fetch_status_trusting(url, self.key.as_deref(), self.host.ca.as_deref()) => fetched,
                _ = &mut stop => return Ok(()),
            };
            let screen = match fetched {
                Ok(report) => self.render(&report)?,
                Err(err) => format!("{err}\n"),
            };
            if clear {
                // Clear the screen and go home, then draw.
                print!("\x1b[2J\x1b[H");
            }
            print!("{screen}");
            if !clear {
                println!();
            }
            tokio::select! {
                _ = tokio::time::sleep(interval) => {}
                _ = &mut stop => return Ok(()),
            }
        }
    }

    fn render(&self, report: &StatusReport) -> anyhow::Result<String> {
        Ok(if self.json {
            serde_json::to_string_pretty(report)? + "\n"
        } else if self.brief {
            report.summary() + "\n"
        } else {
            tables(report)
        })
    }
}

/// The report as a person reads it: the summary, then members, units,
/// tenants, dead letters and plugins, `?` wherever NATS did not answer.
pub fn tables(report: &StatusReport) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "{}", report.summary());
    let nats = &report.nats;
    let state = match (nats.connected, nats.answered) {
        (false, _) => "DISCONNECTED: counts and backlogs unknown (?), fleet as last seen",
        (true, false) => "connected, but did not answer in time: some counts unknown (?)",
        (true, true) => "connected",
    };
    let place = if nats.url.is_empty() {
        String::new()
    } else {
        format!(" {}", nats.url)
    };
    let embedded = if nats.embedded { " (embedded)" } else { "" };
    let _ = writeln!(out, "NATS{place}{embedded}: {state}");
    let totals = &report.totals;
    let _ = writeln!(
        out,
        "rows in the streams {}, dead letters held {}",
        known(totals.queued),
        known(report.dead_letters.held)
    );
    let rows = &report.rows;
    let _ = writeln!(
        out,
        "this host ({}): accepted {}, delivered {}, dropped {}, dead-lettered {}, retried {} since it started",
        report.fleet.me,
        rows.accepted,
        rows.delivered,
        rows.dropped,
        rows.dead_lettered,
        rows.retried
    );

    let mut members = Table::new(["MEMBER", "HTTP", "UNITS", "UP", "PLUGINS"]);
    for member in &report.fleet.members {
        let units = report
            .units
            .iter()
            .filter(|u| u.owner.as_deref() == Some(member.id.as_str()))
            .count();
        let me = if member.id == report.fleet.me {
            " *"
        } else {
            ""
        };
        let late = match (member.late, member.renewed_ms_ago) {
            (true, Some(ms)) => format!(" (late: no renewal for {})", duration(ms)),
            _ => String::new(),
        };
        let plugins = member
            .plugins
            .iter()
            .map(|(name, version)| format!("{name} {version}"))
            .collect::<Vec<_>>()
            .join(", ");
        members.row([
            format!("{}{me}{late}", member.id),
            member.http.clone(),
            units.to_string(),
            duration(member.age_ms),
            plugins,
        ]);
    }
    let _ = writeln!(out);
    out.push_str(&members.render());

    let mut units = Table::new(["UNIT", "OWNER", "PENDING", "IN FLIGHT", "OWNED FOR"]);
    let all = report.units.len() <= LIST_ALL_UNITS;
    let mut quiet = 0;
    for unit in &report.units {
        let busy = unit.pending != Some(0) || unit.ack_pending != Some(0);
        if !all && !busy && unit.owner.is_some() {
            quiet += 1;
            continue;
        }
        units.row([
            unit.consumer.clone(),
            unit.owner.clone().unwrap_or_else(|| "UNOWNED".into()),
            known(unit.pending),
            known(unit.ack_pending),
            unit.owned_for_ms.map_or_else(|| "-".into(), duration),
        ]);
    }
    let _ = writeln!(out);
    out.push_str(&units.render());
    if quiet > 0 {
        let _ = writeln!(out, "({quiet} more units owned and idle)");
    }

    let _ = writeln!(out);
    if report.tenants.is_empty() {
        let _ = writeln!(
            out,
            "tenants: none shown (an admin key shows every tenant, a tenant's key its own)"
        );
    } else {
        // Nothing in the streams: every queued figure is exactly 0, counted or not.
        match report.usage_age_ms {
            _ if report.totals.streams_empty() => {}
            Some(age) if age > STALE_USAGE_MS => {
                let _ = writeln!(
                    out,
                    "tenants' usage as of {} ago (NATS has not answered since):",
                    duration(age)
                );
            }
            None => {
                let _ = writeln!(
                    out,
                    "tenants' usage as this host saw rows accepted (the fleet's first count of the streams is due within 10 s):"
                );
            }
            Some(_) => {}
        }
        let mut tenants = Table::new(["TENANT", "QUEUED ROWS", "QUEUED BYTES", "ROWS/S"]);
        for usage in &report.tenants {
            tenants.row([
                usage.tenant.clone(),
                usage.queued_rows.to_string(),
                usage.queued_bytes.to_string(),
                usage.recent_rows.to_string(),
            ]);
        }
        out.push_str(&tenants.render());
    }

    let letters = &report.dead_letters;
    let _ = writeln!(out);
    match letters.scanned {
        None => {
            let _ = writeln!(out, "dead letters: unknown (NATS did not answer)");
        }
        Some(0) => {
            let _ = writeln!(out, "dead letters: none held");
        }
        Some(scanned) => {
            let _ = writeln!(
                out,
                "dead letters by reason (the newest {scanned} of {} held):",
                known(letters.held)
            );
            let mut reasons = Table::new(["COUNT", "PLUGIN", "REASON"]);
            for reason in letters.by_reason.iter().take(REASONS_SHOWN) {
                reasons.row([
                    reason.count.to_string(),
                    reason.plugin.clone().unwrap_or_else(|| "-".into()),
                    reason.reason.clone(),
                ]);
            }
            out.push_str(&reasons.render());
            let more = letters.by_reason.len().saturating_sub(REASONS_SHOWN);
            if more > 0 {
                let _ = writeln!(out, "({more} more reasons: --json lists them)");
            }
        }
    }

    let mut plugins = Table::new(["PLUGIN", "WORLD", "VERSION (this host)"]);
    for plugin in &report.plugins {
        plugins.row([
            plugin.name.clone(),
            plugin.world.clone(),
            plugin.version.clone(),
        ]);
    }
    let _ = writeln!(out);
    out.push_str(&plugins.render());
    for plugin in &report.plugins {
        if let Some(diff) = plugin.canary.as_ref().and_then(|c| c.shadow.as_ref()) {
            let _ = writeln!(
                out,
                "shadow of {}: {} beside {}: compared {} rows, {} differ, {} not compared (`weir plugin diff {}`)",
                plugin.name,
                plugin.canary.as_ref().map_or("?", |c| c.version.as_str()),
                plugin.version,
                diff.compared,
                diff.differing(),
                diff.skipped,
                plugin.name
            );
        } else if let Some(canary) = &plugin.canary {
            let _ = writeln!(
                out,
                "canary of {}: {} serving {} since {}\n  serving   {:<12}  {}\n  candidate {:<12}  {}",
                plugin.name,
                canary.version,
                canary.serves,
                humantime::format_rfc3339_seconds(
                    std::time::UNIX_EPOCH + std::time::Duration::from_millis(canary.started_ms)
                ),
                plugin.version,
                canary.serving.describe(),
                canary.version,
                canary.candidate.describe()
            );
        }
        if let Some(ended) = &plugin.last_canary {
            let _ = writeln!(
                out,
                "last canary of {}: {} {} ({}): {}",
                plugin.name,
                weir::reload::releases::version_of_digest(&ended.digest),
                ended.outcome.as_str(),
                ended.by,
                ended.reason
            );
        }
    }
    out
}

/// `1h 02m`, `3m 07s`, `12s`.
fn duration(ms: u64) -> String {
    let seconds = ms / 1000;
    match seconds {
        0..60 => format!("{seconds}s"),
        60..3600 => format!("{}m {:02}s", seconds / 60, seconds % 60),
        _ => format!("{}h {:02}m", seconds / 3600, seconds / 60 % 60),
    }
}

/// Left-aligned columns, two spaces apart; the last column is not padded.
struct Table<const N: usize> {
    rows: Vec<[String; N]>,
}

impl<const N: usize> Table<N> {
    fn new(header: [&str; N]) -> Table<N> {
        Table {
            rows: vec![header.map(str::to_string)],
        }
    }

    fn row(&mut self, cells: [String; N]) {
        self.rows.push(cells);
    }

    fn render(&self) -> String {
        let mut widths = [0; N];
        for row in &self.rows {
            for (width, cell) in widths.iter_mut().zip(row) {
                *width = (*width).max(cell.chars().count());
            }
        }
        let mut out = String::new();
        for row in &self.rows {
            let mut line = String::new();
            for (i, cell) in row.iter().enumerate() {
                if i + 1 < N {
                    let _ = write!(line, "{cell:<width$}  ", width = widths[i]);
                } else {
                    line.push_str(cell);
                }
            }
            let _ = writeln!(out, "{}", line.trim_end());
        }
        out
    }
}
