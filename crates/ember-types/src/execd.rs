//! Wire types of the OpenSandbox execd protocol (port 44772), which ember's
//! agent speaks natively. See `shared/docs/opensandbox-protocol.md` §3.
//!
//! Optional fields are omitted rather than sent as `null`: the OpenSandbox SDKs
//! are strict about that.
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The execd port; the daemon's proxy route `/proxy/44772/...` reaches the agent.
pub const EXECD_PORT: u16 = 44772;
/// The egress sidecar port OpenSandbox clients resolve an endpoint for.
pub const EGRESS_PORT: u16 = 18080;

/// `POST /command` body. Exactly one of `command` and `argv`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RunCommandRequest {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub argv: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub background: bool,
    /// Milliseconds; the process group is killed when it runs out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gid: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub envs: Option<BTreeMap<String, String>>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExecError {
    pub ename: String,
    pub evalue: String,
    #[serde(default)]
    pub traceback: Vec<String>,
}

/// One streamed event: a single-line JSON object followed by `\n\n`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StreamEvent {
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    /// Unix milliseconds; required by the Python SDK.
    pub timestamp: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub execution_time: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub execution_count: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub results: Option<serde_json::Map<String, serde_json::Value>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<ExecError>,
    /// ember's extension of a stdout/stderr event: the exact output bytes it
    /// stands for (terminator included), base64, sent when `text` and a
    /// newline are not them: output that is not UTF-8, a `\r`, a last line
    /// without newline, a cut long line. Clients that do not know it read
    /// `text` as before.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub raw: Option<String>,
}

impl StreamEvent {
    pub fn new(kind: &str, text: Option<String>, timestamp: i64) -> Self {
        StreamEvent {
            kind: kind.to_string(),
            text,
            timestamp,
            execution_time: None,
            execution_count: None,
            results: None,
            error: None,
            raw: None,
        }
    }

    /// Carries these exact output bytes in `raw`.
    pub fn set_raw(&mut self, bytes: &[u8]) {
        use base64::Engine as _;
        self.raw = Some(base64::engine::general_purpose::STANDARD.encode(bytes));
    }

    /// The output bytes of a stdout/stderr event: `raw` when the agent sent it,
    /// else `text` and the newline it stood before (a blank line's text is
    /// `"\n"` alone, as execd omits empty texts).
    pub fn output_bytes(&self) -> Vec<u8> {
        use base64::Engine as _;
        if let Some(b) = self.raw.as_deref().and_then(|r| base64::engine::general_purpose::STANDARD.decode(r).ok()) {
            return b;
        }
        match self.text.as_deref().unwrap_or("") {
            "\n" => b"\n".to_vec(),
            t => [t.as_bytes(), b"\n"].concat(),
        }
    }

    /// The frame as written on the wire: compact JSON and exactly two newlines.
    pub fn to_frame(&self) -> Vec<u8> {
        let mut v = serde_json::to_vec(self).expect("StreamEvent serializes");
        v.extend_from_slice(b"\n\n");
        v
    }

    /// The exit code a failed command reports in `error.evalue`.
    pub fn exit_code(&self) -> Option<i32> {
        self.error.as_ref().and_then(|e| e.evalue.trim().parse().ok())
    }
}

/// Splits a byte stream into events. Accepts both bare `{...}\n\n` frames and
/// SSE `data: {...}` lines, as the SDKs do.
#[derive(Default)]
pub struct FrameDecoder {
    buf: Vec<u8>,
}

impl FrameDecoder {
    pub fn push(&mut self, chunk: &[u8]) {
        self.buf.extend_from_slice(chunk);
    }

    /// Bytes held for a line not yet complete: a reader caps this, since a
    /// peer that never sends a newline would otherwise grow it without end.
    pub fn pending(&self) -> usize {
        self.buf.len()
    }

    /// The next complete event, or `None` until more bytes arrive. Lines that are
    /// not JSON objects (SSE comments, `event:` lines) are skipped.
    pub fn next_event(&mut self) -> Option<Result<StreamEvent, serde_json::Error>> {
        loop {
            let pos = self.buf.iter().position(|&b| b == b'\n')?;
            let line: Vec<u8> = self.buf.drain(..=pos).collect();
            let line = trim_ascii(&line);
            let line = line.strip_prefix(b"data:").map(trim_ascii).unwrap_or(line);
            if line.first() == Some(&b'{') {
                return Some(serde_json::from_slice(line));
            }
        }
    }
}

