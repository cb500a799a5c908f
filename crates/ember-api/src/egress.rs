//! The egress port (18080) of a sandbox: `GET|PATCH|DELETE /policy`, answered
//! by the daemon itself, never by anything inside the sandbox (sandboxed code
//! must not be able to change its own policy).
//!
//! On a sandbox with egress networking the policy is the one enforced
//! (nftables on the node, domain rules by DNS pinning: `enforcementMode:
//! dns+nft`) and a change applies at once. On a sandbox without network
//! (loopback only) it is recorded and reported, `enforcementMode: none`: all
//! egress is blocked whatever it says.
use crate::error::ApiError;
use crate::ApiJson;
use crate::ApiState;
use axum::http::{Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use ember_types::api::{NetworkPolicy, NetworkRule, PolicyStatusResponse};

fn status(policy: NetworkPolicy, enforced: bool) -> PolicyStatusResponse {
    let mode = match (policy.default_action.as_deref(), policy.egress.is_empty()) {
        (Some("allow"), true) => "allow_all",
        (Some("allow"), false) => "allow_with_rules",
        (_, true) => "deny_all",
        (_, false) => "deny_with_rules",
    };
    PolicyStatusResponse {
        status: "ok".into(),
        mode: mode.into(),
        enforcement_mode: if enforced { "dns+nft" } else { "none" }.into(),
        reason: if enforced {
            "enforced on the node: nftables per sandbox, domain rules by pinning the addresses the node's resolver \
             answered; the host, other sandboxes and private ranges are always denied"
        } else {
            "recorded, not enforced: this sandbox has no network but loopback (created without egress), so all \
             egress is blocked regardless of this policy"
        }
        .into(),
        policy,
    }
}

/// Routes a request for the egress port; `rest` is the path after the port.
pub async fn handle(st: &ApiState, id: &str, rest: &str, req: axum::extract::Request) -> Result<Response, ApiError> {
    if rest.trim_matches('/') != "policy" {
        st.engine.get(id).await?;
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "SANDBOX::API_NOT_SUPPORTED",
            format!("egress port: /{rest} is not supported (only /policy; no credential vault)"),
        ));
    }
    let method = req.method().clone();
    let policy = match method {
        Method::GET => st.engine.egress_policy(id).await?,
        Method::PATCH => {
            let ApiJson(rules) =
                <ApiJson<Vec<NetworkRule>> as axum::extract::FromRequest<()>>::from_request(req, &()).await?;
            st.engine.patch_egress(id, rules).await?
        }
        Method::DELETE => {
            let ApiJson(targets) =
                <ApiJson<Vec<String>> as axum::extract::FromRequest<()>>::from_request(req, &()).await?;
            st.engine.delete_egress(id, targets).await?
        }
        m => {
            return Err(ApiError::new(
                StatusCode::METHOD_NOT_ALLOWED,
                "GENERAL::METHOD_NOT_ALLOWED",
                format!("{m} /policy: use GET, PATCH or DELETE"),
            ))
        }
    };
    Ok(Json(status(policy, st.engine.egress_enforced(id).await?)).into_response())
}
