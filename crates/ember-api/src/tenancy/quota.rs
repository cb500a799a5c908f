//! A tenant's call that names its own object or creates one: the quota
//! reservation before the handler runs, the created objects recorded as the
//! tenant's after (`Tenants::complete`, so the reservation becomes the
//! counted object without a gap).
use super::route::{Route, Scope};
use crate::error::ApiError;
use crate::ApiState;
use axum::body::{to_bytes, Body};
use axum::extract::Request;
use axum::http::{Method, StatusCode};
use axum::middleware::Next;
use axum::response::Response;
use ember_engine::tenants::{Counted, Demand, Kind};
use ember_engine::{EngineError, ListFilter, SandboxSnapshotState, SnapshotFilter, TenantError};
use ember_types::limits::MAX_FORK_COUNT;
use ember_types::tenant::Usage;
use ember_types::Resources;
use serde_json::Value;
use std::collections::HashSet;

/// The most of a create's body read here (the handlers' own cap is larger
/// only for uploads, which no create is).
const MAX_BODY: usize = 1 << 20;
/// The most of a create's answer read to learn the created ids.
const MAX_ANSWER: usize = 4 << 20;

pub(crate) fn tenant_error(e: TenantError) -> ApiError {
    use TenantError as T;
    let status = match &e {
        T::QuotaExceeded { .. } => {
            return ApiError::new(StatusCode::TOO_MANY_REQUESTS, "QUOTA::EXCEEDED", e.to_string())
        }
        T::NotFound(_) | T::KeyNotFound { .. } => (StatusCode::NOT_FOUND, "TENANT::NOT_FOUND"),
        T::Exists(_) => (StatusCode::CONFLICT, "TENANT::EXISTS"),
        T::InvalidName(_) => (StatusCode::BAD_REQUEST, "TENANT::INVALID_NAME"),
        T::Store(_) => (StatusCode::INTERNAL_SERVER_ERROR, "TENANT::STORE"),
        // Never a pass: the cluster's count could not be taken or kept.
        T::Cluster { .. } | T::Shared { .. } => (StatusCode::SERVICE_UNAVAILABLE, "CLUSTER::BUSY"),
    };
    ApiError::new(status.0, status.1, e.to_string())
}

/// What `tenant` holds now: its sandboxes that have not ended (with their
/// memory and cpu limits) and its pools' sizes. On a cluster its sandboxes
/// are counted by the cluster's ledger, wherever they run.
pub(crate) async fn usage(st: &ApiState, tenant: &str) -> Result<Usage, EngineError> {
    Ok(counted(st, tenant).await?.usage)
}

/// [`usage`], and the objects it counted besides the sandboxes (owner
/// keys): a cluster ledger's hold of a create that has made its object
/// counts until the object is among them.
pub(crate) async fn counted(st: &ApiState, tenant: &str) -> Result<Counted, EngineError> {
    let mut c = Counted::default();
    let sandboxes: HashSet<String> = st.tenants.owned(Kind::Sandbox, tenant).into_iter().collect();
    let u = &mut c.usage;
    if let Some(shared) = st.tenants.shared() {
        let n = shared.usage(tenant).await.map_err(|e| EngineError::Internal(e.to_string()))?;
        (u.running_sandboxes, u.memory_bytes, u.cpu_millis) = (n.running_sandboxes, n.memory_bytes, n.cpu_millis);
    } else if !sandboxes.is_empty() {
        for r in st.engine.list(&ListFilter::default()).await? {
            if sandboxes.contains(r.id.as_str()) && !r.state.is_terminal() {
                u.running_sandboxes += 1;
                u.memory_bytes += r.spec.resources.memory_bytes;
                u.cpu_millis += r.spec.resources.cpu_millis;
            }
        }
    }
    let workspaces: HashSet<String> = st.tenants.owned(Kind::Workspace, tenant).into_iter().collect();
    if !workspaces.is_empty() {
        for w in st.engine.list_workspaces().await? {
            if workspaces.contains(&w.meta.name) {
                c.usage.workspace_bytes += w.meta.size_bytes;
                c.objects.insert(Kind::Workspace.key(&w.meta.name));
            }
        }
    }
    let tasks: HashSet<String> = st.tenants.owned(Kind::Task, tenant).into_iter().collect();
    if !tasks.is_empty() {
        for t in st.engine.list_tasks(&Default::default()).await? {
            if tasks.contains(&t.id) && !t.state.is_terminal() {
                c.usage.tasks += 1;
                c.objects.insert(Kind::Task.key(&t.id));
            }
        }
    }
    let pools: HashSet<String> = st.tenants.owned(Kind::Pool, tenant).into_iter().collect();
    if !pools.is_empty() {
        for p in st.engine.list_pools().await? {
            if pools.contains(&p.spec.name) {
                c.usage.pool_size += u64::from(p.spec.max);
                c.objects.insert(Kind::Pool.key(&p.spec.name));
            }
        }
    }
    snapshot_bytes(st, tenant, &mut c).await?;
    Ok(c)
}