fn trim_ascii(b: &[u8]) -> &[u8] {
    let start = b.iter().position(|c| !c.is_ascii_whitespace()).unwrap_or(b.len());
    let end = b.iter().rposition(|c| !c.is_ascii_whitespace()).map_or(start, |e| e + 1);
    &b[start..end]
}

/// `GET /command/status/{id}`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CommandStatus {
    pub id: String,
    pub content: String,
    pub running: bool,
    /// `null` while running: this key is always present.
    pub exit_code: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    pub started_at: String,
    /// `null` while running: this key is always present.
    pub finished_at: Option<String>,
}

/// `FileInfo` of the file routes. `mode` is the octal digits read as decimal
/// (0o755 is sent as 755).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileInfo {
    pub path: String,
    pub size: i64,
    pub modified_at: String,
    pub created_at: String,
    pub owner: String,
    pub group: String,
    pub mode: u32,
    #[serde(rename = "type", default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
}

/// Upload metadata part and `POST /files/permissions` values.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileMetadata {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<u32>,
}

/// One move of `POST /files/mv`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RenameFileItem {
    pub src: String,
    pub dest: String,
}

/// One file's edit in `POST /files/replace`: every `old` (non-empty)
/// becomes `new`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplaceFileContentItem {
    pub old: String,
    pub new: String,
}

/// One file's result of `POST /files/replace?verbose=true`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplaceFileContentResult {
    #[serde(rename = "replacedCount")]
    pub replaced_count: u64,
}

/// The `{code, message}` body of every execd error.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorResponse {
    pub code: String,
    pub message: String,
}

/// `GET /metrics`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Metrics {
    pub cpu_count: f64,
    pub cpu_used_pct: f64,
    pub mem_total_mib: f64,
    pub mem_used_mib: f64,
    pub timestamp: i64,
}

/// Converts permission bits to execd's "octal digits as a decimal number".
pub fn mode_to_wire(bits: u32) -> u32 {
    format!("{:o}", bits & 0o7777).parse().unwrap_or(0)
}

/// Reverses [`mode_to_wire`]; `None` when a digit is not octal.
pub fn mode_from_wire(wire: u32) -> Option<u32> {
    u32::from_str_radix(&wire.to_string(), 8).ok().filter(|m| *m <= 0o7777)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_bytes_prefer_raw_and_fall_back_to_text() {
        let mut e = StreamEvent::new("stdout", Some("\u{FFFD}".into()), 1);
        assert_eq!(e.output_bytes(), "\u{FFFD}\n".as_bytes());
        e.set_raw(&[0xff, b'\r']);
        assert_eq!(e.output_bytes(), vec![0xff, b'\r']);
        let back: StreamEvent = serde_json::from_slice(&e.to_frame()).expect("frame parses");
        assert_eq!(back.output_bytes(), vec![0xff, b'\r']);
        assert_eq!(StreamEvent::new("stdout", Some("\n".into()), 1).output_bytes(), b"\n");
    }

    #[test]
    fn frames_are_single_line_json_and_two_newlines() {
        let mut e = StreamEvent::new("stdout", Some("hi".into()), 5);
        e.execution_time = None;
        let f = e.to_frame();
        assert_eq!(f, b"{\"type\":\"stdout\",\"text\":\"hi\",\"timestamp\":5}\n\n");
    }

    #[test]
    fn decoder_handles_bare_and_sse_and_split_chunks() {
        let mut d = FrameDecoder::default();
        d.push(b"{\"type\":\"init\",\"text\":\"a\",\"timestamp\":1}\n\ndata: {\"type\":\"std");
        assert_eq!(d.next_event().unwrap().unwrap().kind, "init");
        assert!(d.next_event().is_none());
        d.push(b"out\",\"text\":\"x\",\"timestamp\":2}\n\n: comment\n");
        let e = d.next_event().unwrap().unwrap();
        assert_eq!((e.kind.as_str(), e.text.as_deref()), ("stdout", Some("x")));
        assert!(d.next_event().is_none());
    }

    #[test]
    fn exit_code_comes_from_evalue() {
        let mut e = StreamEvent::new("error", None, 1);
        e.error = Some(ExecError { ename: "CommandExecError".into(), evalue: "3".into(), traceback: vec![] });
        assert_eq!(e.exit_code(), Some(3));
    }

    #[test]
    fn replace_result_uses_camel_case() {
        let r = ReplaceFileContentResult { replaced_count: 2 };
        assert_eq!(serde_json::to_string(&r).unwrap(), r#"{"replacedCount":2}"#);
    }

    #[test]
    fn modes() {
        assert_eq!(mode_to_wire(0o755), 755);
        assert_eq!(mode_from_wire(644), Some(0o644));
        assert_eq!(mode_from_wire(789), None);
    }
}
