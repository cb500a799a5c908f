//! `POST /v1/sandboxes/{id}/tokens`: a scoped token for one sandbox's proxy
//! route (docs/tenancy.md), and what a token may reach (`allows`), which
//! `tenancy::guard` asks before any handler.
use crate::error::ApiError;
use crate::tenancy::quota_error;
use crate::{ApiPath, ApiState};
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use ember_engine::tenants::{Grant, Kind, DEFAULT_TTL_SECS, MAX_TTL_SECS};
use ember_types::execd::EXECD_PORT;
use ember_types::tenant::{CreateTokenRequest, ScopedToken, TokenScope};

/// The body is optional: none is a 900 s token for every port.
pub async fn create(
    State(st): State<ApiState>,
    ApiPath(id): ApiPath<String>,
    body: axum::body::Bytes,
) -> Result<Response, ApiError> {
    let req: CreateTokenRequest = match body.is_empty() {
        true => CreateTokenRequest::default(),
        false => {
            serde_json::from_slice(&body).map_err(|e| ApiError::bad_request(format!("invalid token request: {e}")))?
        }
    };
    let ttl = req.ttl_seconds.unwrap_or(DEFAULT_TTL_SECS);
    if !(1..=MAX_TTL_SECS).contains(&ttl) {
        return Err(ApiError::bad_request(format!("ttlSeconds {ttl}: 1 to {MAX_TTL_SECS}")));
    }
    let rec = st.engine.get(&id).await?;
    if rec.state.is_terminal() {
        let msg = format!("sandbox {id} has ended ({})", rec.state);
        return Err(ApiError::new(StatusCode::CONFLICT, "SANDBOX::NOT_RUNNING", msg));
    }
    let owner = st.tenants.owner(Kind::Sandbox, &id);
    let (token, g) = st.tenants.mint_token(&id, &owner, req.scope, ttl).await.map_err(quota_error)?;
    let out = ScopedToken { token, sandbox_id: id, scope: g.scope, expires_at_ms: g.expires_at_ms };
    Ok((StatusCode::CREATED, Json(out)).into_response())
}

/// Whether `g` opens a proxy request whose path after the sandbox id is
/// `tail` (`["proxy", port, ...]`).
pub(crate) fn allows(g: &Grant, tail: &[String]) -> bool {
    let [proxy, port, rest @ ..] = tail else { return false };
    let execd = *port == EXECD_PORT.to_string();
    let first = rest.first().map(String::as_str);
    proxy == "proxy"
        && match g.scope {
            TokenScope::All => true,
            TokenScope::Exec => execd && matches!(first, Some("command" | "session" | "pty" | "code" | "ping")),
            TokenScope::Files => {
                execd
                    && (matches!(first, Some("files" | "directories" | "ping"))
                        || rest.get(..2).is_some_and(|r| r[0] == "v1" && r[1] == "filesystem"))
            }
        }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tail(p: &str) -> Vec<String> {
        p.split('/').map(str::to_string).collect()
    }

    #[test]
    fn a_scope_opens_its_own_routes_only() {
        let g =
            |scope| Grant { sandbox: "s".into(), tenant: "t".into(), scope, expires_at_ms: 0, prefix: "est_".into() };
        let (all, exec, files) = (g(TokenScope::All), g(TokenScope::Exec), g(TokenScope::Files));
        assert!(allows(&all, &tail("proxy/8080/index.html")) && allows(&all, &tail("proxy/8080")));
        assert!(allows(&exec, &tail("proxy/44772/command")) && !allows(&exec, &tail("proxy/44772/files/upload")));
        assert!(!allows(&exec, &tail("proxy/8080/command")), "exec scope on another port");
        assert!(allows(&files, &tail("proxy/44772/files/upload")));
        assert!(allows(&files, &tail("proxy/44772/v1/filesystem/0/0/files")));
        assert!(!allows(&files, &tail("proxy/44772/command")));
        assert!(!allows(&all, &tail("pause")) && !allows(&all, &tail("tokens")), "a token is for the proxy alone");
    }
}
