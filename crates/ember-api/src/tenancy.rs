//! Who is calling and what they may touch (docs/tenancy.md). `middleware::auth`
//! resolves the key to a [`Principal`]; [`guard`] then, in one place for every
//! route: refuses a tenant the admin's routes (403), answers 404 for another
//! tenant's object before any handler acts (never 403: existence is not
//! leaked), takes a quota reservation for a create (`quota.rs`), records the
//! created object as the tenant's, and writes the call to the audit log
//! (`audit.rs`). List handlers filter with [`visible`].
mod audit;
mod quota;
mod route;

pub(crate) use quota::{tenant_error as quota_error, usage};

use crate::error::ApiError;
use crate::ApiState;
use axum::extract::{Request, State};
use axum::http::{Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use ember_engine::tenants::Kind;
use ember_types::tenant::DEFAULT_TENANT;
use route::Scope;

/// The caller of a request, in its extensions.
#[derive(Clone, Debug, PartialEq)]
pub enum Principal {
    /// The daemon's `--api-key` (`key` = "admin"), or no key on a daemon
    /// without one (`key` = "none"). Sees everything.
    Admin { key: &'static str },
    /// A tenant key: `key` is its prefix.
    Tenant { name: String, key: String },
    /// A scoped token: one sandbox's proxy route (`tokens.rs`).
    Scoped(ember_engine::tenants::Grant),
}

impl Principal {
    /// The tenant objects are created for.
    pub fn tenant(&self) -> &str {
        match self {
            Principal::Admin { .. } => DEFAULT_TENANT,
            Principal::Tenant { name, .. } => name,
            Principal::Scoped(g) => &g.tenant,
        }
    }

    fn key(&self) -> &str {
        match self {
            Principal::Admin { key } => key,
            Principal::Tenant { key, .. } => key,
            Principal::Scoped(g) => &g.prefix,
        }
    }

    /// The tenant's name when this is a tenant key.
    pub fn tenant_key(&self) -> Option<&str> {
        match self {
            Principal::Admin { .. } => None,
            Principal::Tenant { name, .. } => Some(name),
            Principal::Scoped(g) => Some(&g.tenant),
        }
    }
}

/// The principal of a request that went through `auth` (admin otherwise:
/// only routes `auth` lets by unchecked, `/health` and `/version`, lack one).
pub(crate) fn principal_of(req: &Request) -> Principal {
    req.extensions().get::<Principal>().cloned().unwrap_or(Principal::Admin { key: "none" })
}

/// `items` the caller may see: all for the admin, a tenant's own otherwise.
pub(crate) fn visible<T>(st: &ApiState, p: &Principal, kind: Kind, items: Vec<T>, id: impl Fn(&T) -> &str) -> Vec<T> {
    match p.tenant_key() {
        None => items,
        Some(t) => items.into_iter().filter(|x| st.tenants.owner(kind, id(x)) == t).collect(),
    }
}

fn not_found(kind: Kind, id: &str) -> Response {
    let (code, what) = match kind {
        Kind::Sandbox => ("SANDBOX::NOT_FOUND", "sandbox"),
        Kind::Pool => ("POOL::NOT_FOUND", "pool"),
        Kind::Workspace => ("WORKSPACE::NOT_FOUND", "workspace"),
        Kind::Task => ("TASK::NOT_FOUND", "task"),
        Kind::SandboxSnapshot | Kind::WorkspaceSnapshot => ("SNAPSHOT::NOT_FOUND", "snapshot"),
    };
    ApiError::new(StatusCode::NOT_FOUND, code, format!("{what} {id} not found")).into_response()
}

fn forbidden() -> Response {
    ApiError::new(StatusCode::FORBIDDEN, "TENANT::FORBIDDEN", "this route needs the admin key").into_response()
}

/// The most of a refused request's body read before its answer.
const DRAIN_LIMIT: usize = 2 << 20;

/// A refusal answered before any handler: the request's body is read first
/// (bounded), as the router's own fallbacks do. Answering with it unread
/// closes the connection, and a keep-alive client's next request on it fails.
pub(crate) async fn refuse(req: Request, resp: Response) -> Response {
    let _ = axum::body::to_bytes(req.into_body(), DRAIN_LIMIT).await;
    resp
}

/// Ownership, quotas and the audit record of every API request.
pub async fn guard(State(st): State<ApiState>, req: Request, next: Next) -> Response {
    let p = principal_of(&req);
    let route = route::classify(req.method(), req.uri().path());
    let (req, mut record) = audit::start(&p, &route, req).await;
    let resp = admit(&st, &p, &route, req, next).await;
    // A node-to-node call says how it is recorded (`cluster.rs`).
    if let Some(crate::cluster::AuditAs(action)) = resp.extensions().get() {
        match action {
            Some(a) => record.iter_mut().for_each(|r| r.action.clone_from(a)),
            None => record = None,
        }
    }
    if let Some(r) = record.as_mut() {
        audit::finish(&st, r, resp.status());
    }
    resp
}

async fn admit(st: &ApiState, p: &Principal, route: &route::Route, req: Request, next: Next) -> Response {
    if let Principal::Scoped(g) = p {
        return scoped(st, g, route, req, next).await;
    }
    let Some(tenant) = p.tenant_key() else {
        let resp = next.run(req).await;
        forget_deleted(st, route, resp.status().is_success()).await;
        return resp;
    };
    match &route.scope {
        Scope::Open => next.run(req).await,
        Scope::AdminOnly => refuse(req, forbidden()).await,
        Scope::Object(kind, id) if st.tenants.owner(*kind, id) != tenant => refuse(req, not_found(*kind, id)).await,
        Scope::Object(..) | Scope::Create(_) => match quota::run(st, tenant, route, req, next).await {
            Ok(resp) => {
                forget_deleted(st, route, resp.status().is_success()).await;
                resp
            }
            Err(e) => e.into_response(),
        },
    }
}

fn out_of_scope() -> Response {
    ApiError::new(StatusCode::FORBIDDEN, "TOKEN::OUT_OF_SCOPE", "outside this token's scope").into_response()
}

/// A scoped token: its sandbox's proxy route, within its scope, while the
/// sandbox has not ended; another sandbox is a 404, anything else a 403.
async fn scoped(
    st: &ApiState,
    g: &ember_engine::tenants::Grant,
    route: &route::Route,
    req: Request,
    next: Next,
) -> Response {
    let Scope::Object(Kind::Sandbox, id) = &route.scope else { return refuse(req, out_of_scope()).await };
    match token_reaches(st, g, id, &route.tail).await {
        Ok(()) => next.run(req).await,
        Err(refused) => refuse(req, refused).await,
    }
}

async fn token_reaches(
    st: &ApiState,
    g: &ember_engine::tenants::Grant,
    id: &str,
    tail: &[String],
) -> Result<(), Response> {
    if id != g.sandbox {
        return Err(not_found(Kind::Sandbox, id));
    }
    if !crate::tokens::allows(g, tail) {
        return Err(out_of_scope());
    }
    match st.engine.get(id).await {
        Ok(r) if !r.state.is_terminal() => Ok(()),
        _ => {
            st.tenants.drop_tokens(id).await;
            let msg = format!("sandbox {id} has ended: its tokens with it");
            Err(ApiError::new(StatusCode::UNAUTHORIZED, "INVALID_API_KEY", msg).into_response())
        }
    }
}

/// A call to sandbox `id`'s `port` from outside the API's routes (a
/// sandbox origin, agent-sandbox's router), `path` being what it asks of
/// the port: the proxy route's check ([`reaches_sandbox`]), then `forward`,
/// and the audit record that route's call would have (the action and path
/// named as on `/v1/sandboxes/{id}/proxy/{port}/{path}`).
pub(crate) async fn outside_call<F, Fut>(
    st: &ApiState,
    p: &Principal,
    (id, port, path): (&str, u16, &str),
    req: Request,
    forward: F,
) -> Response
where
    F: FnOnce(Request) -> Fut,
    Fut: std::future::Future<Output = Response>,
{
    let as_api = format!("/v1/sandboxes/{id}/proxy/{port}/{}", path.trim_start_matches('/'));
    let route = route::classify(req.method(), &as_api);
    let (req, mut record) = audit::start(p, &route, req).await;
    let resp = match reaches_sandbox(st, p, id, &route.tail).await {
        Ok(()) => forward(req).await,
        Err(refused) => refuse(req, refused).await,
    };
    if let Some(r) = record.as_mut() {
        r.path = as_api;
        audit::finish(st, r, resp.status());
    }
    resp
}

/// Whether `p` sees sandbox `id` at all (its own, its token's, or the admin).
pub(crate) fn sees_sandbox(st: &ApiState, p: &Principal, id: &str) -> bool {
    match p {
        Principal::Admin { .. } => true,
        Principal::Tenant { name, .. } => st.tenants.owner(Kind::Sandbox, id) == *name,
        Principal::Scoped(g) => g.sandbox == id,
    }
}

/// A request the key check refused (401): its body read, as [`refuse`]
/// does, and the call in the audit log when it would change something,
/// naming only the public part of the credential presented.
pub(crate) async fn unauthorized(st: &ApiState, req: Request, resp: Response) -> Response {
    let route = route::classify(req.method(), req.uri().path());
    let record = audit::unauthorized(&route, &req);
    let resp = refuse(req, resp).await;
    if let Some(mut r) = record {
        audit::finish(st, &mut r, resp.status());
    }
    resp
}

/// Whether `p` may reach sandbox `id` at `tail` (`["proxy", port, path...]`)
/// from outside the API's routes (a sandbox origin, agent-sandbox's router),
/// by the guard's rule for the proxy route: the admin always, a tenant its
/// own sandboxes (another's is a 404), a token its sandbox within its scope.
pub(crate) async fn reaches_sandbox(st: &ApiState, p: &Principal, id: &str, tail: &[String]) -> Result<(), Response> {
    match p {
        Principal::Admin { .. } => Ok(()),
        Principal::Tenant { name, .. } if st.tenants.owner(Kind::Sandbox, id) == *name => Ok(()),
        Principal::Tenant { .. } => Err(not_found(Kind::Sandbox, id)),
        Principal::Scoped(g) => token_reaches(st, g, id, tail).await,
    }
}

/// A deleted object's owner entry goes with it (a name may be reused); a
/// removed sandbox's use of a cluster's quota is given back before the
/// answer, so a create through any node sees the slot free.
async fn forget_deleted(st: &ApiState, route: &route::Route, succeeded: bool) {
    if let (Scope::Object(kind, id), true) = (&route.scope, route.method == Method::DELETE && route.tail.is_empty()) {
        if succeeded {
            if *kind == Kind::Sandbox {
                st.tenants.drop_tokens(id).await;
            }
            let owner = st.tenants.owner(*kind, id);
            if let Err(e) = st.tenants.set_owner(*kind, id, DEFAULT_TENANT).await {
                tracing::warn!(error = %e, %id, "dropping a deleted object's owner");
            }
            if *kind == Kind::Sandbox && owner != DEFAULT_TENANT {
                st.tenants.released(&owner, id).await;
            }
        }
    }
}
