//! API errors: `{code, message}` with a stable code and the right status. The
//! control plane's errors become HTTP errors in exactly one place, [`From<EngineError>`].
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use ember_engine::EngineError;
use ember_types::api::ErrorBody;
use std::borrow::Cow;

#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub code: Cow<'static, str>,
    pub message: String,
}

impl ApiError {
    pub fn new(status: StatusCode, code: impl Into<Cow<'static, str>>, message: impl Into<String>) -> Self {
        ApiError { status, code: code.into(), message: message.into() }
    }

    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "SANDBOX::INVALID_PARAMETER", message)
    }

    pub fn not_supported(message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_IMPLEMENTED, "SANDBOX::API_NOT_SUPPORTED", message)
    }
}

/// The error and its sources, `: `-separated, for the message.
pub fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        let m = c.to_string();
        if !s.contains(&m) {
            s.push_str(": ");
            s.push_str(&m);
        }
        cur = c.source();
    }
    s
}

impl From<EngineError> for ApiError {
    fn from(e: EngineError) -> Self {
        use StatusCode as S;
        if let EngineError::Remote { status, code, message, .. } = &e {
            // Only an error status passes: anything else from a node is its bug.
            let status = StatusCode::from_u16(*status).ok().filter(|s| s.is_client_error() || s.is_server_error());
            return ApiError::new(status.unwrap_or(S::BAD_GATEWAY), code.clone(), message.clone());
        }
        let (status, code) = match &e {
            // A full disk anywhere under the request: the server's storage,
            // not a bug, and said so (RFC 4918's 507), whatever wrote.
            e if disk_full(e) => (S::INSUFFICIENT_STORAGE, "STORE::NO_SPACE"),
            EngineError::NotFound(_) => (S::NOT_FOUND, "SANDBOX::NOT_FOUND"),
            EngineError::OperationNotFound(_) => (S::NOT_FOUND, "SNAPSHOT::OPERATION_NOT_FOUND"),
            EngineError::NotRunning { .. } => (S::CONFLICT, "SANDBOX::NOT_RUNNING"),
            EngineError::NotPaused { .. } => (S::CONFLICT, "SANDBOX::NOT_PAUSED"),
            EngineError::InvalidRequest { .. } => (S::BAD_REQUEST, "SANDBOX::INVALID_PARAMETER"),
            EngineError::UnknownTemplate(_) => (S::BAD_REQUEST, "SANDBOX::UNKNOWN_TEMPLATE"),
            EngineError::TemplateExists(_) => (S::CONFLICT, "TEMPLATE::EXISTS"),
            EngineError::Image(i) => image_status(i),
            EngineError::NoExpiration(_) => (S::CONFLICT, "SANDBOX::NO_EXPIRATION"),
            // A restored layer that plants a symlink where the host prepares
            // the rootfs: refused content, as an unsafe image layer is.
            EngineError::Runtime { source: ember_engine::RuntimeError::UnsafeLayer { .. }, .. } => {
                (S::UNPROCESSABLE_ENTITY, "SANDBOX::UNSAFE_LAYER")
            }
            EngineError::Runtime { .. } => (S::INTERNAL_SERVER_ERROR, "SANDBOX::RUNTIME_ERROR"),
            EngineError::Store { .. } => (S::INTERNAL_SERVER_ERROR, "STORE::IO_ERROR"),
            EngineError::PoolNotFound(_) => (S::NOT_FOUND, "POOL::NOT_FOUND"),
            EngineError::PoolExists(_) => (S::CONFLICT, "POOL::ALREADY_EXISTS"),
            EngineError::PoolEmpty(_) => (S::CONFLICT, "POOL::EMPTY"),
            EngineError::Workspace(w) => workspace_status(w),
            EngineError::Task(t) => task_status(t),
            EngineError::Snapshot(s) => snapshot_status(s),
            EngineError::Network { .. } => (S::INTERNAL_SERVER_ERROR, "NETWORK::ERROR"),
            EngineError::SandboxSnapshotNotFound(_) => (S::NOT_FOUND, "SNAPSHOT::NOT_FOUND"),
            EngineError::SnapshotNotReady { .. } => (S::CONFLICT, "SNAPSHOT::NOT_READY"),
            EngineError::SnapshotInUse { .. } => (S::CONFLICT, "SNAPSHOT::IN_USE"),
            EngineError::SnapshotSourceState { .. } => (S::CONFLICT, "SNAPSHOT::INVALID_SOURCE_STATE"),
            EngineError::SnapshotUnsupportedRuntime(_) => (S::BAD_REQUEST, "SNAPSHOT::UNSUPPORTED_RUNTIME"),
            EngineError::CheckpointUnsupported(_) => (S::BAD_REQUEST, "SANDBOX::UNSUPPORTED_RUNTIME"),
            EngineError::Busy { .. } => (S::CONFLICT, "SANDBOX::BUSY"),
            EngineError::NodeUnavailable { .. } => (S::SERVICE_UNAVAILABLE, "CLUSTER::NODE_UNAVAILABLE"),
            EngineError::WorkspaceFenced { .. } => (S::CONFLICT, "WORKSPACE::FENCED"),
            EngineError::Internal(_) | EngineError::Remote { .. } => {
                (S::INTERNAL_SERVER_ERROR, "GENERAL::UNKNOWN_ERROR")
            }
        };
        if status.is_server_error() {
            tracing::error!(error = %chain(&e), "request failed");
        }
        ApiError::new(status, code, chain(&e))
    }
}

