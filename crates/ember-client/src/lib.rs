//! A client of ember's HTTP API. It speaks only the public routes (lifecycle
//! under `/v1`, execd through the proxy route), so it works against any ember
//! daemon, and the CLI built on it has no other way in.
#![forbid(unsafe_code)]

mod execd;
mod images;
mod multipart;
mod pty;
mod raw;

pub use pty::{PtyConnection, PtyEvent};

pub use images::segment;
mod sandbox_snapshots;
mod tasks;
mod tenants;

use bytes::Bytes;
use ember_types::api::{
    CreatePoolRequest, CreateSandboxRequest, CreateWorkspaceRequest, ErrorBody, PoolInfo, PoolList, ResizePoolRequest,
    SandboxInfo, SandboxList, WorkspaceInfo, WorkspaceList,
};
use ember_types::api::{
    ForkSnapshotRequest, RestoreSnapshotRequest, SnapshotGcReport, SnapshotGcRequest, SnapshotOperation,
    SnapshotOperationList, SnapshotWorkspaceRequest, WorkspaceSnapshotInfo, WorkspaceSnapshotList,
};
use ember_types::BoundaryReport;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use percent_encoding::{AsciiSet, NON_ALPHANUMERIC};

/// Escaped in a path segment: all but RFC 3986's unreserved characters.
pub(crate) const COMPONENT: &AsciiSet = &NON_ALPHANUMERIC.remove(b'-').remove(b'.').remove(b'_').remove(b'~');
/// Escaped in a query value that is a path: the same, but `/` kept readable.
pub(crate) const QUERY_PATH: &AsciiSet = &COMPONENT.remove(b'/');

/// A query string (`a=1&b=x%20y`, form-urlencoded) from pairs.
pub fn query<'a>(pairs: impl IntoIterator<Item = (&'a str, &'a str)>) -> String {
    form_urlencoded::Serializer::new(String::new()).extend_pairs(pairs).finish()
}

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("invalid url {0:?}: only http://host:port is supported")]
    Url(String),
    #[error("cannot reach ember at {url}: {message}")]
    Connect { url: String, message: String },
    #[error("{code}: {message} (HTTP {status})")]
    Api { status: u16, code: String, message: String },
    #[error("unexpected reply from {path}: {message}")]
    Protocol { path: String, message: String },
    /// A streamed answer broke off after it began (the connection closed:
    /// the node died mid-call). What was asked may or may not have run; a
    /// caller retries only what is idempotent.
    #[error("the answer from {path} broke off: {message}")]
    Cut { path: String, message: String },
    #[error("local file {path}: {source}")]
    File {
        path: String,
        #[source]
        source: std::io::Error,
    },
}

#[derive(Clone)]
pub struct Client {
    pub(crate) base: String,
    pub(crate) api_key: Option<String>,
    http: hyper_util::client::legacy::Client<HttpConnector, Full<Bytes>>,
}

impl Client {
    /// `url` is `http://host:port` (the daemon's address). A connection not
    /// made within [`CONNECT_WAIT`] is [`ClientError::Connect`]: a host cut
    /// off drops the SYN, and without a bound the kernel's retries held a
    /// call for over 20 s (the partition drill, docs/chaos.md).
    pub fn new(url: &str, api_key: Option<String>) -> Result<Client, ClientError> {
        let base = url.trim_end_matches('/').to_string();
        if !base.starts_with("http://") || base.len() <= 7 {
            return Err(ClientError::Url(url.into()));
        }
        Ok(Client { base, api_key, http: http_client(CONNECT_WAIT) })
    }

    /// The same client with connections bounded by `wait` instead.
    pub fn with_connect_timeout(self, wait: std::time::Duration) -> Client {
        Client { http: http_client(wait), ..self }
    }

    /// The daemon's address this client calls (`http://host:port`).
    pub fn base_url(&self) -> &str {
        &self.base
    }

