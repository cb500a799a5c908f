//! `ember serve`'s log subscriber: text, or JSON lines carrying the spans
//! (`--log-format json`, docs/observability.md).
use crate::cli::LogFormat;
use tracing_subscriber::fmt::format::FmtSpan;

pub fn init(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("EMBER_LOG").unwrap_or_else(|_| "info".into());
    let fmt = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Text => fmt.try_init(),
        // Every line names its span and the spans above it (the request's
        // `request_id` among their fields); a span's close is a line too,
        // with its busy and idle time: where a slow claim spent it.
        LogFormat::Json => {
            fmt.json().with_current_span(true).with_span_list(true).with_span_events(FmtSpan::CLOSE).try_init()
        }
    };
}
