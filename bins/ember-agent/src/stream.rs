//! execd's streaming framing (protocol §3.2): each event is one compact JSON
//! object followed by exactly two newlines, over a chunked `text/event-stream`
//! response. Also the clock helpers every event and FileInfo uses.
use axum::body::Body;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::Response;
use bytes::Bytes;
use ember_types::execd::{ExecError, StreamEvent};
use std::convert::Infallible;
use std::time::{SystemTime, UNIX_EPOCH};
use tokio::sync::mpsc;

/// Unix milliseconds now.
pub fn now_ms() -> i64 {
    unix_ms(SystemTime::now())
}

pub fn unix_ms(t: SystemTime) -> i64 {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => d.as_millis() as i64,
        Err(e) => -(e.duration().as_millis() as i64),
    }
}

/// RFC 3339 in UTC with whole seconds, the form of the spec's examples
/// (`2025-11-16T14:30:45Z`), which every client date parser accepts.
pub fn rfc3339(t: SystemTime) -> String {
    let secs = unix_ms(t).div_euclid(1000);
    time::OffsetDateTime::from_unix_timestamp(secs)
        .ok()
        .and_then(|d| d.format(&time::format_description::well_known::Rfc3339).ok())
        .unwrap_or_else(|| "1970-01-01T00:00:00Z".to_string())
}

/// An event of `kind` with an optional text, stamped now.
pub fn event(kind: &str, text: Option<String>) -> StreamEvent {
    StreamEvent::new(kind, text, now_ms())
}

pub fn error_event(ename: &str, evalue: String, traceback: Vec<String>) -> StreamEvent {
    let mut e = event("error", None);
    e.error = Some(ExecError { ename: ename.to_string(), evalue, traceback });
    e
}

pub fn frame(e: &StreamEvent) -> Bytes {
    Bytes::from(e.to_frame())
}

/// Frames any serializable value (the metrics watch stream).
pub fn json_frame<T: serde::Serialize>(v: &T) -> Bytes {
    let mut out = serde_json::to_vec(v).unwrap_or_else(|_| b"{}".to_vec());
    out.extend_from_slice(b"\n\n");
    Bytes::from(out)
}

/// A streaming response whose body is every frame sent on `rx`, ending when
/// all senders are gone. hyper writes each frame as one chunk as soon as it
/// arrives, so clients see events without buffering.
pub fn event_stream(rx: mpsc::Receiver<Bytes>) -> Response {
    // Counted while open: a checkpoint must not cut it (`quiesce`).
    let open = (rx, crate::quiesce::StreamGuard::new());
    let body = futures_util::stream::unfold(open, |(mut rx, g)| async move {
        rx.recv().await.map(|b| (Ok::<_, Infallible>(b), (rx, g)))
    });
    let mut resp = Response::new(Body::from_stream(body));
    *resp.status_mut() = StatusCode::OK;
    let h = resp.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    h.insert("x-accel-buffering", HeaderValue::from_static("no"));
    resp
}

/// A finished stream of the given frames (background commands, start
/// failures).
pub fn fixed_stream(frames: Vec<Bytes>) -> Response {
    let (tx, rx) = mpsc::channel(frames.len().max(1));
    for f in frames {
        // Cannot fail: the channel has room for every frame and rx is alive.
        let _ = tx.try_send(f);
    }
    event_stream(rx)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn rfc3339_whole_seconds_utc() {
        let t = UNIX_EPOCH + Duration::from_millis(1_700_000_000_999);
        assert_eq!(rfc3339(t), "2023-11-14T22:13:20Z");
    }

    #[test]
    fn error_frames_carry_the_evalue() {
        let f = frame(&error_event("CommandExecError", "3".into(), vec!["exit status 3".into()]));
        let s = std::str::from_utf8(&f).unwrap();
        assert!(s.ends_with("}\n\n") && !s[..s.len() - 2].contains('\n'));
        assert!(s.contains(r#""error":{"ename":"CommandExecError","evalue":"3","traceback":["exit status 3"]}"#));
    }
}
