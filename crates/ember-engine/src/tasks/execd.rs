//! A task attempt's streamed `POST /command`, through the one agent client
//! (`ember_agent_client`: pinned socket, capped head, body and event lines,
//! deadlines). Here only the mapping of its outcome onto an attempt's.
use ember_agent_client::{AgentClient, AgentError, CommandEnd};
use ember_types::execd::{RunCommandRequest, StreamEvent};
use std::path::Path;
use std::time::Duration;

/// How a command ended, as the stream told it.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum ExecEnd {
    /// It ran and exited with this code.
    Exited(i32),
    /// It never started (no such file, say).
    NotStarted(String),
    /// The stream ended without a verdict: the sandbox (or its agent) died.
    Cut(String),
    /// The agent broke the protocol (a cap hit, a malformed event, no verdict
    /// by the deadline): the attempt fails with this reason and its sandbox,
    /// never kept for reuse after a failure, is removed.
    Broken(String),
}

/// How long past the command's own timeout the agent has to send the
/// verdict (it kills the command at the timeout and reports it).
const VERDICT_GRACE: Duration = Duration::from_secs(30);
/// The deadline of a command sent without a timeout of its own.
const NO_TIMEOUT_DEADLINE: Duration = Duration::from_secs(24 * 3600);

/// Runs `req` and calls `on_event` for each streamed event, in order.
pub(crate) async fn run(socket: &Path, req: &RunCommandRequest, on_event: impl FnMut(&StreamEvent)) -> ExecEnd {
    let deadline = req.timeout.map_or(NO_TIMEOUT_DEADLINE, |ms| Duration::from_millis(ms) + VERDICT_GRACE);
    match AgentClient::new(socket).run_command(req, deadline, on_event).await {
        Ok(CommandEnd::Exited(c)) => ExecEnd::Exited(c),
        Ok(CommandEnd::NotStarted(m)) => ExecEnd::NotStarted(m),
        Ok(CommandEnd::Unfinished) => ExecEnd::Cut("the command's stream ended without an exit status".into()),
        Err(e) => end_of(e),
    }
}

fn end_of(e: AgentError) -> ExecEnd {
    match e {
        AgentError::Status { status, message, .. } => {
            ExecEnd::NotStarted(format!("agent answered {status}: {message}"))
        }
        AgentError::Connect { .. } | AgentError::Http { .. } => ExecEnd::Cut(e.report()),
        _ => ExecEnd::Broken(e.report()),
    }
}
