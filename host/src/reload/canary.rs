//! Canaries: a pushed candidate version of a plugin that serves only some
//! tenants' rows (or units' rows) while the release keeps serving the rest.
//! Which tenants is a stable hash of plugin and tenant (or a list), so a
//! tenant's rows always see one version; which units is a list (a unit's
//! rows are one owner's at a time, so they too see one version). Each host counts what both versions did with the rows
//! it ran (rows, dead letters, traps, deadline overruns) and shares the
//! counts in `canary.<name>.<member>`; the fleet's leader (its first live
//! member, as for usage) sums them and ends the canary on its own when the
//! push gave thresholds: rolled back as soon as the candidate crosses one,
//! promoted once it stayed under them for its window.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::reload::shadow::Diff;
use crate::telemetry::{CanaryLabels, Metrics};
use crate::topology::route::Unit;

/// Key prefix of each host's counts of a canary: `canary.<name>.<member>`.
pub const TALLIES: &str = "canary.";
/// How long a host's counts stay in the bucket once it stops writing them.
pub const TALLY_TTL: Duration = Duration::from_secs(120);
/// Shares are in basis points: 10 000 is every tenant.
pub const WHOLE: u32 = 10_000;

/// Who a canary serves, and when the fleet ends it on its own.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Canary {
    /// SHA-256 (hex) of the candidate `.wasm`.
    pub digest: String,
    /// Share of tenants, in basis points (2 500 is 25 %), picked by a
    /// stable hash of plugin and tenant.
    #[serde(default)]
    pub share: u32,
    /// Tenants served whatever the share.
    #[serde(default)]
    pub tenants: Vec<String>,
    /// Units whose rows are served whatever their tenant (`--units`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub units: Vec<Unit>,
    pub started_ms: u64,
    /// Thresholds for the fleet to promote or roll back on its own.
    #[serde(default)]
    pub auto: Option<Auto>,
    /// A shadow: the candidate serves no tenant; it runs on copies of the
    /// rows the release transforms, and only the differences are kept
    /// (`reload::shadow`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub shadow: bool,
}

/// What `--promote-after`, `--max-dead-letter-rate` and `--max-trap-rate` say.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Auto {
    /// Promote once the candidate stayed under the thresholds this long;
    /// `None`: only roll back, an operator promotes.
    #[serde(default)]
    pub promote_after_ms: Option<u64>,
    /// Largest share of the candidate's rows it may dead-letter, in basis
    /// points.
    #[serde(default)]
    pub max_dead_letter_rate: Option<u32>,
    /// Largest share of the candidate's rows whose call may trap, in basis
    /// points.
    #[serde(default)]
    pub max_trap_rate: Option<u32>,
}

impl Canary {
    /// Whether plugin `name`'s candidate serves `tenant`'s rows in `unit`.
    pub fn serves(&self, name: &str, tenant: &str, unit: Unit) -> bool {
        !self.shadow
            && (self.share >= WHOLE
                || (self.share > 0 && bucket(name, tenant) < self.share)
                || self.tenants.iter().any(|t| t == tenant)
                || self.units.contains(&unit))
    }

    /// Who it serves, for people: `25% of tenants`, `tenants a, b`.
    pub fn describe(&self) -> String {
        if self.shadow {
            return "no tenant (a shadow beside the release)".to_string();
        }
        let mut parts = Vec::new();
        if self.share > 0 {
            parts.push(format!("{} of tenants", percent(self.share)));
        }
        if !self.tenants.is_empty() {
            parts.push(format!("tenants {}", self.tenants.join(", ")));
        }
        if !self.units.is_empty() {
            let units: Vec<String> = self.units.iter().map(Unit::to_string).collect();
            parts.push(format!(
                "unit{} {}",
                if units.len() == 1 { "" } else { "s" },
                units.join(", ")
            ));
        }
        match parts.is_empty() {
            true => "no tenant".to_string(),
            false => parts.join(" and "),
        }
    }
}

