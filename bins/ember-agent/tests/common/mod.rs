//! Test harness: starts the built agent on a loopback port and speaks raw
//! HTTP/1.1 to it, so the framing the agent writes is checked byte for byte.
#![allow(dead_code)] // Each test binary uses a different subset of helpers.

use serde_json::Value;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

/// The agent binary under test.
pub const BIN: &str = env!("CARGO_BIN_EXE_ember-agent");

pub struct Agent {
    pub child: Child,
    pub port: u16,
    /// Kept open so the agent's stdout never turns into a broken pipe.
    _stdout: BufReader<ChildStdout>,
}

impl Agent {
    pub fn start() -> Agent {
        Agent::start_with(&[])
    }

    /// Starts the agent with extra environment variables.
    pub fn start_with(env: &[(&str, &str)]) -> Agent {
        let mut cmd = Command::new(BIN);
        cmd.args(["--listen", "tcp:127.0.0.1:0"]).envs(env.iter().copied());
        Agent::spawn(cmd)
    }

    /// Spawns `cmd`, which must run the agent with `--listen tcp:127.0.0.1:0`
    /// (possibly through a wrapper such as unshare), and reads its port.
    pub fn spawn(mut cmd: Command) -> Agent {
        let mut child = cmd.stdout(Stdio::piped()).stderr(Stdio::inherit()).spawn().expect("spawn ember-agent");
        let mut stdout = BufReader::new(child.stdout.take().expect("stdout"));
        let mut line = String::new();
        stdout.read_line(&mut line).expect("read the listening line");
        let port = line
            .trim()
            .strip_prefix("listening on 127.0.0.1:")
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| panic!("unexpected first line {line:?}"));
        Agent { child, port, _stdout: stdout }
    }

    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    pub fn connect(&self) -> TcpStream {
        let s = TcpStream::connect(("127.0.0.1", self.port)).expect("connect");
        s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        s
    }

    /// Sends one request with `Connection: close` and reads the whole answer.
    pub fn request(&self, method: &str, path: &str, headers: &[(&str, &str)], body: &[u8]) -> Response {
        let mut s = self.connect();
        let mut head = format!("{method} {path} HTTP/1.1\r\nHost: agent\r\nConnection: close\r\n");
        for (k, v) in headers {
            head.push_str(&format!("{k}: {v}\r\n"));
        }
        if !headers.iter().any(|(k, _)| k.eq_ignore_ascii_case("transfer-encoding")) {
            head.push_str(&format!("Content-Length: {}\r\n", body.len()));
        }
        head.push_str("\r\n");
        s.write_all(head.as_bytes()).unwrap();
        s.write_all(body).unwrap();
        read_response(&mut s)
    }

    pub fn get(&self, path: &str) -> Response {
        self.request("GET", path, &[], b"")
    }

    pub fn delete(&self, path: &str) -> Response {
        self.request("DELETE", path, &[], b"")
    }

    pub fn post_json(&self, path: &str, json: &str) -> Response {
        self.request("POST", path, &[("Content-Type", "application/json")], json.as_bytes())
    }

    /// `POST /command` and the decoded events; asserts the stream framing.
    pub fn run(&self, json: &str) -> Vec<Value> {
        let r = self.post_json("/command", json);
        assert_eq!(r.status, 200, "body: {}", r.text());
        assert_eq!(r.header("content-type"), Some("text/event-stream"));
        assert_eq!(r.header("cache-control"), Some("no-cache"));
        assert_eq!(r.header("x-accel-buffering"), Some("no"));
        assert!(r.chunked, "event streams are chunked");
        events(&r.body)
    }

    /// Polls `/command/status/{id}` until the command is no longer running.
    pub fn wait_finished(&self, id: &str) -> Value {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let s = self.get(&format!("/command/status/{id}")).json();
            if s["running"] == false || Instant::now() > deadline {
                return s;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// SIGTERM and wait for the exit code (None if it did not exit in 10 s).
    pub fn terminate(&mut self) -> Option<i32> {
        let _ = ember_sys::process::kill(self.pid(), ember_sys::process::SIGTERM);
        self.wait_exit(Duration::from_secs(10))
    }

    pub fn wait_exit(&mut self, limit: Duration) -> Option<i32> {
        let deadline = Instant::now() + limit;
        while Instant::now() < deadline {
            if let Some(st) = self.child.try_wait().unwrap() {
                return st.code();
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        None
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() && self.terminate().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

#[derive(Debug)]
pub struct Response {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    pub chunked: bool,
}

impl Response {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(k, _)| k.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {:?}", self.text()))
    }

    /// Asserts an execd error body `{code, message}` with this status and code.
    pub fn assert_error(&self, status: u16, code: &str) {
        assert_eq!(self.status, status, "body: {}", self.text());
        let v = self.json();
        assert_eq!(v["code"], code, "body: {v}");
        assert!(v["message"].as_str().is_some_and(|m| !m.is_empty()), "body: {v}");
    }
}

fn read_response(s: &mut TcpStream) -> Response {
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).expect("read response");
    parse_response(&raw)
}

/// Parses a complete HTTP/1.1 response, decoding a chunked body strictly.
pub fn parse_response(raw: &[u8]) -> Response {
    let end = find(raw, b"\r\n\r\n").unwrap_or_else(|| panic!("no header end in {:?}", String::from_utf8_lossy(raw)));
    let head = std::str::from_utf8(&raw[..end]).expect("ASCII head");
    let mut lines = head.split("\r\n");
    let status: u16 = lines.next().unwrap().split(' ').nth(1).unwrap().parse().unwrap();
    let headers: Vec<(String, String)> = lines
        .map(|l| {
            let (k, v) = l.split_once(':').expect("header line");
            (k.trim().to_string(), v.trim().to_string())
        })
        .collect();
    let rest = &raw[end + 4..];
    let chunked = headers.iter().any(|(k, v)| k.eq_ignore_ascii_case("transfer-encoding") && v == "chunked");
    let body = if chunked { decode_chunked(rest) } else { rest.to_vec() };
    if let Some((_, len)) = headers.iter().find(|(k, _)| k.eq_ignore_ascii_case("content-length")) {
        assert_eq!(len.parse::<usize>().unwrap(), body.len(), "content-length matches the body");
    }
    Response { status, headers, body, chunked }
}

/// Decodes `size\r\ndata\r\n ... 0\r\n\r\n`, panicking on any deviation.
pub fn decode_chunked(mut b: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let nl = find(b, b"\r\n").expect("chunk size line");
        let size = usize::from_str_radix(std::str::from_utf8(&b[..nl]).unwrap().trim(), 16).expect("hex size");
        b = &b[nl + 2..];
        if size == 0 {
            assert_eq!(b, b"\r\n", "chunked body ends with an empty trailer");
            return out;
        }
        out.extend_from_slice(&b[..size]);
        assert_eq!(&b[size..size + 2], b"\r\n", "chunk data ends with CRLF");
        b = &b[size + 2..];
    }
}

/// Splits an event stream into events, asserting execd's framing: compact
/// single-line JSON objects, each followed by exactly two newlines.
pub fn events(body: &[u8]) -> Vec<Value> {
    let text = std::str::from_utf8(body).expect("UTF-8 stream");
    assert!(text.ends_with("\n\n"), "stream ends with a frame terminator: {text:?}");
    text[..text.len() - 2]
        .split("\n\n")
        .map(|frame| {
            assert!(!frame.contains('\n') && frame.starts_with('{'), "bad frame {frame:?}");
            let v: Value = serde_json::from_str(frame).expect("JSON frame");
            assert!(v["timestamp"].is_i64(), "integer timestamp in {frame}");
            v
        })
        .collect()
}

pub fn kinds(events: &[Value]) -> Vec<&str> {
    events.iter().map(|e| e["type"].as_str().unwrap()).collect()
}

/// Texts of the events of one kind.
pub fn texts<'a>(events: &'a [Value], kind: &str) -> Vec<&'a str> {
    events.iter().filter(|e| e["type"] == kind).map(|e| e["text"].as_str().unwrap()).collect()
}

pub fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// Fails the test unless it runs as root: root-only tests fail loudly instead
/// of passing without testing anything (the suite runs as root, as CI does).
pub fn require_root(what: &str) {
    let uid = ember_sys::process::getuid();
    assert_eq!(uid, 0, "{what} needs root (running as uid {uid}): run the suite as root, as CI does");
}

/// Percent-encodes a query value.
pub fn enc(s: &str) -> String {
    form_urlencoded::byte_serialize(s.as_bytes()).collect()
}

/// A fresh temporary directory for one test, removed when dropped (each
/// suite run used to leave nine under /tmp).
pub fn temp_dir(name: &str) -> TempDir {
    let d = std::env::temp_dir().join(format!("ember-agent-test-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    TempDir(d)
}

/// See [`temp_dir`].
pub struct TempDir(std::path::PathBuf);

impl std::ops::Deref for TempDir {
    type Target = std::path::Path;
    fn deref(&self) -> &std::path::Path {
        &self.0
    }
}

impl AsRef<std::path::Path> for TempDir {
    fn as_ref(&self) -> &std::path::Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