/// The bytes of `tenant`'s snapshots: a sandbox snapshot's layer once it is
/// made (while it is made, its sandbox's disk limit, which the layer cannot
/// pass), a workspace snapshot's file bytes. Logical bytes, before the
/// store's dedup and compression: what the tenant snapshotted.
async fn snapshot_bytes(st: &ApiState, tenant: &str, c: &mut Counted) -> Result<(), EngineError> {
    let owned: HashSet<String> = st.tenants.owned(Kind::SandboxSnapshot, tenant).into_iter().collect();
    if !owned.is_empty() {
        for s in st.engine.list_sandbox_snapshots(&SnapshotFilter::default()).await? {
            if owned.contains(&s.id) {
                c.usage.snapshot_bytes += match s.state {
                    SandboxSnapshotState::Ready => s.layer_bytes,
                    SandboxSnapshotState::Creating => s.spec.resources.disk_bytes.max(1),
                    SandboxSnapshotState::Failed | SandboxSnapshotState::Deleting => 0,
                };
                c.objects.insert(Kind::SandboxSnapshot.key(&s.id));
            }
        }
    }
    let owned: HashSet<String> = st.tenants.owned(Kind::WorkspaceSnapshot, tenant).into_iter().collect();
    if !owned.is_empty() {
        for s in st.engine.list_snapshots(None).await? {
            if owned.contains(&s.id) {
                c.usage.snapshot_bytes += s.stats.logical_bytes;
                c.objects.insert(Kind::WorkspaceSnapshot.key(&s.id));
            }
        }
    }
    Ok(())
}

/// A sandbox create's memory and cpu as asked (the defaults when not: the
/// created sandbox's own figures count once it exists).
fn sandbox_demand(body: &Value) -> Demand {
    let def = Resources::default();
    let pick =
        |k: &str| body["resources"][k].as_str().or_else(|| body["resourceLimits"][k].as_str()).map(str::to_string);
    let memory = pick("memory").and_then(|m| ember_types::parse_memory_bytes(&m).ok()).unwrap_or(def.memory_bytes);
    let cpu = pick("cpu").and_then(|c| ember_types::parse_cpu_millis(&c).ok()).unwrap_or(def.cpu_millis);
    Demand { sandboxes: 1, memory_bytes: memory, cpu_millis: cpu, rate_limited: true, ..Default::default() }
}