    pub(crate) async fn send(
        &self,
        method: Method,
        path: &str,
        body: Bytes,
        content_type: Option<&str>,
    ) -> Result<Response<Incoming>, ClientError> {
        let mut b = Request::builder().method(method).uri(format!("{}{path}", self.base));
        if let Some(ct) = content_type {
            b = b.header("content-type", ct);
        }
        if let Some(k) = &self.api_key {
            b = b.header("open-sandbox-api-key", k);
        }
        let req = b.body(Full::new(body)).map_err(|e| ClientError::Url(e.to_string()))?;
        self.http
            .request(req)
            .await
            .map_err(|e| ClientError::Connect { url: self.base.clone(), message: error_chain(&e) })
    }

    /// Turns a non-2xx reply into [`ClientError::Api`].
    pub(crate) async fn check(path: &str, resp: Response<Incoming>) -> Result<Response<Incoming>, ClientError> {
        if resp.status().is_success() {
            return Ok(resp);
        }
        let status = resp.status();
        let body = read_body(path, resp).await?;
        Err(match serde_json::from_slice::<ErrorBody>(&body) {
            Ok(e) => ClientError::Api { status: status.as_u16(), code: e.code, message: e.message },
            Err(_) => ClientError::Api {
                status: status.as_u16(),
                code: status.canonical_reason().unwrap_or("ERROR").to_string(),
                message: String::from_utf8_lossy(&body).into_owned(),
            },
        })
    }

