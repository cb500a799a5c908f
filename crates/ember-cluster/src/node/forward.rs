//! Calls to another node's API: a [`NodeCall`] posted to its
//! `/v1/cluster/call`, the answer read with a bound, and an error answer
//! (`{code, message}`) turned back into the [`EngineError`] that produced it,
//! so the client of this node sees the code the owning node gave.
use bytes::Bytes;
use ember_engine::{EngineError, Liveness, NodeCall};
use ember_types::{SandboxId, SandboxState};
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;
use serde::de::DeserializeOwned;
use std::sync::Arc;
use std::time::Duration;

/// Largest answer read from a node (a list of many records fits).
const MAX_ANSWER: usize = 64 << 20;
/// A forwarded call's deadline: a create that pulls an image takes long.
const CALL_TIMEOUT: Duration = Duration::from_secs(300);
/// How often a call under way checks that its node is still live.
const LIVE_CHECK: Duration = Duration::from_millis(250);
const API_KEY_HEADER: &str = "open-sandbox-api-key";

/// Fields the engine names in its `InvalidRequest`s: the error keeps a
/// `&'static str`, so a forwarded one is matched against these (else
/// `request`).
const FIELDS: &[&str] = &[
    "attempt",
    "command",
    "cpu",
    "disk",
    "env",
    "expiresAt",
    "key",
    "max",
    "memory",
    "metadata",
    "name",
    "network",
    "networkPolicy",
    "operationId",
    "pids",
    "poolRef",
    "rules",
    "runtimeClass",
    "snapshotId",
    "target",
    "tenant",
    "timeout",
    "volumes",
    "workdir",
    "workspaces",
];

#[derive(Clone)]
pub(crate) struct Forwarder {
    client: Client<HttpConnector, Full<Bytes>>,
    api_key: Option<String>,
    nodes: Arc<super::registry::Nodes>,
}

#[derive(serde::Deserialize)]
struct ErrorBody {
    code: String,
    message: String,
}

impl Forwarder {
    /// Calls go to nodes `nodes` judges live; one judged dead mid-call ends
    /// the call.
    pub fn new(api_key: Option<String>, nodes: Arc<super::registry::Nodes>) -> Forwarder {
        Forwarder { client: Client::builder(TokioExecutor::new()).build_http(), api_key, nodes }
    }

    /// Resolves when node `name` is no longer live (never while it is).
    async fn death_of(&self, name: &str) {
        loop {
            tokio::time::sleep(LIVE_CHECK).await;
            if self.nodes.get(name).is_err() {
                return;
            }
        }
    }

    pub fn api_key(&self) -> Option<String> {
        self.api_key.clone()
    }

    /// Runs `call` on the node at `base` (`http://host:port`), named `node`.
    pub async fn call<T: DeserializeOwned>(&self, node: &str, base: &str, call: &NodeCall) -> Result<T, EngineError> {
        self.send(node, base, call, CALL_TIMEOUT, true).await
    }

    /// Asks node `node` whether its heartbeats get through, waiting at most
    /// `wait`. Not ended by the registry's verdict: it is asked of a node
    /// the registry takes for dead (`liveness.rs`).
    pub async fn liveness(&self, node: &str, base: &str, wait: Duration) -> Result<Liveness, EngineError> {
        self.send(node, base, &NodeCall::Liveness, wait, false).await
    }

    /// [`Self::call`] within `deadline`; with `watch`, ended once `node` is
    /// judged dead.
    async fn send<T: DeserializeOwned>(
        &self,
        node: &str,
        base: &str,
        call: &NodeCall,
        deadline: Duration,
        watch: bool,
    ) -> Result<T, EngineError> {
        let unreachable = |what: String| EngineError::Internal(format!("node {node} ({base}): {what}"));
        let body = serde_json::to_vec(call).map_err(|e| unreachable(format!("encode call: {e}")))?;
        let mut req = hyper::Request::post(format!("{}/v1/cluster/call", base.trim_end_matches('/')))
            .header(hyper::header::CONTENT_TYPE, "application/json");
        if let Some(k) = &self.api_key {
            req = req.header(API_KEY_HEADER, k);
        }
        let req = req.body(Full::new(Bytes::from(body))).map_err(|e| unreachable(format!("request: {e}")))?;
        // No answer at all: the node is down or cut off (503, try again).
        let down = |reason: String| EngineError::NodeUnavailable {
            node: node.to_string(),
            reason: format!("{base}: {reason}"),
        };
        let call_fut = tokio::time::timeout(deadline, async {
            let resp = self.client.request(req).await.map_err(|e| down(format!("request: {}", chain(&e))))?;
            let status = resp.status();
            let bytes = Limited::new(resp.into_body(), MAX_ANSWER)
                .collect()
                .await
                .map_err(|e| unreachable(format!("answer (at most {MAX_ANSWER} bytes): {e}")))?
                .to_bytes();
            Ok::<_, EngineError>((status, bytes))
        });
        // A node cut off mid-call (its link dropped, or frozen) never
        // answers: once the registry takes it for dead the call ends as a
        // 503 the client retries (the partition drill's calls waited the
        // whole deadline, 300 s, on a node dead after 1.5 s).
        let death = async {
            match watch {
                true => self.death_of(node).await,
                false => std::future::pending().await,
            }
        };
        let answer = tokio::select! {
            a = call_fut => a.map_err(|_| down(format!("no answer within {deadline:?}")))??,
            () = death => return Err(down("it was judged dead while the call was under way".into())),
        };
        let (status, bytes) = answer;
        if status.is_success() {
            return serde_json::from_slice(&bytes).map_err(|e| unreachable(format!("unreadable answer: {e}")));
        }
        match serde_json::from_slice::<ErrorBody>(&bytes) {
            Ok(b) => Err(engine_error(node, status.as_u16(), &b.code, b.message, call)),
            Err(_) => Err(unreachable(format!("{status} without an error body"))),
        }
    }
}

fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}

/// The id a call names (a sandbox's, or a sandbox snapshot's), if any.
fn call_id(call: &NodeCall) -> Option<&str> {
    use NodeCall as C;
    match call {
        C::Create { .. }
        | C::List { .. }
        | C::ListSandboxSnapshots { .. }
        | C::ListWorkspaces
        | C::Liveness
        | C::CreateWorkspace { .. }
        | C::Workspace { .. }
        | C::RemoveWorkspace { .. }
        | C::CheckpointWorkspace { .. }
        | C::TaskLog { .. }
        | C::Audit { .. } => None,
        C::Get { id }
        | C::Remove { id }
        | C::Pause { id }
        | C::Resume { id }
        | C::Checkpoint { id }
        | C::Renew { id, .. }
        | C::PatchMetadata { id, .. }
        | C::Boundary { id }
        | C::Stats { id }
        | C::AgentLog { id, .. }
        | C::EgressPolicy { id }
        | C::PatchEgress { id, .. }
        | C::DeleteEgress { id, .. }
        | C::EgressEnforced { id }
        | C::NetworkEvents { id }
        | C::NetworkStatus { id }
        | C::SetNetworkPolicy { id, .. }
        | C::SnapshotSandbox { id, .. }
        | C::SandboxSnapshot { id }
        | C::DeleteSandboxSnapshot { id } => Some(id),
    }
}

/// The error the owning node rendered as `{code, message}` (ember-api's
/// `error.rs`), rebuilt where its variant can be rebuilt exactly — checked:
/// the rebuilt error must render the very message —, so the client sees the
/// same code and message. Other errors pass on as `Remote`: the owner's
/// status, code and message unchanged (docs/cluster.md).
pub(crate) fn engine_error(node: &str, status: u16, code: &str, message: String, call: &NodeCall) -> EngineError {
    match rebuild(code, &message, call) {
        Some(e) if e.to_string() == message => e,
        _ => EngineError::Remote { node: node.to_string(), status, code: code.to_string(), message },
    }
}

/// The text between `prefix` and `suffix` of `message`.
fn between<'a>(message: &'a str, prefix: &str, suffix: &str) -> Option<&'a str> {
    message.strip_prefix(prefix)?.strip_suffix(suffix)
}