/// Whether `e` or one of its sources is a write that found the disk (or a
/// quota) full: an `io::Error` of that kind, or `mkfs.ext4` saying so (a
/// child process, whose exit status does not tell).
fn disk_full(e: &EngineError) -> bool {
    if let EngineError::Workspace(ember_workspace::WorkspaceError::Command { stderr, .. }) = e {
        return stderr.contains("No space left on device");
    }
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(c) = cur {
        if c.downcast_ref::<std::io::Error>().is_some_and(io_full) {
            return true;
        }
        cur = c.source();
    }
    false
}

/// A write that found the disk (or a quota) full.
pub(crate) fn io_full(e: &std::io::Error) -> bool {
    matches!(e.kind(), std::io::ErrorKind::StorageFull | std::io::ErrorKind::QuotaExceeded)
}

/// Image errors: the registry's refusals are the caller's problem (4xx) or the
/// registry's (502); the store's are ours (500).
fn image_status(e: &ember_image::ImageError) -> (StatusCode, &'static str) {
    use ember_image::ImageError as I;
    use StatusCode as S;
    match e {
        I::BadReference { .. } => (S::BAD_REQUEST, "IMAGE::INVALID_REFERENCE"),
        I::NotFound(_) => (S::NOT_FOUND, "IMAGE::NOT_FOUND"),
        I::Unauthorized { .. } => (S::UNAUTHORIZED, "IMAGE::REGISTRY_UNAUTHORIZED"),
        I::NotInRegistry { .. } => (S::NOT_FOUND, "IMAGE::NOT_IN_REGISTRY"),
        I::Registry { .. } => (S::BAD_GATEWAY, "IMAGE::REGISTRY_ERROR"),
        I::DigestMismatch { .. } => (S::BAD_GATEWAY, "IMAGE::DIGEST_MISMATCH"),
        I::NoPlatform { .. } => (S::BAD_REQUEST, "IMAGE::NO_PLATFORM"),
        I::MediaType { .. } => (S::BAD_REQUEST, "IMAGE::UNSUPPORTED_MEDIA_TYPE"),
        I::UnsafeEntry { .. } => (S::UNPROCESSABLE_ENTITY, "IMAGE::UNSAFE_LAYER"),
        I::BadLayer { .. } => (S::UNPROCESSABLE_ENTITY, "IMAGE::BAD_LAYER"),
        I::BadImport { .. } => (S::BAD_REQUEST, "IMAGE::BAD_IMPORT"),
        I::TooLarge { .. } => (S::UNPROCESSABLE_ENTITY, "IMAGE::TOO_LARGE"),
        I::InUse { .. } => (S::CONFLICT, "IMAGE::IN_USE"),
        I::User { .. } => (S::BAD_REQUEST, "IMAGE::BAD_USER"),
        I::Io { .. } | I::Sys(_) => (S::INTERNAL_SERVER_ERROR, "IMAGE::IO_ERROR"),
    }
}

