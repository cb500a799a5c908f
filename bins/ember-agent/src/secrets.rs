//! `POST /ember/v1/secrets` (and the `secrets` of a claim): each value written
//! to `/run/secrets/<name>`, mode 0400, owned by the sandbox's default user,
//! on the tmpfs the launch mounted there. The agent refuses to write them
//! anywhere else (not a tmpfs: they could reach the writable layer and a
//! snapshot), never keeps them, and never puts them in an error or a log.
use crate::error::{ApiError, ApiResult, ErrorCode, JsonBody};
use crate::server::App;
use axum::extract::State;
use axum::http::StatusCode;
use ember_types::secrets::{Secrets, SECRETS_DIR};
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SecretsRequest {
    pub secrets: Secrets,
}

/// Lets a boot-time entrypoint wait for the secrets its create asked for.
pub struct Gate(tokio::sync::watch::Sender<bool>);

impl Default for Gate {
    fn default() -> Self {
        Gate(tokio::sync::watch::channel(false).0)
    }
}

impl Gate {
    pub fn open(&self) {
        self.0.send_replace(true);
    }

    pub async fn opened(&self) {
        let _ = self.0.subscribe().wait_for(|open| *open).await;
    }
}

/// `POST /ember/v1/secrets`.
pub async fn deliver(State(app): State<App>, JsonBody(req): JsonBody<SecretsRequest>) -> ApiResult<StatusCode> {
    let owner = owner(&app);
    let secrets = req.secrets;
    tokio::task::spawn_blocking(move || write_all(Path::new(SECRETS_DIR), &secrets, owner))
        .await
        .map_err(|e| ApiError::new(ErrorCode::RuntimeError, e.to_string()))??;
    app.config.binding.secrets.open();
    Ok(StatusCode::OK)
}

/// The files' owner: the identity a claim bound, else the sandbox's default.
pub fn owner(app: &App) -> (u32, u32) {
    let ident = app.config.binding.bound().identity.or(app.config.default_identity);
    ident.map_or((0, 0), |i| (i.uid, i.gid.unwrap_or(i.uid)))
}

/// Writes every secret as a new file in `dir` (which must be a tmpfs).
pub fn write_all(dir: &Path, secrets: &Secrets, (uid, gid): (u32, u32)) -> ApiResult<()> {
    secrets.validate().map_err(|e| ApiError::bad_request(e.to_string()))?;
    if secrets.is_empty() {
        return Ok(());
    }
    let failed = |what: &str, name: &str, e: std::io::Error| {
        ApiError::new(ErrorCode::RuntimeError, format!("{what} {}/{name}: {e}", dir.display()))
    };
    match ember_sys::fs::is_tmpfs(dir) {
        Ok(true) => {}
        Ok(false) => return Err(ApiError::new(ErrorCode::RuntimeError, format!("{} is not a tmpfs", dir.display()))),
        Err(e) => return Err(ApiError::new(ErrorCode::RuntimeError, e.to_string())),
    }
    for (name, value) in &secrets.0 {
        // Names are single path components (validated above); `create_new`
        // (O_EXCL) never follows a symlink planted under the name.
        let path = dir.join(name);
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o400)
            .open(&path)
            .map_err(|e| failed("create", name, e))?;
        std::os::unix::fs::fchown(&f, Some(uid), Some(gid)).map_err(|e| failed("chown", name, e))?;
        f.write_all(value.as_bytes()).map_err(|e| failed("write", name, e))?;
    }
    Ok(())
}
