//! Traces of the rows' path over OTLP/HTTP (`[traces]`): a span per
//! request at the front door, whose W3C context (`traceparent`) each of
//! its rows carries in its headers, and a `deliver` span per batch and
//! request on whichever host delivers them, child of the request's span,
//! with a child span per plugin call on the request's rows (`plugin NAME`,
//! naming the plugin, its version and world).
//! So one row is followed across hosts without a span per row. Sampling is
//! per request, decided once at the front door: an unsampled request's
//! rows carry nothing and cost nothing further.

use std::time::{Duration, SystemTime};

use opentelemetry::trace::{
    Span, SpanContext, SpanId, SpanKind, Status, TraceContextExt, TraceFlags, TraceId, TraceState,
    Tracer, TracerProvider as _,
};
use opentelemetry::{Context, KeyValue};
use opentelemetry_otlp::{Protocol, SpanExporter, WithExportConfig};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::{
    BatchConfigBuilder, BatchSpanProcessor, IdGenerator, RandomIdGenerator, SdkTracer,
    SdkTracerProvider,
};

/// The row header that carries a traced request's context.
pub const TRACEPARENT: &str = "traceparent";
/// How often batched spans go to the collector.
const EXPORT_EVERY: Duration = Duration::from_secs(1);
/// How long an export may take.
const EXPORT_TIMEOUT: Duration = Duration::from_secs(5);

#[derive(Debug, thiserror::Error)]
#[error("cannot set up the OTLP exporter for {endpoint}: {reason}")]
pub struct TracesError {
    endpoint: String,
    reason: String,
}

/// The exporter, or nothing when traces are off. Cheap to clone.
#[derive(Clone, Default)]
pub struct Traces {
    on: Option<On>,
}

#[derive(Clone)]
struct On {
    provider: SdkTracerProvider,
    tracer: SdkTracer,
    sample_percent: u64,
}

impl Traces {
    /// Exports to `endpoint` (OTLP/HTTP base URL) as `service` /
    /// `instance`, tracing `sample_percent` of the requests.
    pub fn export(
        endpoint: &str,
        service: &str,
        instance: &str,
        sample_percent: u64,
    ) -> Result<Traces, TracesError> {
        // The exporter's reqwest client has no TLS provider of its own.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let exporter = SpanExporter::builder()
            .with_http()
            .with_protocol(Protocol::HttpJson)
            .with_endpoint(format!("{endpoint}/v1/traces"))
            .with_timeout(EXPORT_TIMEOUT)
            .build()
            .map_err(|err| TracesError {
                endpoint: endpoint.to_string(),
                reason: err.to_string(),
            })?;
        let processor = BatchSpanProcessor::builder(exporter)
            .with_batch_config(
                BatchConfigBuilder::default()
                    .with_scheduled_delay(EXPORT_EVERY)
                    .build(),
            )
            .build();
        let provider = SdkTracerProvider::builder()
            .with_span_processor(processor)
            .with_resource(
                Resource::builder()
                    .with_service_name(service.to_string())
                    .with_attribute(KeyValue::new("service.instance.id", instance.to_string()))
                    .build(),
            )
            .build();
        let tracer = provider.tracer("weir");
        Ok(Traces {
            on: Some(On {
                provider,
                tracer,
                sample_percent,
            }),
        })
    }

    pub fn enabled(&self) -> bool {
        self.on.is_some()
    }

    /// Starts a request's span if it is traced: always when the producer's
    /// own `traceparent` says sampled, else `sample_percent` of the time.
    pub fn request(
        &self,
        producer: Option<&str>,
        attributes: Vec<KeyValue>,
    ) -> Option<RequestSpan> {
        let on = self.on.as_ref()?;
        let parent = producer.and_then(parse_traceparent);
        let traced = match &parent {
            Some(parent) => parent.is_sampled(),
            None => {
                let draw =
                    u128::from_be_bytes(RandomIdGenerator::default().new_trace_id().to_bytes());
                (draw % 100) < u128::from(on.sample_percent)
            }
        };
        if !traced {
            return None;
        }
        let cx = match parent {
            Some(parent) => Context::new().with_remote_span_context(parent),
            None => Context::new(),
        };
        let span = on
            .tracer
            .span_builder("ingest")
            .with_kind(SpanKind::Server)
            .with_attributes(attributes)
            .start_with_context(&on.tracer, &cx);
        let context = span.span_context();
        let traceparent = format!("00-{}-{}-01", context.trace_id(), context.span_id());
        Some(RequestSpan { span, traceparent })
    }

