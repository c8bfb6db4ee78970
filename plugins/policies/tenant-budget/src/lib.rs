//! A weir budget: caps each tenant's queued bytes and rows fleet-wide, and
//! the bytes it may send per second, with per-tenant overrides.
//!
//! Settings (all optional; a limit left out is no limit):
//!
//! ```toml
//! [plugins.budget.settings]
//! queued_bytes = 1_000_000       # rows accepted and not yet delivered, fleet-wide
//! queued_rows = 100_000
//! rate_bytes_per_sec = 5_000_000 # bytes accepted fleet-wide in the last second
//! retry_after_ms = 1000          # what a client is told when the queue is full
//!
//! [plugins.budget.settings.tenants.acme]  # one tenant's limits, over the defaults
//! queued_bytes = 10_000_000
//! ```
//!
//! `weir tenant set acme '{"queued_bytes": 0}'` writes the same keys (plus
//! `suspended`) to the coordination bucket, over both: no reload needed.
//!
//! The rate limit is a sliding one-second window over what the whole fleet
//! accepted (the host supplies it), not a bucket in this instance's memory:
//! every host holds the same figures, so the answer does not depend on which
//! host was asked.

use std::collections::BTreeMap;

use serde::Deserialize;
use weir_plugin::Budget;
use weir_plugin::budget::{Admission, Decision};

/// Limits of one tenant; a field left out keeps the value beneath it.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct Limits {
    queued_bytes: Option<u64>,
    queued_rows: Option<u64>,
    rate_bytes_per_sec: Option<u64>,
    retry_after_ms: Option<u32>,
    suspended: Option<bool>,
}

