//! `GET /pty/{id}/ws?pty=0|1&since=N&takeover=1`: one client at a time, as
//! execd frames it (components/execd `pty_ws.go`):
//!
//! * server → client binary frames: `0x01` stdout, `0x02` stderr (pipe mode),
//!   `0x03` replay = 8-byte big-endian offset + the bytes from `since` on
//!   (sent once, first, when there are any);
//! * then a JSON text frame `{"type":"connected","session_id","mode":"pty"|"pipe"}`;
//! * client → server: binary `0x00` + stdin bytes, or JSON text frames
//!   `{"type":"stdin","data"}`, `{"type":"signal","signal":"SIGINT"}`,
//!   `{"type":"resize","cols","rows"}`, `{"type":"ping"}` (→ `{"type":"pong"}`),
//!   and ember's `{"type":"eof"}` (end of input: the pipe closed, or ^D typed
//!   on a terminal; `ember exec -i` sends it when its stdin ends);
//! * when the process exits: `{"type":"exit","exit_code":N}`, close 1000;
//!   a client taken over by `?takeover=1` gets close 4001 `TAKEN_OVER`.
use super::ring::Stream;
use super::session::{Attachment, PtySession};
use crate::server::App;
use axum::extract::ws::{CloseFrame, Message, WebSocket};
use bytes::{BufMut, Bytes, BytesMut};
use serde::Deserialize;
use serde_json::json;
use std::sync::Arc;
use std::time::Duration;

const BIN_STDIN: u8 = 0x00;
const BIN_STDOUT: u8 = 0x01;
const BIN_STDERR: u8 = 0x02;
const BIN_REPLAY: u8 = 0x03;
pub const CLOSE_TAKEN_OVER: u16 = 4001;
/// Keeps idle connections (and proxies between) from timing out.
const PING_EVERY: Duration = Duration::from_secs(30);

#[derive(Debug, Default, Deserialize)]
struct ClientFrame {
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    data: String,
    #[serde(default)]
    cols: u16,
    #[serde(default)]
    rows: u16,
    #[serde(default)]
    signal: String,
}

fn text(v: serde_json::Value) -> Message {
    Message::Text(v.to_string().into())
}

fn error_frame(code: &str, error: &str) -> Message {
    text(json!({"type": "error", "code": code, "error": error}))
}

fn close(code: u16, reason: &str) -> Message {
    Message::Close(Some(CloseFrame { code, reason: reason.into() }))
}

fn output(stream: Stream, data: &[u8]) -> Message {
    let mut f = BytesMut::with_capacity(1 + data.len());
    f.put_u8(if stream == Stream::Stdout { BIN_STDOUT } else { BIN_STDERR });
    f.put_slice(data);
    Message::Binary(f.freeze())
}

/// Serves one attached client until the process exits, the client leaves or
/// another client takes over.
pub async fn serve(app: App, attach: Attachment, mut socket: WebSocket, pipe_mode: bool, since: u64) {
    let session = attach.session.clone();
    let (seq, is_pty) = match session.ensure_running(&app, pipe_mode) {
        Ok(run) => run,
        Err(e) => {
            let _ = socket.send(error_frame("START_FAILED", &e)).await;
            let _ = socket.send(close(1011, "start failed")).await;
            return;
        }
    };
    let mut changed = session.subscribe();
    changed.borrow_and_update();
    let first = session.poll(since, seq);
    if !first.chunks.is_empty() {
        let mut f = BytesMut::new();
        f.put_u8(BIN_REPLAY);
        f.put_u64(first.from);
        for (_, c) in &first.chunks {
            f.put_slice(c);
        }
        if socket.send(Message::Binary(f.freeze())).await.is_err() {
            return;
        }
    }
    let mode = if is_pty { "pty" } else { "pipe" };
    if socket.send(text(json!({"type": "connected", "session_id": session.id, "mode": mode}))).await.is_err() {
        return;
    }
    let mut pos = first.next;
    let mut ping = tokio::time::interval(PING_EVERY);
    ping.tick().await;
    loop {
        changed.borrow_and_update();
        let p = session.poll(pos, seq);
        for (stream, c) in &p.chunks {
            if socket.send(output(*stream, c)).await.is_err() {
                return;
            }
        }
        pos = p.next;
        if let Some(code) = p.exit {
            let _ = socket.send(text(json!({"type": "exit", "exit_code": code}))).await;
            let _ = socket.send(close(1000, "process exited")).await;
            return;
        }
        tokio::select! {
            r = changed.changed() => if r.is_err() { return },
            m = socket.recv() => match m {
                Some(Ok(m)) => {
                    let (reply, stop) = client_message(&app, &session, m).await;
                    if let Some(reply) = reply {
                        if socket.send(reply).await.is_err() {
                            return;
                        }
                    }
                    if stop {
                        return;
                    }
                }
                // The client left (or its connection broke); the shell keeps running.
                _ => return,
            },
            _ = attach.evicted.notified() => {
                let _ = socket.send(close(CLOSE_TAKEN_OVER, "TAKEN_OVER")).await;
                return;
            }
            _ = ping.tick() => {
                if socket.send(Message::Ping(Bytes::new())).await.is_err() {
                    return;
                }
            }
        }
    }
}

/// Applies one client frame; returns what to answer, if anything, and
/// whether to end the connection (a failed stdin write, as execd does).
async fn client_message(app: &App, session: &Arc<PtySession>, m: Message) -> (Option<Message>, bool) {
    let reply = match m {
        Message::Binary(b) => match b.split_first() {
            Some((&BIN_STDIN, data)) => return stdin(session, data).await,
            // Only stdin flows client → server.
            _ => None,
        },
        Message::Text(t) => {
            // Not JSON: ignored, as execd does.
            let Ok(f) = serde_json::from_str::<ClientFrame>(t.as_str()) else { return (None, false) };
            match f.kind.as_str() {
                "stdin" => return stdin(session, f.data.as_bytes()).await,
                "signal" => {
                    session.signal(app, &f.signal);
                    None
                }
                "resize" => {
                    if f.cols > 0 && f.rows > 0 {
                        if let Err(e) = session.resize(f.cols, f.rows) {
                            eprintln!("ember-agent: pty {} resize: {e}", session.id);
                        }
                    }
                    None
                }
                "ping" => Some(text(json!({"type": "pong"}))),
                "eof" => match session.close_stdin().await {
                    Ok(()) => None,
                    Err(e) => Some(error_frame("STDIN_WRITE_FAILED", &e.to_string())),
                },
                other => Some(error_frame("INVALID_FRAME", &format!("unknown frame type {other:?}"))),
            }
        }
        // Pings are answered by the WebSocket layer; a close ends the loop via recv.
        _ => None,
    };
    (reply, false)
}

async fn stdin(session: &PtySession, data: &[u8]) -> (Option<Message>, bool) {
    match session.write_stdin(data).await {
        Ok(()) => (None, false),
        Err(e) => (Some(error_frame("STDIN_WRITE_FAILED", &e.to_string())), true),
    }
}
