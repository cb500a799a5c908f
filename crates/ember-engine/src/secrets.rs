//! Delivery of a sandbox's secrets: the values go from the create request to
//! the sandbox's agent (`POST /ember/v1/secrets`, or inside the claim body of
//! a warm claim), which writes `/run/secrets/<name>` on the tmpfs its launch
//! mounted. Nothing here keeps them: no record, no log line, no error carries
//! a value (`Secrets`' `Debug` prints names only).
use crate::sandbox::Sandboxes;
use crate::{EngineError, SandboxRecord};
use ember_agent_client::AgentClient;
use ember_types::secrets::Secrets;
use std::path::Path;
use std::time::Duration;

/// How long an agent has to write its secrets.
const DELIVERY_TIMEOUT: Duration = Duration::from_secs(5);

/// Writes `secrets` into a running sandbox through its agent.
pub(crate) async fn deliver(socket: &Path, secrets: &Secrets) -> Result<(), String> {
    let client = AgentClient::new(socket).with_timeout(DELIVERY_TIMEOUT);
    let body = serde_json::json!({ "secrets": secrets });
    let reply = client.post_json("/ember/v1/secrets", &body).await.map_err(|e| e.report())?;
    client.expect_success(reply).map(drop).map_err(|e| e.report())
}

/// A cold start's (or a restore's) delivery: a sandbox that cannot get its
/// secrets is removed, and the create fails naming it.
pub(crate) async fn deliver_or_remove(
    sandboxes: &Sandboxes,
    rec: SandboxRecord,
    secrets: &Secrets,
) -> Result<SandboxRecord, EngineError> {
    if secrets.is_empty() {
        return Ok(rec);
    }
    let socket = sandboxes.entry(rec.id.as_str())?.agent_socket.clone();
    if let Err(e) = deliver(&socket, secrets).await {
        let _ = sandboxes.remove(rec.id.as_str()).await;
        return Err(EngineError::Internal(format!("sandbox {}: its secrets could not be written: {e}", rec.id)));
    }
    Ok(rec)
}