/// A tenant's place among plugin `name`'s tenants, 0 to [`WHOLE`]: the
/// same on every host and every weir (xxh3 of the two names, pinned by a
/// test), so a tenant stays on its side of a share.
pub fn bucket(name: &str, tenant: &str) -> u32 {
    let mut key = Vec::with_capacity(name.len() + tenant.len() + 1);
    key.extend_from_slice(name.as_bytes());
    key.push(0);
    key.extend_from_slice(tenant.as_bytes());
    (xxhash_rust::xxh3::xxh3_64(&key) % u64::from(WHOLE)) as u32
}

/// Basis points as a percentage: `25%`, `0.5%`.
pub fn percent(basis_points: u32) -> String {
    let whole = basis_points / 100;
    match basis_points % 100 {
        0 => format!("{whole}%"),
        rest if rest % 10 == 0 => format!("{whole}.{}%", rest / 10),
        rest => format!("{whole}.{rest:02}%"),
    }
}

/// Why a share or rate does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{text}` is not a percentage between 0% and 100% (such as 25%, 0.5% or 0)")]
pub struct NotAPercentage {
    pub text: String,
}

/// `25%`, `0.5%`, `0` (a bare number is a percentage too) in basis points;
/// at most two decimals.
pub fn parse_percent(text: &str) -> Result<u32, NotAPercentage> {
    let error = || NotAPercentage {
        text: text.to_string(),
    };
    let number = text.trim().strip_suffix('%').unwrap_or(text.trim()).trim();
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    let digits = |s: &str| s.chars().all(|c| c.is_ascii_digit());
    if whole.is_empty() || !digits(whole) || !digits(fraction) || fraction.len() > 2 {
        return Err(error());
    }
    let whole: u32 = whole.parse().map_err(|_| error())?;
    let fraction: u32 = format!("{fraction:0<2}").parse().map_err(|_| error())?;
    let points = whole
        .checked_mul(100)
        .and_then(|w| w.checked_add(fraction))
        .ok_or_else(error)?;
    if points > WHOLE {
        return Err(error());
    }
    Ok(points)
}

/// What one version did with the rows it ran. A row retried counts at each
/// run: rates are per call of a row, which is what a trap costs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Tally {
    pub rows: u64,
    pub dead_letters: u64,
    pub traps: u64,
    pub deadlines: u64,
}

impl Tally {
    pub fn add(&mut self, other: &Tally) {
        self.rows += other.rows;
        self.dead_letters += other.dead_letters;
        self.traps += other.traps;
        self.deadlines += other.deadlines;
    }

    /// `128 rows, 2 dead letters (1.56%), 0 traps, 0 deadline overruns`.
    pub fn describe(&self) -> String {
        let rate = |n: u64| match self.rows {
            0 => String::new(),
            rows => format!(" ({:.2}%)", n as f64 * 100.0 / rows as f64),
        };
        format!(
            "{} rows, {} dead letters{}, {} traps{}, {} deadline overruns{}",
            self.rows,
            self.dead_letters,
            rate(self.dead_letters),
            self.traps,
            rate(self.traps),
            self.deadlines,
            rate(self.deadlines)
        )
    }
}

/// One host's counts of one canary: `canary.<name>.<member>`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Report {
    /// The candidate counted, and when its canary started: counts of an
    /// earlier canary are not this one's.
    pub digest: String,
    pub started_ms: u64,
    pub serving: Tally,
    pub candidate: Tally,
    /// A shadow's differences from the release, as this host compared them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub diff: Option<Diff>,
}

/// This host's counts of every canary it runs, by plugin name; kept across
/// generations (a reload does not start a canary's counts over).
#[derive(Debug, Default)]
pub struct Counts {
    counts: Mutex<BTreeMap<String, Report>>,
    /// Where the same counts go as `weir_canary_rows_total`.
    metrics: Option<Metrics>,
}