fn rebuild(code: &str, message: &str, call: &NodeCall) -> Option<EngineError> {
    let id = || call_id(call).and_then(|i| SandboxId::try_from(i.to_string()).ok());
    // "sandbox {id} is {state}, not Running|Paused"
    let state = || {
        let (_, rest) = message.split_once(" is ")?;
        let (s, _) = rest.split_once(", not ")?;
        serde_json::from_value::<SandboxState>(serde_json::Value::String(s.to_string())).ok()
    };
    let quoted = |prefix: &str| {
        let rest = message.strip_prefix(prefix)?.strip_prefix('"')?;
        rest.split_once('"').map(|(name, _)| name.to_string())
    };
    Some(match code {
        "SANDBOX::NOT_FOUND" => EngineError::NotFound(between(message, "sandbox ", " not found")?.to_string()),
        "SANDBOX::NOT_RUNNING" => EngineError::NotRunning { id: id()?, state: state()? },
        "SANDBOX::NOT_PAUSED" => EngineError::NotPaused { id: id()?, state: state()? },
        "SANDBOX::NO_EXPIRATION" => EngineError::NoExpiration(id()?),
        "SANDBOX::BUSY" => {
            let id = id()?;
            let rest = message.strip_prefix(&format!("sandbox {id} is busy: "))?.to_string();
            EngineError::Busy { id, message: rest }
        }
        "SANDBOX::INVALID_PARAMETER" => {
            let (field, rest) = message.strip_prefix("invalid ")?.split_once(": ")?;
            let field = FIELDS.iter().find(|k| **k == field)?;
            EngineError::InvalidRequest { field, message: rest.to_string() }
        }
        "SANDBOX::UNKNOWN_TEMPLATE" => EngineError::UnknownTemplate(quoted("unknown template ")?),
        "TEMPLATE::EXISTS" => EngineError::TemplateExists(quoted("template ")?),
        "POOL::NOT_FOUND" => EngineError::PoolNotFound(between(message, "pool ", " not found")?.to_string()),
        "POOL::ALREADY_EXISTS" => EngineError::PoolExists(between(message, "pool ", " already exists")?.to_string()),
        "SNAPSHOT::NOT_FOUND" => {
            EngineError::SandboxSnapshotNotFound(between(message, "sandbox snapshot ", " not found")?.to_string())
        }
        "WORKSPACE::NOT_FOUND" => EngineError::Workspace(ember_workspace::WorkspaceError::NotFound(
            between(message, "workspace ", " not found")?.to_string(),
        )),
        "WORKSPACE::FENCED" => {
            let (name, detail) = message.strip_prefix("workspace ")?.split_once(" is fenced: ")?;
            EngineError::WorkspaceFenced { name: name.to_string(), detail: detail.to_string() }
        }
        "SNAPSHOT::OPERATION_NOT_FOUND" => EngineError::OperationNotFound(
            between(message, "snapshot operation ", " not found (finished ones are kept for 10 minutes)")?.to_string(),
        ),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each rebuilt error renders the message it was rebuilt from.
    #[test]
    fn rebuilt_errors_render_the_owner_message() {
        let id = "2f1c9a7e-0b1d-4c3e-8f00-0123456789ab".to_string();
        let get = NodeCall::Get { id: id.clone() };
        let cases = [
            ("SANDBOX::NOT_FOUND", format!("sandbox {id} not found")),
            ("SANDBOX::NOT_RUNNING", format!("sandbox {id} is Paused, not Running")),
            ("SANDBOX::NOT_PAUSED", format!("sandbox {id} is Running, not Paused")),
            ("SANDBOX::BUSY", format!("sandbox {id} is busy: an exec stream is open")),
            ("SANDBOX::INVALID_PARAMETER", "invalid memory: at least 16Mi".to_string()),
            ("SANDBOX::UNKNOWN_TEMPLATE", EngineError::UnknownTemplate("py".into()).to_string()),
            ("TEMPLATE::EXISTS", EngineError::TemplateExists("py".into()).to_string()),
            ("POOL::NOT_FOUND", "pool no-such-pool not found".to_string()),
            ("WORKSPACE::NOT_FOUND", "workspace e2e-none not found".to_string()),
            ("POOL::ALREADY_EXISTS", "pool py already exists".to_string()),
            ("SNAPSHOT::NOT_FOUND", format!("sandbox snapshot {id} not found")),
            (
                "WORKSPACE::FENCED",
                "workspace w1 is fenced: node a held it at epoch 1; node b holds it at epoch 2".into(),
            ),
            ("SNAPSHOT::OPERATION_NOT_FOUND", EngineError::OperationNotFound("op-1".into()).to_string()),
        ];
        for (code, message) in cases {
            let e = engine_error("b", 409, code, message.clone(), &get);
            assert!(!matches!(e, EngineError::Internal(_)), "{code} rebuilt as Internal");
            assert_eq!(e.to_string(), message, "{code}");
        }
        // An error that does not rebuild exactly passes on with the owner's
        // status, code and message (a 409 WORKSPACE::FENCED of the local lease
        // guard reached the drill's client as a 500).
        let cases = [
            (400, "SANDBOX::INVALID_PARAMETER", "invalid request body: x"),
            (409, "WORKSPACE::IN_USE", "workspace w is in use"),
            (409, "WORKSPACE::FENCED", "commit of snapshot w-1 refused: the commit guard returned false"),
        ];
        for (status, code, message) in cases {
            match engine_error("b", status, code, message.into(), &get) {
                EngineError::Remote { node, status: s, code: c, message: m } => {
                    assert_eq!((node.as_str(), s, c.as_str(), m.as_str()), ("b", status, code, message));
                }
                e => panic!("{code} rebuilt as {e:?}"),
            }
        }
    }
}
