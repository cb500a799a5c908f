//! Interactive sessions through the proxy route: execd PTY sessions (`POST
//! /pty`, then a WebSocket on `/pty/{id}/ws`, framed as the agent's
//! `pty/ws.rs` documents), and the entrypoint's output (`/command/entrypoint/...`).
use crate::execd::proxy;
use crate::{read_body, Client, ClientError};
use bytes::Bytes;
use ember_types::execd::CommandStatus;
use futures_util::{SinkExt, StreamExt};
use hyper::Method;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::tungstenite::Message;

/// The agent's command id of the entrypoint (`lifecycle.rs`).
const ENTRYPOINT: &str = "entrypoint";

/// What a PTY session's process does, as the client sees it.
#[derive(Debug, PartialEq, Eq)]
pub enum PtyEvent {
    /// Output (the terminal's, or stdout on pipes).
    Stdout(Bytes),
    /// Stderr (pipe mode only).
    Stderr(Bytes),
    /// The process exited with this code; the server closes next.
    Exit(i32),
    /// The connection ended without an exit: `code`/`reason` of the close
    /// (4001 `TAKEN_OVER`: another client took the session over).
    Closed { code: u16, reason: String },
}

type Ws = tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// One attached client of a PTY session.
pub struct PtyConnection {
    ws: Ws,
    path: String,
}

impl Client {
    /// `POST /pty`: a new session whose process starts when the first client
    /// connects. `command` is run by the sandbox's shell (`sh -c`); `None`:
    /// an interactive login shell.
    pub async fn create_pty(&self, id: &str, command: Option<&str>, cwd: Option<&str>) -> Result<String, ClientError> {
        let path = proxy(id, "/pty");
        let body = serde_json::json!({ "command": command, "cwd": cwd }).to_string();
        let resp = self.send(Method::POST, &path, body.into(), Some("application/json")).await?;
        let resp = Self::check(&path, resp).await?;
        let v: serde_json::Value = serde_json::from_slice(&read_body(&path, resp).await?)
            .map_err(|e| ClientError::Protocol { path: path.clone(), message: e.to_string() })?;
        v["session_id"]
            .as_str()
            .map(str::to_string)
            .ok_or_else(|| ClientError::Protocol { path, message: "no session_id in the answer".into() })
    }

    /// How much output a session has produced so far (`GET /pty/{sid}`).
    pub async fn pty_offset(&self, id: &str, session: &str) -> Result<u64, ClientError> {
        let path = proxy(id, &format!("/pty/{session}"));
        let (v, _): (serde_json::Value, _) = self.json(Method::GET, &path, None).await?;
        Ok(v["output_offset"].as_u64().unwrap_or(0))
    }

    /// `DELETE /pty/{sid}`: kills the session's process group.
    pub async fn delete_pty(&self, id: &str, session: &str) -> Result<(), ClientError> {
        let path = proxy(id, &format!("/pty/{session}"));
        let resp = self.send(Method::DELETE, &path, Bytes::new(), None).await?;
        Self::check(&path, resp).await.map(|_| ())
    }

    /// Attaches to a session: `terminal` false runs its process on pipes
    /// (stdout and stderr apart); output is replayed from byte `since`.
    /// `takeover` evicts a client already attached.
    pub async fn connect_pty(
        &self,
        id: &str,
        session: &str,
        terminal: bool,
        since: u64,
        takeover: bool,
    ) -> Result<PtyConnection, ClientError> {
        let q = format!("pty={}&since={since}{}", u8::from(terminal), if takeover { "&takeover=1" } else { "" });
        let path = proxy(id, &format!("/pty/{session}/ws?{q}"));
        let url = format!("{}{path}", self.base.replacen("http://", "ws://", 1));
        let proto = |message: String| ClientError::Protocol { path: path.clone(), message };
        let mut req = url.as_str().into_client_request().map_err(|e| proto(e.to_string()))?;
        if let Some(k) = &self.api_key {
            let v = k.parse().map_err(|_| proto("the API key is not a valid header value".into()))?;
            req.headers_mut().insert("open-sandbox-api-key", v);
        }
        let (ws, _) = tokio_tungstenite::connect_async(req).await.map_err(|e| match e {
            tokio_tungstenite::tungstenite::Error::Http(r) => {
                let body = r.body().as_deref().map(String::from_utf8_lossy).unwrap_or_default().into_owned();
                let (code, message) = serde_json::from_str::<ember_types::api::ErrorBody>(&body)
                    .map_or_else(|_| ("HTTP".to_string(), body), |b| (b.code, b.message));
                ClientError::Api { status: r.status().as_u16(), code, message }
            }
            other => ClientError::Connect { url: self.base.clone(), message: other.to_string() },
        })?;
        Ok(PtyConnection { ws, path })
    }