impl Counts {
    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Report>> {
        self.counts
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Counts that also go to `metrics`.
    pub fn with_metrics(metrics: Metrics) -> Counts {
        Counts {
            counts: Mutex::default(),
            metrics: Some(metrics),
        }
    }

    /// Adds what one version (`version`: `candidate` or the serving one) of
    /// plugin `name`, under canary `canary`, did with some rows.
    pub fn add(&self, name: &str, canary: &Canary, candidate: bool, version: &str, tally: &Tally) {
        if let Some(metrics) = &self.metrics {
            let role = if candidate { "candidate" } else { "serving" };
            let outcomes = [
                ("ran", tally.rows),
                ("dead_lettered", tally.dead_letters),
                ("trapped", tally.traps),
                ("overran", tally.deadlines),
            ];
            for (outcome, count) in outcomes {
                let labels = CanaryLabels {
                    plugin: name.to_string(),
                    version: version.to_string(),
                    role,
                    outcome,
                };
                // Every outcome is served from the start, zero included.
                metrics.canary_rows.get_or_create(&labels).inc_by(count);
            }
        }
        let mut counts = self.lock();
        let report = entry(&mut counts, name, canary);
        match candidate {
            true => report.candidate.add(tally),
            false => report.serving.add(tally),
        }
    }

    /// Adds what a shadow of plugin `name` (`canary`) found comparing some
    /// rows with the release.
    pub fn add_diff(&self, name: &str, canary: &Canary, diff: &Diff) {
        let mut counts = self.lock();
        entry(&mut counts, name, canary)
            .diff
            .get_or_insert_with(Diff::default)
            .add(diff);
    }

    /// The counts of the canaries still running (`running`: name → its
    /// canary); the others are forgotten.
    pub fn reports(&self, running: &BTreeMap<String, Canary>) -> BTreeMap<String, Report> {
        let mut counts = self.lock();
        counts.retain(|name, report| {
            running
                .get(name)
                .is_some_and(|c| c.digest == report.digest && c.started_ms == report.started_ms)
        });
        counts.clone()
    }
}

/// Plugin `name`'s report of `canary`, started over if it was another's.
fn entry<'a>(
    counts: &'a mut BTreeMap<String, Report>,
    name: &str,
    canary: &Canary,
) -> &'a mut Report {
    let fresh = || Report {
        digest: canary.digest.clone(),
        started_ms: canary.started_ms,
        serving: Tally::default(),
        candidate: Tally::default(),
        diff: None,
    };
    let report = counts.entry(name.to_string()).or_insert_with(fresh);
    if report.digest != canary.digest || report.started_ms != canary.started_ms {
        *report = fresh();
    }
    report
}

/// The fleet's counts of one canary: the members' reports of it, summed.
pub fn fleet_tally<'a>(
    canary: &Canary,
    reports: impl Iterator<Item = &'a Report>,
) -> (Tally, Tally) {
    let (mut serving, mut candidate) = (Tally::default(), Tally::default());
    for report in reports.filter(|r| r.digest == canary.digest && r.started_ms == canary.started_ms)
    {
        serving.add(&report.serving);
        candidate.add(&report.candidate);
    }
    (serving, candidate)
}

/// The fleet's differences of one shadow: the members' reports of it, summed.
pub fn fleet_diff<'a>(shadow: &Canary, reports: impl Iterator<Item = &'a Report>) -> Diff {
    let mut diff = Diff::default();
    for report in reports.filter(|r| r.digest == shadow.digest && r.started_ms == shadow.started_ms)
    {
        if let Some(theirs) = &report.diff {
            diff.add(theirs);
        }
    }
    diff
}

/// How a canary ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Outcome {
    Promoted,
    RolledBack,
}

impl Outcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Promoted => "promoted",
            Outcome::RolledBack => "rolled back",
        }
    }
}

/// The last canary of a plugin, once it ended: kept in its release.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ended {
    pub digest: String,
    pub outcome: Outcome,
    /// `operator` (`weir plugin promote`/`rollback`) or `automatic`.
    pub by: String,
    pub reason: String,
    pub at_ms: u64,
}

/// A shadow once it ended: the fleet's differences as they stood then.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShadowEnded {
    /// The candidate's digest.
    pub digest: String,
    /// The release it ran beside (`None`: each host's own file).
    pub serving: Option<String>,
    pub started_ms: u64,
    pub ended_ms: u64,
    pub diff: Diff,
}