fn workspace_status(e: &ember_workspace::WorkspaceError) -> (StatusCode, &'static str) {
    use ember_workspace::{LeaseError, WorkspaceError as W};
    use StatusCode as S;
    match e {
        W::Name(_) | W::TooSmall(_) | W::TooLarge { .. } => (S::BAD_REQUEST, "WORKSPACE::INVALID_PARAMETER"),
        W::NoSpace { .. } => (S::INSUFFICIENT_STORAGE, "WORKSPACE::NO_SPACE"),
        W::NotFound(_) => (S::NOT_FOUND, "WORKSPACE::NOT_FOUND"),
        W::Exists(_) => (S::CONFLICT, "WORKSPACE::ALREADY_EXISTS"),
        W::InUse { .. } => (S::CONFLICT, "WORKSPACE::IN_USE"),
        W::Lease(LeaseError::Held { .. }) => (S::CONFLICT, "WORKSPACE::LEASED"),
        W::Lease(LeaseError::Fenced { .. }) => (S::CONFLICT, "WORKSPACE::FENCED"),
        W::Io { .. } | W::Command { .. } | W::Sys(_) => (S::INTERNAL_SERVER_ERROR, "WORKSPACE::IO_ERROR"),
    }
}

fn task_status(e: &ember_engine::tasks::QueueError) -> (StatusCode, &'static str) {
    use ember_engine::tasks::QueueError as Q;
    use StatusCode as S;
    match e {
        Q::NotFound(_) => (S::NOT_FOUND, "TASK::NOT_FOUND"),
        Q::Finished { .. } => (S::CONFLICT, "TASK::ALREADY_ENDED"),
        Q::Fenced { .. } => (S::CONFLICT, "TASK::FENCED"),
        Q::Journal { .. } => (S::INTERNAL_SERVER_ERROR, "STORE::IO_ERROR"),
        Q::Unavailable { .. } => (S::SERVICE_UNAVAILABLE, "TASK::QUEUE_UNAVAILABLE"),
    }
}

fn snapshot_status(e: &ember_snapshot::SnapshotError) -> (StatusCode, &'static str) {
    use ember_snapshot::SnapshotError as E;
    match e {
        E::CommitRefused { .. } => (StatusCode::CONFLICT, "WORKSPACE::FENCED"),
        E::NotFound { .. } => (StatusCode::NOT_FOUND, "SNAPSHOT::NOT_FOUND"),
        E::InvalidId { .. } => (StatusCode::BAD_REQUEST, "SNAPSHOT::INVALID_ID"),
        E::AlreadyExists { .. } => (StatusCode::CONFLICT, "SNAPSHOT::ALREADY_EXISTS"),
        // Another daemon sharing the store is writing a snapshot, or sweeping.
        E::SnapshotsInProgress { .. } | E::GcRunning { .. } => (StatusCode::CONFLICT, "SNAPSHOT::BUSY"),
        // The store holds a manifest this node's key did not sign: refused
        // content, as an unsafe image layer is (the message names the snapshot).
        E::Tampered { .. } => (StatusCode::UNPROCESSABLE_ENTITY, "SNAPSHOT::TAMPERED"),
        // More file data than the target's quota: refused before writing.
        E::TooLarge { .. } => (StatusCode::UNPROCESSABLE_ENTITY, "SNAPSHOT::TOO_LARGE"),
        _ => (StatusCode::INTERNAL_SERVER_ERROR, "SNAPSHOT::ERROR"),
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = ErrorBody { code: self.code.to_string(), message: self.message };
        (self.status, axum::Json(body)).into_response()
    }
}