    /// Records that a host delivered (or settled otherwise) `attributes`'
    /// rows of the request whose context is `traceparent`, in a batch that
    /// began at `began` and ends now, through `calls`.
    pub fn delivered(
        &self,
        traceparent: &str,
        began: SystemTime,
        attributes: Vec<KeyValue>,
        calls: &[PluginCall<'_>],
    ) {
        let Some(on) = &self.on else {
            return;
        };
        let Some(parent) = parse_traceparent(traceparent) else {
            return;
        };
        let cx = Context::new().with_remote_span_context(parent);
        let span = on
            .tracer
            .span_builder("deliver")
            .with_kind(SpanKind::Consumer)
            .with_start_time(began)
            .with_attributes(attributes)
            .start_with_context(&on.tracer, &cx);
        let cx = cx.with_span(span);
        for call in calls {
            let mut child = on
                .tracer
                .span_builder(format!("plugin {}", call.name))
                .with_kind(SpanKind::Internal)
                .with_start_time(call.began)
                .with_attributes(vec![
                    KeyValue::new("weir.plugin", call.name.to_string()),
                    KeyValue::new("weir.plugin.version", call.version.to_string()),
                    KeyValue::new("weir.plugin.world", call.world.to_string()),
                    KeyValue::new("weir.rows", i64::from(call.rows)),
                ])
                .start_with_context(&on.tracer, &cx);
            if let Some(error) = call.error {
                child.set_status(Status::error(error.to_string()));
            }
            child.end_with_timestamp(call.began + call.took);
        }
        cx.span().end();
    }

    /// Sends what is batched (at a stop).
    pub fn flush(&self) {
        if let Some(on) = &self.on {
            let _ = on.provider.force_flush();
            let _ = on.provider.shutdown();
        }
    }
}

/// One plugin call on a traced request's rows, as its span shows it.
#[derive(Debug, Clone, Copy)]
pub struct PluginCall<'a> {
    pub name: &'a str,
    pub version: &'a str,
    pub world: &'a str,
    pub began: SystemTime,
    pub took: Duration,
    /// The request's rows among those the call was given.
    pub rows: u32,
    /// Why the call failed, if it did.
    pub error: Option<&'a str>,
}

/// A traced request's span, ended when the request is answered.
pub struct RequestSpan {
    span: opentelemetry_sdk::trace::Span,
    /// What each of its rows carries.
    pub traceparent: String,
}

impl RequestSpan {
    /// Ends the span with the request's answer.
    pub fn answered(mut self, status: u16, attributes: Vec<KeyValue>) {
        self.span.set_attribute(KeyValue::new(
            "http.response.status_code",
            i64::from(status),
        ));
        for attribute in attributes {
            self.span.set_attribute(attribute);
        }
        if status >= 500 {
            self.span
                .set_status(Status::error(format!("answered {status}")));
        }
        self.span.end();
    }
}

/// A W3C `traceparent` (`00-<trace id>-<span id>-<flags>`), if well formed.
pub fn parse_traceparent(text: &str) -> Option<SpanContext> {
    let mut parts = text.trim().split('-');
    let (version, trace, span, flags) =
        (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
    if version.len() != 2 || trace.len() != 32 || span.len() != 16 || flags.len() != 2 {
        return None;
    }
    let trace = TraceId::from_hex(trace)
        .ok()
        .filter(|t| *t != TraceId::INVALID)?;
    let span = SpanId::from_hex(span)
        .ok()
        .filter(|s| *s != SpanId::INVALID)?;
    let flags = u8::from_str_radix(flags, 16).ok()?;
    Some(SpanContext::new(
        trace,
        span,
        TraceFlags::new(flags),
        true,
        TraceState::default(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_a_w3c_traceparent_and_refuses_a_malformed_one() {
        let context =
            parse_traceparent("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01").unwrap();
        assert_eq!(
            context.trace_id().to_string(),
            "4bf92f3577b34da6a3ce929d0e0e4736"
        );
        assert_eq!(context.span_id().to_string(), "00f067aa0ba902b7");
        assert!(context.is_sampled() && context.is_remote());
        for bad in [
            "",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e473x-00f067aa0ba902b7-01",
        ] {
            assert!(parse_traceparent(bad).is_none(), "{bad}");
        }
    }
}
