//! The claim path: pop an idle sandbox, bind the caller's request to it through
//! its agent, persist, answer. No namespace, mount, cgroup or network is
//! created here; the only disk write is the sandbox's small record (fsynced),
//! which must land before the answer so a restart can never return a claimed
//! sandbox to the pool. A record that cannot be written ends the sandbox: it
//! was bound to this caller, who is told the claim failed.
use super::Pool;
use crate::record::{now_ms, LaunchRecord, SandboxRecord};
use crate::{Control, Engine, EngineError};
use ember_types::{SandboxSpec, SandboxState, TerminationReason};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

impl Engine {
    /// Claims an idle sandbox of `pool` for `spec`; `Ok(None)` on a miss.
    pub(crate) async fn claim(
        self: &Arc<Self>,
        pool: &Arc<Pool>,
        spec: &SandboxSpec,
        image_uri: Option<String>,
        workspaces: &[crate::WorkspaceRequest],
        t0: Instant,
    ) -> Result<Option<SandboxRecord>, EngineError> {
        while let Some(id) = pool.pop_idle() {
            let Ok(entry) = self.entry(id.as_str()) else { continue };
            let r = entry.snapshot();
            if !r.pooled || r.state != SandboxState::Running {
                continue;
            }
            // Workspaces first: the entrypoint may need them. A refused lease
            // is the caller's error; the sandbox goes back, unclaimed.
            let mounted = match self.attach_workspaces(&r, workspaces).await {
                Ok(m) => m,
                Err(e) => {
                    if matches!(e, EngineError::Workspace(_)) {
                        pool.idle.lock().unwrap_or_else(|p| p.into_inner()).push_front(id);
                    } else {
                        // A mount that failed half-way: this sandbox is not clean.
                        let (done, _) = tokio::sync::oneshot::channel();
                        let _ = entry
                            .ctl
                            .try_send(Control::Stop { reason: TerminationReason::RuntimeError(e.to_string()), done });
                    }
                    return Err(e);
                }
            };
            let body = serde_json::json!({
                "env": spec.env,
                "uid": spec.user.uid,
                "gid": spec.user.gid,
                "entrypoint": spec.entrypoint,
            });
            if let Err(e) = bind(&entry.agent_socket, &body.to_string()).await {
                self.release_leases(id.as_str(), &mounted);
                tracing::warn!(sandbox = %id, error = %e, "pooled sandbox refused its claim; discarding it");
                let (done, _) = tokio::sync::oneshot::channel();
                let _ = entry.ctl.try_send(Control::Stop { reason: TerminationReason::RuntimeError(e), done });
                continue;
            }
            let micros = t0.elapsed().as_micros() as u64;
            let now = now_ms();
            let saved = self.update_persisted(&entry, |r| {
                r.pooled = false;
                r.workspaces = mounted.clone();
                r.spec.env = spec.env.clone();
                r.spec.metadata = spec.metadata.clone();
                r.spec.entrypoint = spec.entrypoint.clone();
                r.spec.user = spec.user;
                r.spec.ttl_secs = spec.ttl_secs;
                r.image_uri = image_uri.clone();
                r.created_at_ms = now;
                r.expires_at_ms = spec.ttl_secs.map(|t| now + t as i64 * 1000);
                r.launch = Some(LaunchRecord { kind: "warm".into(), micros, phases: Default::default() });
            });
            let rec = match saved {
                Ok(rec) => rec,
                Err(e) => {
                    self.release_leases(id.as_str(), &mounted);
                    let (done, _) = tokio::sync::oneshot::channel();
                    let reason = TerminationReason::RuntimeError(format!("claim not recorded: {e}"));
                    let _ = entry.ctl.try_send(Control::Stop { reason, done });
                    return Err(e);
                }
            };
            entry.wake.notify_one();
            pool.record_claim();
            self.observe_launch(&rec.spec, "warm", micros);
            return Ok(Some(rec));
        }
        pool.record_miss();
        Ok(None)
    }
}

/// `POST /ember/v1/claim` to the agent over its unix socket. A minimal HTTP/1.1
/// exchange: the agent is ours, the reply is still untrusted, so only the
/// status line is read, with a size cap and a timeout.
async fn bind(socket: &Path, body: &str) -> Result<(), String> {
    let exchange = async {
        let mut s = crate::connect_agent(socket).await.map_err(|e| format!("connect: {e}"))?;
        let req = format!(
            "POST /ember/v1/claim HTTP/1.1\r\nHost: agent\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        );
        s.write_all(req.as_bytes()).await.map_err(|e| format!("write: {e}"))?;
        let mut buf = [0u8; 256];
        let mut n = 0;
        while n < 12 {
            let r = s.read(&mut buf[n..]).await.map_err(|e| format!("read: {e}"))?;
            if r == 0 {
                break;
            }
            n += r;
        }
        let head = String::from_utf8_lossy(&buf[..n]).into_owned();
        match head.split_whitespace().nth(1) {
            Some("200") => Ok(()),
            _ => Err(format!("agent answered {:?}", head.lines().next().unwrap_or(""))),
        }
    };
    tokio::time::timeout(Duration::from_secs(5), exchange)
        .await
        .map_err(|_| "agent did not answer the claim".to_string())?
}
