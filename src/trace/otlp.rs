//! Spans made with the OpenTelemetry SDK and sent by its OTLP exporter,
//! batched on the SDK's own thread: ending a span only queues it (2,048
//! at most; past that, spans are dropped), so a slow or unreachable
//! collector never holds up a fire, a heartbeat or a shutdown.

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use opentelemetry::trace::{
    Span as _, SpanContext, SpanId, SpanKind, Status as SpanStatus, TraceContextExt, TraceId,
    Tracer as _, TracerProvider as _,
};
use opentelemetry::{Context, KeyValue};
use opentelemetry_otlp::{Protocol, WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{
    IdGenerator, RandomIdGenerator, SdkTracer, SdkTracerProvider, SpanData, SpanExporter,
};

use super::settings::Settings;
use super::{Attempt, Ended, trace_id_bytes};

/// How long a shutdown waits for the last spans to go out.
const FLUSH_AT_SHUTDOWN: Duration = Duration::from_secs(1);

/// How often, at most, a failing export is logged.
const SAY_EVERY: Duration = Duration::from_secs(60);

/// Traces being exported.
pub(super) struct Exporting {
    provider: SdkTracerProvider,
    tracer: SdkTracer,
    /// The collector did not take the last export.
    failing: Arc<AtomicBool>,
}

impl Exporting {
    /// Starts exporting as `settings` say; an endpoint the exporter
    /// cannot use is refused, naming the variable.
    pub(super) fn start(settings: Settings) -> Result<Exporting, crate::config::ConfigError> {
        let failing = Arc::new(AtomicBool::new(false));
        let headers = settings.headers.clone();
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_http_client(super::client::Client::new(settings.timeout))
            .with_protocol(Protocol::HttpBinary)
            .with_endpoint(settings.endpoint.clone())
            .with_timeout(settings.timeout)
            .with_headers(headers)
            .build();
        let resource = Resource::builder_empty()
            .with_attributes(
                settings
                    .attributes
                    .iter()
                    .map(|(k, v)| KeyValue::new(k.clone(), v.clone())),
            )
            .with_service_name(settings.service.clone())
            .build();
        let mut builder = SdkTracerProvider::builder()
            .with_sampler(settings.sampler)
            .with_id_generator(Chosen)
            .with_resource(resource);
        let exporter = exporter.map_err(|e| crate::config::ConfigError {
            place: "OTEL_EXPORTER_OTLP_ENDPOINT".into(),
            message: format!("`{}` cannot be exported to: {e}", settings.endpoint),
        })?;
        builder = builder.with_batch_exporter(Counted {
            inner: exporter,
            failing: failing.clone(),
            said: Mutex::new(None),
            dropped: AtomicU64::new(0),
        });
        let provider = builder.build();
        let tracer = provider.tracer("scheduler");
        tracing::info!(
            endpoint = settings.endpoint,
            "exporting traces over OTLP/HTTP"
        );
        Ok(Exporting {
            provider,
            tracer,
            failing,
        })
    }

    pub(super) async fn shutdown(self: Arc<Self>) {
        let failing = self.failing.load(Ordering::Relaxed);
        // On a thread of its own, never joined: neither the runtime's end
        // nor the process's waits for an export that hangs.
        let (done, flushed) = tokio::sync::oneshot::channel();
        let provider = self.provider.clone();
        let _ = std::thread::Builder::new()
            .name("trace-shutdown".into())
            .spawn(move || {
                let _ = provider.shutdown_with_timeout(FLUSH_AT_SHUTDOWN);
                let _ = done.send(());
            });
        if !failing {
            let _ =
                tokio::time::timeout(FLUSH_AT_SHUTDOWN + Duration::from_millis(200), flushed).await;
        }
    }

    /// The span of `attempt`, from its claim on, with the claim's span
    /// under it; the trace id is the one `history` works out.
    pub(super) fn attempt(&self, attempt: &Attempt<'_>) -> AttemptSpans {
        let builder = self
            .tracer
            .span_builder(format!("attempt {}", attempt.job))
            .with_kind(SpanKind::Internal)
            .with_start_time(SystemTime::from(attempt.claim.0))
            .with_attributes([
                KeyValue::new("scheduler.job", attempt.job.to_owned()),
                KeyValue::new("scheduler.period", attempt.period.to_owned()),
                KeyValue::new("scheduler.period_key", attempt.period_key.to_owned()),
                KeyValue::new("scheduler.attempt", i64::from(attempt.attempt)),
                KeyValue::new("scheduler.trigger", attempt.trigger.as_str()),
                KeyValue::new("scheduler.owner", attempt.owner.to_owned()),
            ]);
        let id = trace_id_bytes(attempt.period_key, attempt.attempt, attempt.owner);
        NEXT_TRACE.with(|next| next.set(Some(TraceId::from_bytes(id))));
        let span = builder.start_with_context(&self.tracer, &Context::new());
        NEXT_TRACE.with(|next| next.set(None));
        let cx = Context::new().with_span(span);
        let mut claim = self
            .tracer
            .span_builder("claim")
            .with_start_time(SystemTime::from(attempt.claim.0))
            .start_with_context(&self.tracer, &cx);
        claim.end_with_timestamp(SystemTime::from(attempt.claim.1));
        AttemptSpans {
            tracer: self.tracer.clone(),
            cx,
            child: Mutex::new(None),
        }
    }
}

/// The spans of one attempt: its own (in `cx`) and the child running now.
pub(super) struct AttemptSpans {
    tracer: SdkTracer,
    cx: Context,
    child: Mutex<Option<opentelemetry_sdk::trace::Span>>,
}

/// A child span of an attempt.
#[derive(Clone, Copy)]
pub(super) enum Child {
    Action,
    Record,
}

impl AttemptSpans {
    /// Ends the child running now, if any, and starts `which`.
    pub(super) fn child(&self, which: Child) {
        let name = match which {
            Child::Action => "action",
            Child::Record => "record",
        };
        let span = self.tracer.start_with_context(name, &self.cx);
        if let Ok(mut child) = self.child.lock()
            && let Some(mut ended) = child.replace(span)
        {
            ended.end();
        }
    }

    /// The `traceparent` of the child running now (or of the attempt).
    pub(super) fn traceparent(&self) -> Option<String> {
        let child = self.child.lock().ok()?;
        let context = match child.as_ref() {
            Some(span) => span.span_context().clone(),
            None => self.cx.span().span_context().clone(),
        };
        traceparent(&context)
    }

    pub(super) fn end(&self, ended: &Ended<'_>) {
        if let Ok(mut child) = self.child.lock()
            && let Some(mut ended) = child.take()
        {
            ended.end();
        }
        let span = self.cx.span();
        if let Some(outcome) = ended.outcome {
            span.set_attribute(KeyValue::new("scheduler.outcome", outcome));
        }
        if let Some(code) = ended.exit_code {
            span.set_attribute(KeyValue::new("process.exit.code", i64::from(code)));
        }
        if let Some(code) = ended.http_status {
            span.set_attribute(KeyValue::new("http.response.status_code", i64::from(code)));
        }
        span.set_status(match (ended.outcome, ended.error) {
            (Some("succeeded"), _) => SpanStatus::Ok,
            (_, Some(error)) => SpanStatus::error(error.to_owned()),
            (outcome, None) => SpanStatus::error(outcome.unwrap_or("not run")),
        });
        span.end();
    }
}

/// The W3C `traceparent` of a span: version, trace id, span id, flags.
fn traceparent(context: &SpanContext) -> Option<String> {
    context.is_valid().then(|| {
        format!(
            "00-{}-{}-{:02x}",
            context.trace_id(),
            context.span_id(),
            context.trace_flags().to_u8()
        )
    })
}

thread_local! {
    /// The trace id the next root span started on this thread gets.
    static NEXT_TRACE: Cell<Option<TraceId>> = const { Cell::new(None) };
}

/// Ids as the SDK makes them, but an attempt's trace id chosen: set just
/// before its span starts, on the same thread, taken as it starts.
#[derive(Debug)]
struct Chosen;

impl IdGenerator for Chosen {
    fn new_trace_id(&self) -> TraceId {
        NEXT_TRACE
            .with(Cell::take)
            .unwrap_or_else(|| RandomIdGenerator::default().new_trace_id())
    }

    fn new_span_id(&self) -> SpanId {
        RandomIdGenerator::default().new_span_id()
    }
}

/// The OTLP exporter, counting what it could not send: spans dropped go
/// to `scheduler_trace_spans_dropped_total`, and a log line says so at
/// most once a minute.
#[derive(Debug)]
struct Counted {
    inner: opentelemetry_otlp::SpanExporter,
    failing: Arc<AtomicBool>,
    said: Mutex<Option<Instant>>,
    /// Dropped since the last log line.
    dropped: AtomicU64,
}

impl SpanExporter for Counted {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        let spans = batch.len() as u64;
        let result = self.inner.export(batch).await;
        self.failing.store(result.is_err(), Ordering::Relaxed);
        if let Err(e) = &result {
            metrics::counter!("scheduler_trace_spans_dropped_total").increment(spans);
            let dropped = self.dropped.fetch_add(spans, Ordering::Relaxed) + spans;
            let mut said = self.said.lock().unwrap_or_else(|e| e.into_inner());
            if said.is_none_or(|at| at.elapsed() >= SAY_EVERY) {
                *said = Some(Instant::now());
                self.dropped.store(0, Ordering::Relaxed);
                tracing::warn!(
                    dropped,
                    "traces not exported, dropped ({e}); said again at most once a minute"
                );
            }
        }
        result
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.inner.set_resource(resource);
    }
}