async fn demand(st: &ApiState, route: &Route, body: &Value) -> Result<Demand, ApiError> {
    let max = body["max"].as_u64().unwrap_or(0);
    Ok(match &route.scope {
        Scope::Create(Kind::Sandbox) => sandbox_demand(body),
        Scope::Create(Kind::Pool) => Demand { pool_size: max, ..Default::default() },
        Scope::Create(Kind::Workspace) => {
            let size = body["size"].as_str().and_then(|s| ember_types::parse_memory_bytes(s).ok());
            // An unreadable size is the handler's 400; reserve nothing for it.
            Demand { workspace_bytes: size.unwrap_or(0), ..Default::default() }
        }
        Scope::Create(Kind::Task) => Demand { tasks: 1, ..Default::default() },
        Scope::Object(Kind::Pool, name) => {
            let now = u64::from(st.engine.pool_status(name).await?.spec.max);
            Demand { pool_size: max.saturating_sub(now), ..Default::default() }
        }
        // A snapshot's bytes are known once it is made: it reserves what
        // it can reach at most (the sandbox's disk limit, the workspace's
        // size), so racing snapshots cannot pass the quota together.
        Scope::Object(Kind::Sandbox, id) => {
            let disk = st.engine.get(id).await?.spec.resources.disk_bytes;
            Demand { snapshot_bytes: disk.max(1), ..Default::default() }
        }
        Scope::Object(Kind::Workspace, name) => {
            let size = st.engine.workspace(name).await?.meta.size_bytes;
            Demand { snapshot_bytes: size.max(1), ..Default::default() }
        }
        // A restore or fork makes workspaces of the size the restore gives
        // each (the one asked, else the snapshotted workspace's).
        Scope::Object(Kind::WorkspaceSnapshot, id) => {
            let asked = body["size"].as_str().and_then(|s| ember_types::parse_memory_bytes(s).ok());
            let each = ember_engine::restored_size(&st.engine.inspect_snapshot(id).await?, asked);
            // A count out of range is the handler's 400: nothing reserved.
            let count = match route.tail.first().map(String::as_str) {
                Some("fork") => body["count"].as_u64().filter(|n| *n <= MAX_FORK_COUNT.into()).unwrap_or(0),
                _ => 1,
            };
            Demand { workspace_bytes: each.saturating_mul(count), ..Default::default() }
        }
        _ => Demand::default(),
    })
}

/// The objects a create's body names: its workspaces (mounted, or the
/// task's), the snapshot it restores, the pool it claims from.
fn references(route: &Route, body: &Value) -> Vec<(Kind, String)> {
    let mut out = Vec::new();
    let mut add = |k: Kind, v: &Value| {
        if let Some(s) = v.as_str() {
            out.push((k, s.to_string()));
        }
    };
    match route.scope {
        Scope::Create(Kind::Sandbox) => {
            for w in body["workspaces"].as_array().into_iter().flatten() {
                add(Kind::Workspace, &w["name"]);
            }
            for v in body["volumes"].as_array().into_iter().flatten() {
                add(Kind::Workspace, &v["pvc"]["claimName"]);
            }
            add(Kind::SandboxSnapshot, &body["snapshotId"]);
            add(Kind::Pool, &body["extensions"]["poolRef"]);
        }
        // A golden pool's members start from the snapshot it names.
        Scope::Create(Kind::Pool) => add(Kind::SandboxSnapshot, &body["fromSnapshot"]),
        Scope::Create(Kind::Task) => add(Kind::Workspace, &body["workspace"]),
        _ => {}
    }
    out
}

async fn exists(st: &ApiState, kind: Kind, name: &str) -> bool {
    match kind {
        Kind::Workspace => st.engine.workspace(name).await.is_ok(),
        Kind::SandboxSnapshot => st.engine.sandbox_snapshot(name).await.is_ok(),
        Kind::Pool => st.engine.pool_status(name).await.is_ok(),
        _ => false,
    }
}

/// A tenant key may not mount a host volume: the directories
/// `--allow-host-path` opens are the host's, the same for every tenant, so
/// one tenant's sandbox could read and write what another's keeps there.
fn check_host_volumes(route: &Route, body: &Value) -> Result<(), ApiError> {
    let volumes = body["volumes"].as_array().into_iter().flatten();
    let host = volumes.filter(|v| !v["host"].is_null()).filter_map(|v| v["name"].as_str()).next();
    match (route.scope == Scope::Create(Kind::Sandbox), host) {
        (true, Some(name)) => Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "TENANT::FORBIDDEN",
            format!("volume {name:?}: a host volume needs the admin key (the host paths are every tenant's)"),
        )),
        _ => Ok(()),
    }
}

