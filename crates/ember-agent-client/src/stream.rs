//! A streamed `POST /command`: the agent answers 200 and then one JSON event
//! per line (`ember_types::execd::StreamEvent`) until the command's verdict.
use crate::{AgentClient, AgentError, MAX_FRAME};
use ember_types::execd::{FrameDecoder, RunCommandRequest, StreamEvent};
use http_body_util::BodyExt;
use hyper::Method;
use std::time::Duration;

/// How a command's stream ended, as the agent told it.
#[derive(Debug, PartialEq, Eq)]
pub enum CommandEnd {
    /// It ran and exited with this code.
    Exited(i32),
    /// It never started (no such file, say): the agent's message.
    NotStarted(String),
    /// The stream closed without a verdict: the sandbox (or its agent) died.
    Unfinished,
}

impl AgentClient {
    /// Runs `req` and calls `on_event` for each event, in order. The head must
    /// come within the client's deadline and the verdict within `deadline`
    /// (the command's own timeout plus a grace: the agent enforces the
    /// timeout, a peer that is not our agent might not). A non-200 reply is
    /// [`AgentError::Status`].
    pub async fn run_command(
        &self,
        req: &RunCommandRequest,
        deadline: Duration,
        mut on_event: impl FnMut(&StreamEvent),
    ) -> Result<CommandEnd, AgentError> {
        let body = serde_json::to_vec(req).map_err(|source| self.err_encode(source))?;
        let head = tokio::time::timeout(self.timeout, self.send(Method::POST, "/command", Some(body)));
        let (resp, _conn) = head.await.map_err(|_| self.err_timeout("reply head"))??;
        if resp.status() != hyper::StatusCode::OK {
            let status = resp.status().as_u16();
            let body = tokio::time::timeout(self.timeout, self.read_body(resp.into_body()));
            let body = body.await.map_err(|_| self.err_timeout("error reply"))??;
            return self.expect_success(crate::Reply { status, body }).map(|_| CommandEnd::Unfinished);
        }
        let mut body = resp.into_body();
        let stream = async {
            let mut frames = FrameDecoder::default();
            while let Some(frame) = body.frame().await {
                let frame = frame.map_err(|e| self.err_http("event stream", e))?;
                let Ok(data) = frame.into_data() else { continue };
                frames.push(&data);
                while let Some(ev) = frames.next_event() {
                    let ev = ev.map_err(|source| AgentError::BadEvent { path: self.socket.clone(), source })?;
                    on_event(&ev);
                    if let Some(end) = verdict(ev) {
                        return Ok(end);
                    }
                }
                if frames.pending() > MAX_FRAME {
                    return Err(AgentError::FrameTooLarge { path: self.socket.clone() });
                }
            }
            Ok(CommandEnd::Unfinished)
        };
        tokio::time::timeout(deadline, stream).await.map_err(|_| AgentError::Timeout {
            path: self.socket.clone(),
            step: "command verdict",
            timeout: deadline,
        })?
    }
}

/// The end a terminal event tells, if it is one.
fn verdict(ev: StreamEvent) -> Option<CommandEnd> {
    match ev.kind.as_str() {
        "execution_complete" => Some(CommandEnd::Exited(0)),
        "error" => Some(match ev.exit_code() {
            Some(c) => CommandEnd::Exited(c),
            None => CommandEnd::NotStarted(ev.error.map(|e| e.evalue).unwrap_or_default()),
        }),
        _ => None,
    }
}
