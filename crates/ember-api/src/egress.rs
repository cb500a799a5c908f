//! The egress port (18080) of a sandbox: `GET|PATCH|DELETE /policy`, answered
//! by the daemon itself, never by anything inside the sandbox (sandboxed code
//! must not be able to change its own policy).
//!
//! The policy is recorded with the sandbox and reported back; it is not
//! enforced: `enforcementMode` says `none`. A sandbox has no network but
//! loopback, so all egress is blocked whatever the policy says, until
//! ember's networking work gives sandboxes egress and enforces this.
use crate::error::ApiError;
use crate::ApiJson;
use crate::ApiState;
use axum::http::{Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use ember_types::api::{NetworkPolicy, NetworkRule, PolicyStatusResponse};

fn status(policy: NetworkPolicy) -> PolicyStatusResponse {
    let mode = match (policy.default_action.as_deref(), policy.egress.is_empty()) {
        (Some("allow"), true) => "allow_all",
        (Some("allow"), false) => "allow_with_rules",
        (_, true) => "deny_all",
        (_, false) => "deny_with_rules",
    };
    PolicyStatusResponse {
        status: "ok".into(),
        mode: mode.into(),
        enforcement_mode: "none".into(),
        reason: "recorded, not enforced: ember sandboxes have no network but loopback, so all egress is blocked \
                 regardless of this policy"
            .into(),
        policy,
    }
}

/// Routes a request for the egress port; `rest` is the path after the port.
pub async fn handle(st: &ApiState, id: &str, rest: &str, req: axum::extract::Request) -> Result<Response, ApiError> {
    if rest.trim_matches('/') != "policy" {
        st.engine.get(id)?;
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "SANDBOX::API_NOT_SUPPORTED",
            format!("egress port: /{rest} is not supported (only /policy; no credential vault)"),
        ));
    }
    let method = req.method().clone();
    let policy = match method {
        Method::GET => st.engine.egress_policy(id)?,
        Method::PATCH => {
            let ApiJson(rules) =
                <ApiJson<Vec<NetworkRule>> as axum::extract::FromRequest<()>>::from_request(req, &()).await?;
            st.engine.patch_egress(id, rules)?
        }
        Method::DELETE => {
            let ApiJson(targets) =
                <ApiJson<Vec<String>> as axum::extract::FromRequest<()>>::from_request(req, &()).await?;
            st.engine.delete_egress(id, targets)?
        }
        m => {
            return Err(ApiError::new(
                StatusCode::METHOD_NOT_ALLOWED,
                "GENERAL::METHOD_NOT_ALLOWED",
                format!("{m} /policy: use GET, PATCH or DELETE"),
            ))
        }
    };
    Ok(Json(status(policy)).into_response())
}