/// Another tenant's object named in a create's body is a 404, as its own
/// route would be. Returns the workspaces that do not exist yet: the create
/// makes them (a `pvc` volume's), and they become the tenant's.
async fn check_references(st: &ApiState, tenant: &str, route: &Route, body: &Value) -> Result<Vec<String>, ApiError> {
    let mut new = Vec::new();
    for (kind, name) in references(route, body) {
        if st.tenants.owner(kind, &name) == tenant {
            continue;
        }
        if exists(st, kind, &name).await {
            let (code, what) = match kind {
                Kind::Workspace => ("WORKSPACE::NOT_FOUND", "workspace"),
                Kind::Pool => ("POOL::NOT_FOUND", "pool"),
                _ => ("SNAPSHOT::NOT_FOUND", "snapshot"),
            };
            return Err(ApiError::new(StatusCode::NOT_FOUND, code, format!("{what} {name} not found")));
        }
        if kind == Kind::Workspace {
            new.push(name);
        }
    }
    Ok(new)
}

fn needs_demand(route: &Route) -> bool {
    match &route.scope {
        Scope::Create(k) => matches!(k, Kind::Sandbox | Kind::Pool | Kind::Workspace | Kind::Task),
        Scope::Object(Kind::Pool, _) => route.method == Method::PUT && route.tail.is_empty(),
        Scope::Object(Kind::Sandbox | Kind::Workspace, _) => {
            route.method == Method::POST && route.tail == ["snapshots"]
        }
        Scope::Object(Kind::WorkspaceSnapshot, _) => route.creates == Some(Kind::Workspace),
        _ => false,
    }
}

/// The ids an answer names: its `id` or `name`, or its `items`' ones.
fn created_ids(body: &[u8]) -> Vec<String> {
    let Ok(v) = serde_json::from_slice::<Value>(body) else { return vec![] };
    let one = |x: &Value| x["id"].as_str().or_else(|| x["name"].as_str()).map(str::to_string);
    match v["items"].as_array() {
        Some(items) => items.iter().filter_map(one).collect(),
        None => one(&v).into_iter().collect(),
    }
}

pub(super) async fn run(
    st: &ApiState,
    tenant: &str,
    route: &Route,
    req: Request,
    next: Next,
) -> Result<Response, ApiError> {
    let (req, demand, new_workspaces) = if needs_demand(route) {
        let (parts, body) = req.into_parts();
        let bytes = to_bytes(body, MAX_BODY)
            .await
            .map_err(|e| ApiError::bad_request(format!("request body unreadable or over {MAX_BODY} bytes: {e}")))?;
        let v = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        check_host_volumes(route, &v)?;
        let new = check_references(st, tenant, route, &v).await?;
        (Request::from_parts(parts, Body::from(bytes)), demand(st, route, &v).await?, new)
    } else {
        (req, Demand::default(), Vec::new())
    };
    let reservation = match demand == Demand::default() {
        true => None,
        false => Some(st.tenants.admit(tenant, demand, || counted(st, tenant)).await.map_err(tenant_error)?),
    };
    let resp = next.run(req).await;
    if resp.status().is_success() {
        for w in &new_workspaces {
            st.tenants.set_owner(Kind::Workspace, w, tenant).await.map_err(tenant_error)?;
        }
    }
    let Some(kind) = route.creates.filter(|_| resp.status().is_success()) else { return Ok(resp) };
    let (parts, body) = resp.into_parts();
    let bytes = to_bytes(body, MAX_ANSWER).await.map_err(|e| {
        ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "GENERAL::INTERNAL", format!("reading a create's answer: {e}"))
    })?;
    let ids = created_ids(&bytes);
    // A task submitted again under its idempotency key answers the task
    // that key made: another tenant's must not be shown.
    if kind == Kind::Task && parts.status == StatusCode::OK && ids.iter().any(|id| st.tenants.owner(kind, id) != tenant)
    {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "TASK::IDEMPOTENCY_CONFLICT",
            "this idempotency key is in use",
        ));
    }
    let mut rest = &ids[..];
    if let (Some(r), Some(first)) = (reservation, ids.first()) {
        st.tenants.complete(r, kind, first, tenant).await.map_err(tenant_error)?;
        rest = &ids[1..];
    }
    for id in rest {
        st.tenants.set_owner(kind, id, tenant).await.map_err(tenant_error)?;
    }
    Ok(Response::from_parts(parts, Body::from(bytes)))
}