    /// The entrypoint's output after line `cursor` (all the agent keeps if
    /// `None`) and the cursor to read on from.
    pub async fn entrypoint_logs(&self, id: &str, cursor: Option<u64>) -> Result<(String, u64), ClientError> {
        let q = cursor.map(|c| format!("?cursor={c}")).unwrap_or_default();
        let path = proxy(id, &format!("/command/{ENTRYPOINT}/logs{q}"));
        let resp = self.send(Method::GET, &path, Bytes::new(), None).await?;
        let resp = Self::check(&path, resp).await?;
        let next = resp.headers().get("execd-commands-tail-cursor").and_then(|v| v.to_str().ok()?.parse().ok());
        let text = read_body(&path, resp).await?;
        Ok((String::from_utf8_lossy(&text).into_owned(), next.unwrap_or(0)))
    }

    /// Whether the entrypoint still runs, and its exit code once it ended.
    pub async fn entrypoint_status(&self, id: &str) -> Result<CommandStatus, ClientError> {
        Ok(self.json(Method::GET, &proxy(id, &format!("/command/status/{ENTRYPOINT}")), None).await?.0)
    }

    /// `GET /v1/sandboxes/{id}/stats`.
    pub async fn stats(&self, id: &str) -> Result<ember_types::SandboxStats, ClientError> {
        Ok(self.json(Method::GET, &format!("/v1/sandboxes/{id}/stats"), None).await?.0)
    }
}

impl PtyConnection {
    fn broken(&self, e: impl std::fmt::Display) -> ClientError {
        ClientError::Protocol { path: self.path.clone(), message: e.to_string() }
    }

    async fn send(&mut self, m: Message) -> Result<(), ClientError> {
        let r = self.ws.send(m).await;
        r.map_err(|e| self.broken(e))
    }

    /// Input for the process (binary frame `0x00` + bytes).
    pub async fn stdin(&mut self, data: &[u8]) -> Result<(), ClientError> {
        let mut f = Vec::with_capacity(1 + data.len());
        f.push(0);
        f.extend_from_slice(data);
        self.send(Message::Binary(f.into())).await
    }

    /// End of input: the process's stdin closes (pipes) or ^D is typed.
    pub async fn eof(&mut self) -> Result<(), ClientError> {
        self.send(Message::Text(r#"{"type":"eof"}"#.into())).await
    }

    pub async fn resize(&mut self, cols: u16, rows: u16) -> Result<(), ClientError> {
        let f = serde_json::json!({"type": "resize", "cols": cols, "rows": rows}).to_string();
        self.send(Message::Text(f.into())).await
    }

    /// Leaves the session; its process keeps running.
    pub async fn detach(mut self) {
        let _ = self.ws.close(Some(CloseFrame { code: 1000.into(), reason: "detached".into() })).await;
    }

    /// The next thing that happened. Cancel-safe (usable in `select!`).
    pub async fn next(&mut self) -> Result<PtyEvent, ClientError> {
        loop {
            let m = match self.ws.next().await {
                Some(Ok(m)) => m,
                Some(Err(e)) => return Err(self.broken(e)),
                None => return Ok(PtyEvent::Closed { code: 1006, reason: "connection lost".into() }),
            };
            match m {
                Message::Binary(b) => match b.first() {
                    // 0x03 = replay: 8-byte offset, then the bytes.
                    Some(3) if b.len() >= 9 => return Ok(PtyEvent::Stdout(b.slice(9..))),
                    Some(1) => return Ok(PtyEvent::Stdout(b.slice(1..))),
                    Some(2) => return Ok(PtyEvent::Stderr(b.slice(1..))),
                    _ => {}
                },
                Message::Text(t) => {
                    let v: serde_json::Value = serde_json::from_str(t.as_str()).unwrap_or_default();
                    match v["type"].as_str() {
                        Some("exit") => return Ok(PtyEvent::Exit(v["exit_code"].as_i64().unwrap_or(-1) as i32)),
                        Some("error") => return Err(self.broken(format!("{}: {}", v["code"], v["error"]))),
                        _ => {}
                    }
                }
                Message::Close(f) => {
                    let (code, reason) = f.map_or((1005, String::new()), |f| (f.code.into(), f.reason.to_string()));
                    return Ok(PtyEvent::Closed { code, reason });
                }
                _ => {}
            }
        }
    }
}
