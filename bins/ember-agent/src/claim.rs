//! Claim-time binding for warm pools: `POST /ember/v1/claim`.
//!
//! A pooled sandbox is fully started before anyone asks for it; what the caller
//! asks for (env vars, the command user, an entrypoint) is bound here, once,
//! without restarting anything. Afterwards every command sees the bound env and
//! runs as the bound user by default, and the entrypoint is supervised like a
//! boot-time one: its exit ends the sandbox.
use crate::config::Identity;
use crate::error::{ApiError, ApiResult, ErrorCode, JsonBody};
use crate::server::App;
use axum::extract::State;
use axum::http::StatusCode;
use ember_sys::process::ExitKind;
use parking_lot::{Mutex, RwLock};
use std::collections::BTreeMap;
use tokio::sync::Notify;
use tokio::task::JoinHandle;

/// What a claim bound. Read by every command spawn.
#[derive(Clone, Debug, Default)]
pub struct Bound {
    pub env: BTreeMap<String, String>,
    pub identity: Option<Identity>,
    pub claimed: bool,
}

/// Shared, interior-mutable binding state. std locks: held for a copy or a
/// swap, never across an await.
#[derive(Default)]
pub struct Binding {
    pub bound: RwLock<Bound>,
    /// The running entrypoint (boot-time or claim-time); lifecycle awaits it.
    entry: Mutex<Option<JoinHandle<ExitKind>>>,
    entry_set: Notify,
    /// Opened once the secrets are written (`crate::secrets`).
    pub secrets: crate::secrets::Gate,
}

impl std::fmt::Debug for Binding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Binding").field("bound", &self.bound()).finish_non_exhaustive()
    }
}

impl Binding {
    pub fn bound(&self) -> Bound {
        self.bound.read().clone()
    }

    pub fn set_entrypoint(&self, h: JoinHandle<ExitKind>) {
        *self.entry.lock() = Some(h);
        self.entry_set.notify_one();
    }

    /// Resolves when the entrypoint (whenever it was started) exits.
    pub async fn entrypoint_exit(&self) -> ExitKind {
        loop {
            let h = self.entry.lock().take();
            match h {
                Some(h) => return h.await.unwrap_or(ExitKind::Exited(1)),
                None => self.entry_set.notified().await,
            }
        }
    }
}

#[derive(Debug, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClaimRequest {
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    #[serde(default)]
    pub entrypoint: Vec<String>,
    /// Written to `/run/secrets` before the entrypoint starts.
    #[serde(default)]
    pub secrets: ember_types::secrets::Secrets,
}

/// `POST /ember/v1/claim`: binds once; a second claim is a 409.
pub async fn claim(State(app): State<App>, JsonBody(req): JsonBody<ClaimRequest>) -> ApiResult<StatusCode> {
    if req.gid.is_some() && req.uid.is_none() {
        return Err(ApiError::bad_request("gid requires uid"));
    }
    if let Some(k) = req.env.keys().find(|k| k.is_empty() || k.contains('=') || k.starts_with("EMBER_AGENT_")) {
        return Err(ApiError::bad_request(format!("bad environment variable name {k:?}")));
    }
    {
        let mut b = app.config.binding.bound.write();
        if b.claimed {
            return Err(ApiError::new(ErrorCode::Conflict, "this sandbox was already claimed"));
        }
        b.claimed = true;
        b.env = req.env;
        if let Some(uid) = req.uid {
            b.identity = Some(Identity { uid, gid: req.gid });
        }
    }
    if !req.secrets.is_empty() {
        let (owner, secrets) = (crate::secrets::owner(&app), req.secrets);
        let dir = std::path::Path::new(ember_types::secrets::SECRETS_DIR);
        tokio::task::spawn_blocking(move || crate::secrets::write_all(dir, &secrets, owner))
            .await
            .map_err(|e| ApiError::new(ErrorCode::RuntimeError, e.to_string()))??;
    }
    app.config.binding.secrets.open();
    if !req.entrypoint.is_empty() {
        let h = crate::lifecycle::start_entrypoint(&app, req.entrypoint);
        app.config.binding.set_entrypoint(h);
    }
    Ok(StatusCode::OK)
}