/// Rows a candidate runs before a rate limit above zero is judged (a limit
/// of zero is crossed by the first trap or dead letter).
pub const MIN_ROWS_JUDGED: u64 = 100;

/// The leader's judgement of a canary with thresholds, from the fleet's
/// counts at `now_ms`: `None` while it runs on.
pub fn judge(canary: &Canary, candidate: &Tally, now_ms: u64) -> Option<(Outcome, String)> {
    let auto = canary.auto.as_ref()?;
    let crossed = |what: &str, count: u64, limit: Option<u32>| {
        let limit = limit?;
        // A rate above zero means little over a handful of rows: one dead
        // letter in the first three is not a 33% candidate.
        if limit > 0 && candidate.rows < MIN_ROWS_JUDGED {
            return None;
        }
        // Exact in integers: count / rows > limit / WHOLE.
        let over =
            u128::from(count) * u128::from(WHOLE) > u128::from(limit) * u128::from(candidate.rows);
        (count > 0 && over).then(|| {
            format!(
                "the candidate's {what} rate {:.2}% ({count} of {} rows) is over its limit of {}",
                count as f64 * 100.0 / candidate.rows.max(1) as f64,
                candidate.rows,
                percent(limit)
            )
        })
    };
    if let Some(reason) = crossed("trap", candidate.traps, auto.max_trap_rate).or_else(|| {
        crossed(
            "dead-letter",
            candidate.dead_letters,
            auto.max_dead_letter_rate,
        )
    }) {
        return Some((Outcome::RolledBack, reason));
    }
    let window = auto.promote_after_ms?;
    (now_ms >= canary.started_ms.saturating_add(window)).then(|| {
        (
            Outcome::Promoted,
            format!(
                "the candidate stayed under its limits for {} ({})",
                humantime::format_duration(Duration::from_millis(window)),
                candidate.describe()
            ),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn canary(share: u32, tenants: &[&str], auto: Option<Auto>) -> Canary {
        Canary {
            digest: "aa".into(),
            share,
            tenants: tenants.iter().map(|t| t.to_string()).collect(),
            units: Vec::new(),
            started_ms: 1_000,
            auto,
            shadow: false,
        }
    }

    #[test]
    fn a_tenants_side_is_pinned_and_a_share_takes_about_its_share() {
        // Golden values: a rolling upgrade must not move a tenant's side.
        let golden: Vec<u32> = [
            ("validate", "acme"),
            ("validate", "tenant-0"),
            ("enrich", "acme"),
        ]
        .iter()
        .map(|(p, t)| bucket(p, t))
        .collect();
        assert_eq!(golden, [7020, 538, 5081]);
        let quarter = canary(2_500, &[], None);
        let unit = Unit {
            partition: 0,
            shard: 0,
        };
        let served = (0..10_000)
            .filter(|n| quarter.serves("validate", &format!("tenant-{n}"), unit))
            .count();
        assert!((2_300..2_700).contains(&served), "{served}");
        assert!(canary(0, &["b"], None).serves("p", "b", unit));
        assert!(!canary(0, &["b"], None).serves("p", "a", unit));
        assert!(canary(WHOLE, &[], None).serves("p", "anyone", unit));
    }

    #[test]
    fn a_canary_on_units_serves_every_tenant_there_and_no_one_elsewhere() {
        let chosen = Unit {
            partition: 1,
            shard: 2,
        };
        let other = Unit {
            partition: 2,
            shard: 1,
        };
        let on_units = Canary {
            units: vec![chosen],
            ..canary(0, &[], None)
        };
        assert!(on_units.serves("p", "a", chosen) && on_units.serves("p", "b", chosen));
        assert!(!on_units.serves("p", "a", other));
        assert_eq!(on_units.describe(), "unit 1.2");
        let both = Canary {
            units: vec![chosen, other],
            ..canary(0, &["b"], None)
        };
        assert_eq!(both.describe(), "tenants b and units 1.2, 2.1");
        // Older hosts read a canary without units, and write none.
        let text = serde_json::to_string(&canary(0, &["b"], None)).unwrap();
        assert!(!text.contains("units"), "{text}");
        let read: Canary = serde_json::from_str(&serde_json::to_string(&both).unwrap()).unwrap();
        assert_eq!(read, both);
    }

    #[test]
    fn percentages_parse_to_basis_points_or_say_what_is_wrong() {
        assert_eq!(parse_percent("25%"), Ok(2_500));
        assert_eq!(parse_percent("0.5%"), Ok(50));
        assert_eq!(parse_percent("1.25"), Ok(125));
        assert_eq!(parse_percent("0"), Ok(0));
        assert_eq!(parse_percent("100%"), Ok(WHOLE));
        for bad in ["", "%", "-1%", "101%", "1.234%", "a%", "1e2", "9999999999%"] {
            let err = parse_percent(bad).unwrap_err();
            assert!(err.to_string().contains(&format!("`{bad}`")), "{err}");
        }
        assert_eq!(percent(2_500), "25%");
        assert_eq!(percent(50), "0.5%");
        assert_eq!(percent(125), "1.25%");
    }

    #[test]
    fn the_leader_rolls_back_at_the_first_crossing_and_promotes_after_the_window() {
        let auto = Auto {
            promote_after_ms: Some(60_000),
            max_dead_letter_rate: Some(100),
            max_trap_rate: Some(0),
        };
        let canary = canary(2_500, &[], Some(auto));
        let tally = |rows, dead_letters, traps| Tally {
            rows,
            dead_letters,
            traps,
            deadlines: 0,
        };
        assert_eq!(judge(&canary, &tally(100, 1, 0), 2_000), None);
        // Too few rows to judge a rate above zero; a limit of zero is not.
        assert_eq!(judge(&canary, &tally(10, 5, 0), 2_000), None);
        assert!(judge(&canary, &tally(10, 0, 1), 2_000).is_some());
        let (outcome, reason) = judge(&canary, &tally(100, 0, 1), 2_000).unwrap();
        assert_eq!(outcome, Outcome::RolledBack);
        assert!(
            reason.contains("trap rate 1.00% (1 of 100 rows)"),
            "{reason}"
        );
        let (outcome, reason) = judge(&canary, &tally(100, 2, 0), 2_000).unwrap();
        assert_eq!(outcome, Outcome::RolledBack);
        assert!(reason.contains("dead-letter rate"), "{reason}");
        let (outcome, reason) = judge(&canary, &tally(100, 1, 0), 61_000).unwrap();
        assert_eq!(outcome, Outcome::Promoted);
        assert!(reason.contains("1m"), "{reason}");
        // No thresholds: the operator decides.
        assert_eq!(
            judge(&self::canary(2_500, &[], None), &tally(9, 9, 9), u64::MAX),
            None
        );
    }

    #[test]
    fn counts_start_over_with_a_new_canary_and_go_with_it() {
        let counts = Counts::default();
        let first = canary(2_500, &[], None);
        let one = Tally {
            rows: 1,
            ..Tally::default()
        };
        counts.add("p", &first, true, "v2", &one);
        counts.add("p", &first, false, "v1", &one);
        counts.add("p", &first, false, "v1", &one);
        let running = BTreeMap::from([("p".to_string(), first.clone())]);
        let report = &counts.reports(&running)["p"];
        assert_eq!((report.candidate.rows, report.serving.rows), (1, 2));
        let second = Canary {
            started_ms: 2_000,
            ..first
        };
        counts.add("p", &second, true, "v2", &one);
        let running = BTreeMap::from([("p".to_string(), second.clone())]);
        assert_eq!(counts.reports(&running)["p"].serving.rows, 0);
        assert!(counts.reports(&BTreeMap::new()).is_empty());
        let (_, candidate) = fleet_tally(
            &second,
            [Report {
                digest: "aa".into(),
                started_ms: 2_000,
                serving: Tally::default(),
                candidate: one,
                diff: None,
            }]
            .iter(),
        );
        assert_eq!(candidate.rows, 1);
    }
}