    pub(crate) async fn json<T: serde::de::DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        body: Option<Vec<u8>>,
    ) -> Result<(T, hyper::HeaderMap), ClientError> {
        let ct = body.as_ref().map(|_| "application/json");
        let resp = self.send(method, path, body.unwrap_or_default().into(), ct).await?;
        let resp = Self::check(path, resp).await?;
        let headers = resp.headers().clone();
        let bytes = read_body(path, resp).await?;
        let v = serde_json::from_slice(&bytes)
            .map_err(|e| ClientError::Protocol { path: path.into(), message: e.to_string() })?;
        Ok((v, headers))
    }

    /// Creates a sandbox; returns it and the server-side launch time in µs.
    pub async fn create_sandbox(&self, req: &CreateSandboxRequest) -> Result<(SandboxInfo, u64), ClientError> {
        let body = serde_json::to_vec(req)
            .map_err(|e| ClientError::Protocol { path: "create".into(), message: e.to_string() })?;
        let (info, h): (SandboxInfo, _) = self.json(Method::POST, "/v1/sandboxes", Some(body)).await?;
        let micros = h.get("x-ember-launch-micros").and_then(|v| v.to_str().ok()?.parse().ok()).unwrap_or(0);
        Ok((info, micros))
    }

    pub async fn get_sandbox(&self, id: &str) -> Result<SandboxInfo, ClientError> {
        Ok(self.json(Method::GET, &format!("/v1/sandboxes/{id}"), None).await?.0)
    }

    /// Every sandbox, following pagination; `query` is e.g. `state=Running`
    /// (see [`query`]).
    pub async fn list_sandboxes(&self, query: &str) -> Result<Vec<SandboxInfo>, ClientError> {
        let mut out = Vec::new();
        for page in 1.. {
            let path = format!("/v1/sandboxes?pageSize=200&page={page}&{query}");
            let (l, _): (SandboxList, _) = self.json(Method::GET, &path, None).await?;
            out.extend(l.items);
            if !l.pagination.has_next_page {
                break;
            }
        }
        Ok(out)
    }

    pub async fn delete_sandbox(&self, id: &str) -> Result<(), ClientError> {
        let path = format!("/v1/sandboxes/{id}");
        let resp = self.send(Method::DELETE, &path, Bytes::new(), None).await?;
        Self::check(&path, resp).await.map(|_| ())
    }

    /// Freezes a Running sandbox (`POST .../pause`, 202).
    pub async fn pause_sandbox(&self, id: &str) -> Result<(), ClientError> {
        let path = format!("/v1/sandboxes/{id}/pause");
        let resp = self.send(Method::POST, &path, Bytes::new(), None).await?;
        Self::check(&path, resp).await.map(|_| ())
    }

    /// Thaws a Paused sandbox, or restores a checkpointed one (`POST .../resume`, 202).
    pub async fn resume_sandbox(&self, id: &str) -> Result<(), ClientError> {
        let path = format!("/v1/sandboxes/{id}/resume");
        let resp = self.send(Method::POST, &path, Bytes::new(), None).await?;
        Self::check(&path, resp).await.map(|_| ())
    }

    /// Saves a runsc sandbox to disk and stops it (`POST .../checkpoint`, 202).
    pub async fn checkpoint_sandbox(&self, id: &str) -> Result<(), ClientError> {
        let path = format!("/v1/sandboxes/{id}/checkpoint");
        let resp = self.send(Method::POST, &path, Bytes::new(), None).await?;
        Self::check(&path, resp).await.map(|_| ())
    }

    pub async fn boundary(&self, id: &str) -> Result<BoundaryReport, ClientError> {
        Ok(self.json(Method::GET, &format!("/v1/sandboxes/{id}/boundary"), None).await?.0)
    }

    /// A sandbox's network mode and egress policy.
    pub async fn network(&self, id: &str) -> Result<ember_types::NetworkInfo, ClientError> {
        Ok(self.json(Method::GET, &format!("/v1/sandboxes/{id}/network"), None).await?.0)
    }

    /// Replaces a running sandbox's egress policy.
    pub async fn set_network_policy(
        &self,
        id: &str,
        policy: &ember_types::EgressPolicy,
    ) -> Result<ember_types::NetworkInfo, ClientError> {
        let body = serde_json::to_vec(policy)
            .map_err(|e| ClientError::Protocol { path: "network".into(), message: e.to_string() })?;
        Ok(self.json(Method::PUT, &format!("/v1/sandboxes/{id}/network"), Some(body)).await?.0)
    }

    /// A sandbox's denied flows, oldest first.
    pub async fn network_events(&self, id: &str) -> Result<Vec<ember_types::DeniedFlow>, ClientError> {
        let path = format!("/v1/sandboxes/{id}/network/events");
        Ok(self.json::<ember_types::DeniedFlowList>(Method::GET, &path, None).await?.0.items)
    }

    /// The node's network slot pool.
    pub async fn network_node(&self) -> Result<ember_types::NetworkNodeInfo, ClientError> {
        Ok(self.json(Method::GET, "/v1/network", None).await?.0)
    }

    pub async fn create_pool(&self, req: &CreatePoolRequest) -> Result<PoolInfo, ClientError> {
        let body = serde_json::to_vec(req)
            .map_err(|e| ClientError::Protocol { path: "pool".into(), message: e.to_string() })?;
        Ok(self.json(Method::POST, "/v1/pools", Some(body)).await?.0)
    }

    pub async fn list_runtimes(&self) -> Result<Vec<ember_types::api::RuntimeClassInfo>, ClientError> {
        Ok(self.json::<ember_types::api::RuntimeClassList>(Method::GET, "/v1/runtimes", None).await?.0.items)
    }

    pub async fn list_pools(&self) -> Result<Vec<PoolInfo>, ClientError> {
        Ok(self.json::<PoolList>(Method::GET, "/v1/pools", None).await?.0.items)
    }

    pub async fn get_pool(&self, name: &str) -> Result<PoolInfo, ClientError> {
        Ok(self.json(Method::GET, &format!("/v1/pools/{name}"), None).await?.0)
    }

    pub async fn resize_pool(&self, name: &str, req: &ResizePoolRequest) -> Result<PoolInfo, ClientError> {
        let body = serde_json::to_vec(req)
            .map_err(|e| ClientError::Protocol { path: "pool".into(), message: e.to_string() })?;
        Ok(self.json(Method::PUT, &format!("/v1/pools/{name}"), Some(body)).await?.0)
    }

    pub async fn delete_pool(&self, name: &str) -> Result<(), ClientError> {
        let path = format!("/v1/pools/{name}");
        let resp = self.send(Method::DELETE, &path, Bytes::new(), None).await?;
        Self::check(&path, resp).await.map(|_| ())
    }

    pub async fn create_workspace(&self, name: &str, size: &str) -> Result<WorkspaceInfo, ClientError> {
        let body = serde_json::to_vec(&CreateWorkspaceRequest { name: name.into(), size: size.into() })
            .map_err(|e| ClientError::Protocol { path: "workspace".into(), message: e.to_string() })?;
        Ok(self.json(Method::POST, "/v1/workspaces", Some(body)).await?.0)
    }

    pub async fn list_workspaces(&self) -> Result<Vec<WorkspaceInfo>, ClientError> {
        Ok(self.json::<WorkspaceList>(Method::GET, "/v1/workspaces", None).await?.0.items)
    }

    pub async fn get_workspace(&self, name: &str) -> Result<WorkspaceInfo, ClientError> {
        Ok(self.json(Method::GET, &format!("/v1/workspaces/{name}"), None).await?.0)
    }

    /// A synchronous checkpoint of the workspace to the snapshot store.
    pub async fn checkpoint_workspace(
        &self,
        name: &str,
    ) -> Result<ember_types::api::WorkspaceCheckpointInfo, ClientError> {
        Ok(self.json(Method::POST, &format!("/v1/workspaces/{name}/checkpoint"), None).await?.0)
    }

    pub async fn delete_workspace(&self, name: &str) -> Result<(), ClientError> {
        let path = format!("/v1/workspaces/{name}");
        let resp = self.send(Method::DELETE, &path, Bytes::new(), None).await?;
        Self::check(&path, resp).await.map(|_| ())
    }

    pub async fn snapshot_workspace(
        &self,
        name: &str,
        fence: Option<(&str, u64)>,
    ) -> Result<WorkspaceSnapshotInfo, ClientError> {
        let req = SnapshotWorkspaceRequest {
            holder: fence.map(|f| f.0.to_string()),
            epoch: fence.map(|f| f.1),
            operation_id: None,
        };
        self.snapshot_workspace_with(name, &req).await
    }

    /// Snapshot with every request field (fencing, an operation id to poll).
    pub async fn snapshot_workspace_with(
        &self,
        name: &str,
        req: &SnapshotWorkspaceRequest,
    ) -> Result<WorkspaceSnapshotInfo, ClientError> {
        let body = serde_json::to_vec(req)
            .map_err(|e| ClientError::Protocol { path: "snapshot".into(), message: e.to_string() })?;
        Ok(self.json(Method::POST, &format!("/v1/workspaces/{name}/snapshots"), Some(body)).await?.0)
    }

    /// A snapshot, restore or fork's progress (`operationId` of its request).
    pub async fn snapshot_operation(&self, id: &str) -> Result<SnapshotOperation, ClientError> {
        Ok(self.json(Method::GET, &format!("/v1/workspace-snapshots/operations/{id}"), None).await?.0)
    }

    pub async fn snapshot_operations(&self) -> Result<Vec<SnapshotOperation>, ClientError> {
        let path = "/v1/workspace-snapshots/operations";
        Ok(self.json::<SnapshotOperationList>(Method::GET, path, None).await?.0.items)
    }

    pub async fn list_snapshots(&self, workspace: Option<&str>) -> Result<Vec<WorkspaceSnapshotInfo>, ClientError> {
        let q = workspace.map(|w| format!("?{}", query([("workspace", w)]))).unwrap_or_default();
        Ok(self.json::<WorkspaceSnapshotList>(Method::GET, &format!("/v1/workspace-snapshots{q}"), None).await?.0.items)
    }

    pub async fn get_snapshot(&self, id: &str) -> Result<WorkspaceSnapshotInfo, ClientError> {
        Ok(self.json(Method::GET, &format!("/v1/workspace-snapshots/{id}"), None).await?.0)
    }

    /// One mark-and-sweep of the snapshot store; `min_age_secs`: keep
    /// unreferenced chunks younger than this (the server's default if `None`).
    pub async fn gc_snapshots(&self, min_age_secs: Option<u64>) -> Result<SnapshotGcReport, ClientError> {
        let body = serde_json::to_vec(&SnapshotGcRequest { min_age_seconds: min_age_secs })
            .map_err(|e| ClientError::Protocol { path: "snapshot gc".into(), message: e.to_string() })?;
        Ok(self.json(Method::POST, "/v1/snapshot-store/gc", Some(body)).await?.0)
    }

    pub async fn delete_snapshot(&self, id: &str) -> Result<(), ClientError> {
        let path = format!("/v1/workspace-snapshots/{id}");
        let resp = self.send(Method::DELETE, &path, Bytes::new(), None).await?;
        Self::check(&path, resp).await.map(|_| ())
    }

    pub async fn restore_snapshot(
        &self,
        id: &str,
        name: &str,
        size: Option<&str>,
    ) -> Result<WorkspaceInfo, ClientError> {
        let req = RestoreSnapshotRequest { name: name.into(), size: size.map(str::to_string), operation_id: None };
        self.restore_snapshot_with(id, &req).await
    }

    pub async fn restore_snapshot_with(
        &self,
        id: &str,
        req: &RestoreSnapshotRequest,
    ) -> Result<WorkspaceInfo, ClientError> {
        let body = serde_json::to_vec(req)
            .map_err(|e| ClientError::Protocol { path: "restore".into(), message: e.to_string() })?;
        Ok(self.json(Method::POST, &format!("/v1/workspace-snapshots/{id}/restore"), Some(body)).await?.0)
    }

    pub async fn fork_snapshot(&self, id: &str, count: u32, prefix: &str) -> Result<Vec<WorkspaceInfo>, ClientError> {
        let req = ForkSnapshotRequest { count, prefix: prefix.into(), operation_id: None };
        self.fork_snapshot_with(id, &req).await
    }

    pub async fn fork_snapshot_with(
        &self,
        id: &str,
        req: &ForkSnapshotRequest,
    ) -> Result<Vec<WorkspaceInfo>, ClientError> {
        let body = serde_json::to_vec(req)
            .map_err(|e| ClientError::Protocol { path: "fork".into(), message: e.to_string() })?;
        Ok(self
            .json::<WorkspaceList>(Method::POST, &format!("/v1/workspace-snapshots/{id}/fork"), Some(body))
            .await?
            .0
            .items)
    }

    /// Raw GET returning status and body (health, metrics, anything).
    pub async fn get_raw(&self, path: &str) -> Result<(StatusCode, Bytes), ClientError> {
        let resp = self.send(Method::GET, path, Bytes::new(), None).await?;
        let status = resp.status();
        Ok((status, read_body(path, resp).await?))
    }
}

pub(crate) async fn read_body(path: &str, resp: Response<Incoming>) -> Result<Bytes, ClientError> {
    resp.into_body()
        .collect()
        .await
        .map(|c| c.to_bytes())
        .map_err(|e| ClientError::Protocol { path: path.into(), message: e.to_string() })
}

/// How long a client waits for a TCP connection to a daemon.
pub const CONNECT_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

fn http_client(connect_wait: std::time::Duration) -> hyper_util::client::legacy::Client<HttpConnector, Full<Bytes>> {
    let mut conn = HttpConnector::new();
    conn.set_nodelay(true);
    conn.set_connect_timeout(Some(connect_wait));
    hyper_util::client::legacy::Client::builder(TokioExecutor::new()).build(conn)
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}
