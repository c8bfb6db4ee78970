//! `[traces]`: OpenTelemetry traces of the rows' path, exported over
//! OTLP/HTTP: a span for each request at the front door, whose context
//! every row of it carries (`traceparent`), and one for each batch of a
//! host that delivered rows of that request.

use serde::Deserialize;
use toml::Spanned;

use super::checker::Checker;
use super::keys::{Fallback, Key, Reload, keep};

/// Every request traced once traces are on.
pub const DEFAULT_TRACE_SAMPLE_PERCENT: u64 = 100;
pub const DEFAULT_TRACE_SERVICE_NAME: &str = "weir";

/// `[traces]`: the exporter is set up at start.
pub(super) const KEYS: &[Key] = &[
    Key::new(
        "traces",
        "otlp_endpoint",
        Fallback::Off,
        Reload::Restart(|n, r| keep(&mut n.traces, &r.traces)),
    ),
    Key::new(
        "traces",
        "sample_percent",
        Fallback::Count(DEFAULT_TRACE_SAMPLE_PERCENT),
        Reload::Restart(|n, r| keep(&mut n.traces, &r.traces)),
    ),
    Key::new(
        "traces",
        "service_name",
        Fallback::Text(DEFAULT_TRACE_SERVICE_NAME),
        Reload::Restart(|n, r| keep(&mut n.traces, &r.traces)),
    ),
];

/// Where traces go, if anywhere.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TracesConfig {
    /// The collector's OTLP/HTTP base URL (`http://collector:4318`); spans
    /// are posted to `<it>/v1/traces`. `None`: no traces.
    pub otlp_endpoint: Option<String>,
    /// Requests traced, in percent (a request's rows all are, or none).
    pub sample_percent: u64,
    pub service_name: String,
}

impl Default for TracesConfig {
    fn default() -> Self {
        TracesConfig {
            otlp_endpoint: None,
            sample_percent: DEFAULT_TRACE_SAMPLE_PERCENT,
            service_name: DEFAULT_TRACE_SERVICE_NAME.to_string(),
        }
    }
}

/// `[traces]` as written in the file.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawTraces {
    otlp_endpoint: Option<Spanned<String>>,
    sample_percent: Option<Spanned<u64>>,
    service_name: Option<Spanned<String>>,
}

impl Checker<'_> {
    pub(super) fn traces(&self, raw: &RawTraces) -> TracesConfig {
        let mut config = TracesConfig::default();
        if let Some(endpoint) = &raw.otlp_endpoint {
            let url = endpoint.get_ref().trim_end_matches('/');
            if url.starts_with("http://") || url.starts_with("https://") {
                config.otlp_endpoint = Some(url.to_string());
            } else {
                self.report(
                    endpoint.span().start,
                    format!(
                        "otlp_endpoint: {url:?} is not an http:// or https:// URL (the collector's OTLP/HTTP address, e.g. \"http://localhost:4318\")"
                    ),
                );
            }
        }
        if let Some(percent) = &raw.sample_percent {
            if *percent.get_ref() > 100 {
                self.report(
                    percent.span().start,
                    format!("sample_percent: {} is over 100", percent.get_ref()),
                );
            } else {
                config.sample_percent = *percent.get_ref();
            }
        }
        if let Some(name) = &raw.service_name {
            if name.get_ref().trim().is_empty() {
                self.report(name.span().start, "service_name: empty");
            } else {
                config.service_name = name.get_ref().clone();
            }
        }
        config
    }
}
