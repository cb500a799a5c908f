//! `ember serve`'s log subscriber: text, or JSON lines carrying the spans
//! (`--log-format json`), and with the `otlp` cargo feature the same spans
//! exported over OTLP/HTTP (`--otlp-endpoint`; docs/observability.md).
use crate::cli::{LogFormat, ObserveArgs};
use tracing_subscriber::fmt::format::FmtSpan;
use tracing_subscriber::prelude::*;
use tracing_subscriber::{Layer, Registry};

type Boxed = Box<dyn Layer<Registry> + Send + Sync>;

pub fn init(args: &ObserveArgs) -> anyhow::Result<()> {
    let filter = tracing_subscriber::EnvFilter::try_from_env("EMBER_LOG").unwrap_or_else(|_| "info".into());
    let fmt = tracing_subscriber::fmt::layer().with_writer(std::io::stderr);
    // Each layer its own filter: EMBER_LOG quiets the log, not the traces.
    let fmt: Boxed = match args.log_format {
        LogFormat::Text => fmt.with_filter(filter).boxed(),
        // Every line names its span and the spans above it (the request's
        // `request_id` among their fields); a span's close is a line too,
        // with its busy and idle time: where a slow claim spent it.
        LogFormat::Json => {
            let json = fmt.json().with_current_span(true).with_span_list(true).with_span_events(FmtSpan::CLOSE);
            json.with_filter(filter).boxed()
        }
    };
    let mut layers = vec![fmt];
    if let Some(endpoint) = &args.otlp_endpoint {
        layers.push(otlp::layer(endpoint)?);
    }
    let _ = tracing_subscriber::registry().with(layers).try_init();
    Ok(())
}

/// Sends the spans not exported yet (at the daemon's stop).
pub fn flush() {
    #[cfg(feature = "otlp")]
    otlp::shutdown();
}

#[cfg(feature = "otlp")]
mod otlp {
    use super::Boxed;
    use anyhow::Context;
    use opentelemetry::trace::TracerProvider as _;
    use opentelemetry_otlp::WithExportConfig;
    use opentelemetry_sdk::trace::SdkTracerProvider;
    use tracing_subscriber::Layer;

    static PROVIDER: std::sync::OnceLock<SdkTracerProvider> = std::sync::OnceLock::new();

    /// Spans batched and posted (protobuf) to `{endpoint}/v1/traces`.
    pub fn layer(endpoint: &str) -> anyhow::Result<Boxed> {
        let url = format!("{}/v1/traces", endpoint.trim_end_matches('/'));
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_endpoint(url.clone())
            .build()
            .with_context(|| format!("--otlp-endpoint {url}"))?;
        let resource = opentelemetry_sdk::Resource::builder().with_service_name("ember").build();
        let provider = SdkTracerProvider::builder().with_batch_exporter(exporter).with_resource(resource).build();
        let tracer = provider.tracer("ember");
        let _ = PROVIDER.set(provider);
        let layer = tracing_opentelemetry::layer().with_tracer(tracer);
        Ok(layer.with_filter(tracing_subscriber::filter::LevelFilter::INFO).boxed())
    }

    pub fn shutdown() {
        if let Some(p) = PROVIDER.get() {
            let _ = p.shutdown();
        }
    }
}

#[cfg(not(feature = "otlp"))]
mod otlp {
    pub fn layer(_endpoint: &str) -> anyhow::Result<super::Boxed> {
        anyhow::bail!("--otlp-endpoint: this ember was built without the `otlp` cargo feature")
    }
}