impl Limits {
    /// `over`'s values where it has them, ours elsewhere.
    fn under(&self, over: &Limits) -> Limits {
        Limits {
            queued_bytes: over.queued_bytes.or(self.queued_bytes),
            queued_rows: over.queued_rows.or(self.queued_rows),
            rate_bytes_per_sec: over.rate_bytes_per_sec.or(self.rate_bytes_per_sec),
            retry_after_ms: over.retry_after_ms.or(self.retry_after_ms),
            suspended: over.suspended.or(self.suspended),
        }
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct Settings {
    #[serde(flatten)]
    defaults: Limits,
    #[serde(default)]
    tenants: BTreeMap<String, Limits>,
}

/// Shortest throttle: a client retrying sooner would only be throttled again.
const MIN_RETRY_MS: u32 = 100;
const DEFAULT_RETRY_MS: u32 = 1_000;

/// Tenant settings parsed once per distinct JSON text, not once per request.
const MAX_CACHED_SETTINGS: usize = 10_000;

struct TenantBudget {
    settings: Settings,
    /// Each tenant settings text seen, parsed (`None`: it did not parse).
    /// Only a cache: the answer depends on the text alone, so every host
    /// still answers alike.
    parsed: BTreeMap<String, Option<Limits>>,
}

impl Budget for TenantBudget {
    fn init(settings: String) -> Result<Self, String> {
        Ok(TenantBudget {
            settings: weir_plugin::settings(&settings)?,
            parsed: BTreeMap::new(),
        })
    }

    fn admit(&mut self, request: &Admission) -> Decision {
        let mut limits = self.settings.defaults.clone();
        if let Some(over) = self.settings.tenants.get(&request.tenant) {
            limits = limits.under(over);
        }
        if let Some(json) = &request.tenant_settings
            && let Some(over) = self.tenant_limits(&request.tenant, json)
        {
            limits = limits.under(&over);
        }
        decide(&limits, request)
    }
}

impl TenantBudget {
    /// A tenant's limits from its settings in the coordination bucket; `None`
    /// (logged once) when they do not parse.
    fn tenant_limits(&mut self, tenant: &str, json: &str) -> Option<Limits> {
        if let Some(limits) = self.parsed.get(json) {
            return limits.clone();
        }
        let limits = match serde_json::from_str::<Limits>(json) {
            Ok(limits) => Some(limits),
            Err(err) => {
                weir_plugin::log::warn(&format!(
                    "tenant `{tenant}`: ignoring its settings in the coordination bucket: {err}"
                ));
                None
            }
        };
        if self.parsed.len() >= MAX_CACHED_SETTINGS {
            self.parsed.clear();
        }
        self.parsed.insert(json.to_string(), limits.clone());
        limits
    }
}

fn decide(limits: &Limits, request: &Admission) -> Decision {
    let tenant = &request.tenant;
    if limits.suspended == Some(true) {
        return Decision::Reject(format!("tenant `{tenant}` is suspended"));
    }
    let usage = &request.usage;
    let retry = limits
        .retry_after_ms
        .unwrap_or(DEFAULT_RETRY_MS)
        .max(MIN_RETRY_MS);
    let queues = [
        (
            "bytes",
            limits.queued_bytes,
            usage.queued_bytes,
            request.bytes,
        ),
        (
            "rows",
            limits.queued_rows,
            usage.queued_rows,
            u64::from(request.rows),
        ),
    ];
    for (what, limit, queued, asked) in queues {
        let Some(limit) = limit else { continue };
        if asked > limit {
            return Decision::Reject(format!(
                "the request holds {asked} {what}, more than tenant `{tenant}` may have queued ({limit}); send smaller requests"
            ));
        }
        if queued.saturating_add(asked) > limit {
            return Decision::Throttle(retry);
        }
    }
    if let Some(rate) = limits.rate_bytes_per_sec.filter(|rate| *rate > 0) {
        let allowed = rate.saturating_mul(u64::from(usage.window_ms)) / 1000;
        if request.bytes > allowed {
            return Decision::Reject(format!(
                "the request holds {} bytes, more than tenant `{tenant}` may send in {} ms ({allowed})",
                request.bytes, usage.window_ms
            ));
        }
        let excess = usage
            .recent_bytes
            .saturating_add(request.bytes)
            .saturating_sub(allowed);
        if excess > 0 {
            // The window must slide by about excess/rate before it fits.
            let wait_ms = excess.saturating_mul(1000) / rate;
            let wait_ms = u32::try_from(wait_ms).unwrap_or(u32::MAX);
            return Decision::Throttle(
                wait_ms.clamp(MIN_RETRY_MS, usage.window_ms.max(MIN_RETRY_MS)),
            );
        }
    }
    Decision::Admit
}

weir_plugin::export_budget!(TenantBudget);

#[cfg(test)]
mod tests {
    use super::*;
    use weir_plugin::budget::Usage;

    /// The decision on a request of `bytes`, with `queued` and `recent` bytes.
    fn decision(limits: &str, bytes: u64, queued: u64, recent: u64) -> String {
        let limits: Limits = serde_json::from_str(limits).unwrap();
        let request = Admission {
            tenant: "acme".into(),
            table: "orders".into(),
            rows: 10,
            bytes,
            usage: Usage {
                queued_rows: 0,
                queued_bytes: queued,
                recent_rows: 0,
                recent_bytes: recent,
                window_ms: 1000,
            },
            tenant_settings: None,
        };
        format!("{:?}", decide(&limits, &request))
    }

    fn request(tenant: &str, bytes: u64, tenant_settings: Option<&str>) -> Admission {
        Admission {
            tenant: tenant.into(),
            table: "orders".into(),
            rows: 1,
            bytes,
            usage: Usage {
                queued_rows: 0,
                queued_bytes: 0,
                recent_rows: 0,
                recent_bytes: 0,
                window_ms: 1000,
            },
            tenant_settings: tenant_settings.map(str::to_string),
        }
    }

    #[test]
    fn admit_stacks_the_tenant_overrides_and_parses_each_text_once() {
        let mut budget = TenantBudget::init(
            r#"{"queued_bytes": 1000, "tenants": {"big": {"queued_bytes": 100000}}}"#.into(),
        )
        .unwrap();
        let admitted = |decision: Decision| matches!(decision, Decision::Admit);
        assert!(!admitted(budget.admit(&request("acme", 5000, None))));
        assert!(admitted(budget.admit(&request("big", 5000, None))));
        let more = r#"{"queued_bytes": 100000}"#;
        assert!(admitted(budget.admit(&request("acme", 5000, Some(more)))));
        assert!(admitted(budget.admit(&request("acme", 5000, Some(more)))));
        // Settings that do not parse are ignored: the defaults hold.
        assert!(!admitted(budget.admit(&request("acme", 5000, Some("{")))));
        assert_eq!(budget.parsed.len(), 2);
    }

    #[test]
    fn the_queue_budget_throttles_and_an_oversized_request_is_rejected() {
        let limits = r#"{"queued_bytes": 1000, "retry_after_ms": 50}"#;
        assert_eq!(decision(limits, 100, 900, 0), "Decision::Admit");
        assert_eq!(decision(limits, 101, 900, 0), "Decision::Throttle(100)");
        let rejected = decision(limits, 1001, 0, 0);
        assert!(
            rejected.contains("more than tenant `acme` may have queued (1000)"),
            "{rejected}"
        );
    }

    #[test]
    fn the_rate_limit_waits_for_the_window_to_slide() {
        let limits = r#"{"rate_bytes_per_sec": 10000}"#;
        assert_eq!(decision(limits, 1000, 0, 9000), "Decision::Admit");
        // 2000 bytes over: the window must slide by 200 ms.
        assert_eq!(decision(limits, 1000, 0, 11_000), "Decision::Throttle(200)");
    }

    #[test]
    fn settings_are_checked_by_name() {
        let settings: Settings = weir_plugin::settings(
            r#"{"queued_bytes": 5, "tenants": {"acme": {"rate_bytes_per_sec": 9}}}"#,
        )
        .unwrap();
        assert_eq!(settings.defaults.queued_bytes, Some(5));
        assert_eq!(settings.tenants["acme"].rate_bytes_per_sec, Some(9));
        let typo = weir_plugin::settings::<Settings>(r#"{"queued_byte": 5}"#).unwrap_err();
        assert!(typo.contains("queued_byte"), "{typo}");
        let typo = weir_plugin::settings::<Settings>(r#"{"tenants": {"acme": {"sus": true}}}"#)
            .unwrap_err();
        assert!(typo.contains("sus"), "{typo}");
    }

    #[test]
    fn overrides_stack_and_suspension_rejects() {
        let base: Limits =
            serde_json::from_str(r#"{"queued_bytes": 10, "queued_rows": 5}"#).unwrap();
        let over: Limits = serde_json::from_str(r#"{"queued_bytes": 1000}"#).unwrap();
        let merged = base.under(&over);
        assert_eq!(
            (merged.queued_bytes, merged.queued_rows),
            (Some(1000), Some(5))
        );
        let suspended = decision(r#"{"suspended": true}"#, 1, 0, 0);
        assert!(
            suspended.contains("tenant `acme` is suspended"),
            "{suspended}"
        );
    }
}
