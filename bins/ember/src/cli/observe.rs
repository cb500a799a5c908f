//! `ember serve`'s observability flags: log format, the `/ui` dashboard.
use clap::{Args, ValueEnum};
use std::path::PathBuf;

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object a line, with the request's span (and its `request_id`)
    /// on every line of a request, and a line when each span closes (its
    /// busy and idle time).
    Json,
}

#[derive(Args, Clone, Debug)]
pub struct ObserveArgs {
    /// Log line format on stderr (filter with EMBER_LOG, default `info`).
    #[arg(long, value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
    /// Serve the dashboard at /ui (behind the API key when one is set:
    /// docs/observability.md).
    #[arg(long)]
    pub ui: bool,
    /// A directory of lab and chaos reports (`*.md`, `*.json`, `*.txt`) the
    /// dashboard lists and serves; only with --ui.
    #[arg(long, value_name = "DIR", requires = "ui")]
    pub ui_reports: Option<PathBuf>,
    /// Export the request spans over OTLP/HTTP (protobuf) to
    /// URL/v1/traces, e.g. http://127.0.0.1:4318. Needs a build with the
    /// `otlp` cargo feature (off by default).
    #[arg(long, value_name = "URL")]
    pub otlp_endpoint: Option<String>,
}
