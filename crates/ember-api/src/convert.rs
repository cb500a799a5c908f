//! Wire ↔ engine conversions and RFC 3339 times.
use crate::error::ApiError;
use ember_engine::{CreateSandbox, HostVolumeRequest, SandboxRecord, WorkspaceRequest};
use ember_types::api::{
    CreateSandboxRequest, ImageSpec, LaunchInfo, MountedWorkspaceInfo, PvcVolume, SandboxInfo, SandboxStatus, Volume,
};
use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;

pub fn rfc3339(ms: i64) -> String {
    OffsetDateTime::from_unix_timestamp_nanos(ms as i128 * 1_000_000)
        .ok()
        .and_then(|t| t.format(&Rfc3339).ok())
        .unwrap_or_default()
}

pub fn parse_rfc3339_ms(s: &str) -> Result<i64, ApiError> {
    let t = OffsetDateTime::parse(s, &Rfc3339).map_err(|e| {
        ApiError::new(
            axum::http::StatusCode::BAD_REQUEST,
            "SANDBOX::INVALID_EXPIRATION",
            format!("expiresAt {s:?}: {e}"),
        )
    })?;
    Ok((t.unix_timestamp_nanos() / 1_000_000) as i64)
}

/// `status.message` of a checkpointed sandbox.
pub const CHECKPOINTED: &str = "checkpointed to disk; resume restores it";

pub fn sandbox_info(r: &SandboxRecord) -> SandboxInfo {
    SandboxInfo {
        id: r.id.to_string(),
        status: SandboxStatus {
            state: r.state.as_str().to_string(),
            reason: r.reason.as_ref().map(|x| x.code()),
            // A checkpointed sandbox reads Paused; the message says which kind.
            message: r.message.clone().or_else(|| {
                (r.lifecycle == ember_types::lifecycle::Lifecycle::Checkpointed).then(|| CHECKPOINTED.to_string())
            }),
            last_transition_at: Some(rfc3339(r.last_transition_ms)),
        },
        entrypoint: r.spec.entrypoint.clone(),
        created_at: rfc3339(r.created_at_ms),
        expires_at: r.expires_at_ms.map(rfc3339),
        image: Some(ImageSpec { uri: r.image_uri.clone().unwrap_or_else(|| r.spec.template.clone()), auth: None }),
        metadata: r.spec.metadata.clone(),
        template: r.spec.template.clone(),
        runtime_class: r.spec.runtime_class.clone(),
        resources: r.spec.resources.clone(),
        launch: r.launch.as_ref().map(|l| LaunchInfo {
            kind: l.kind.clone(),
            micros: l.micros,
            phases: l.phases.clone(),
        }),
        workspaces: r
            .workspaces
            .iter()
            .map(|w| MountedWorkspaceInfo {
                name: w.name.clone(),
                mount_path: w.path.clone(),
                read_only: w.read_only,
                epoch: w.epoch,
            })
            .collect(),
        network: (r.spec.network == ember_types::NetworkMode::Egress).then(|| "egress".to_string()),
        snapshot_id: r.snapshot_id.clone(),
        secrets: r.spec.secret_names.clone(),
    }
}

/// OpenSandbox's create body and ember's extra fields → one engine request.
pub fn create_request(req: CreateSandboxRequest) -> Result<CreateSandbox, ApiError> {
    if req.snapshot_id.is_some() && (req.image.is_some() || req.template.is_some() || req.template_id.is_some()) {
        return Err(ApiError::bad_request("give exactly one of image, templateId and snapshotId"));
    }
    if req.secure_access == Some(true) {
        return Err(ApiError::not_supported("secureAccess: ember has no ingress gateway; use the API key"));
    }
    let (mut volumes, mut pvcs) = (Vec::new(), Vec::new());
    for v in req.volumes.unwrap_or_default() {
        match volume(v)? {
            Mount::Host(h) => volumes.push(h),
            Mount::Workspace(w) => pvcs.push(w),
        }
    }
    let limits = req.resource_limits.unwrap_or_default();
    let res = req.resources.unwrap_or_default();
    let template = req.template.or(req.template_id);
    let image_auth = match req.image.as_ref().and_then(|i| i.auth.clone()) {
        None => None,
        Some(a) => Some(
            serde_json::from_value(a)
                .map_err(|e| ApiError::bad_request(format!("image.auth: {e} (expected username+password or token)")))?,
        ),
    };
    let image_uri = req.image.map(|i| i.uri);
    if template.is_some() && image_uri.is_some() && template != image_uri {
        return Err(ApiError::bad_request("give either a template or an image, not both"));
    }
    if let Some(k) = limits.keys().find(|k| !["cpu", "memory"].contains(&k.as_str())) {
        return Err(ApiError::bad_request(format!("resourceLimits.{k} is not supported (cpu and memory are)")));
    }
    let (network, egress) = crate::network::parse(req.network.as_deref(), &req.allow, req.network_policy.is_some())?;
    Ok(CreateSandbox {
        network,
        egress,
        template,
        image_uri,
        memory: res.memory.or_else(|| limits.get("memory").cloned()),
        cpu: res.cpu.or_else(|| limits.get("cpu").cloned()),
        pids: res.pids,
        disk: res.disk,
        ttl_secs: req.timeout,
        env: req.env.unwrap_or_default().into_iter().filter_map(|(k, v)| Some((k, v?))).collect(),
        metadata: req.metadata.unwrap_or_default(),
        entrypoint: req.entrypoint.unwrap_or_default(),
        user: req.user,
        runtime_class: req.runtime_class,
        image_auth,
        network_policy: req.network_policy,
        volumes,
        pool: req.extensions.as_ref().and_then(|e| e.get("poolRef").cloned()),
        rebind: restart_policy(req.extensions.as_ref())?,
        id: None,
        launch: ember_engine::LaunchMode::Any,
        snapshot_id: req.snapshot_id,
        secrets: req.secrets.unwrap_or_default(),
        auto_pause_secs: req.auto_pause.map(|a| a.after_seconds),
        auto_pause_checkpoint: req.auto_pause.is_some_and(|a| a.checkpoint),
        // The caller's, set by the handler from its key (never the body).
        tenant: None,
        workspaces: req
            .workspaces
            .into_iter()
            .map(|w| {
                let path = w.mount_path.unwrap_or_else(|| "/workspace".into());
                if !path.starts_with('/') || path.split('/').any(|c| c == "..") {
                    return Err(ApiError::bad_request(format!(
                        "workspace mountPath {path:?} must be absolute, without '..'"
                    )));
                }
                Ok(ember_engine::WorkspaceRequest {
                    name: w.name,
                    path,
                    read_only: w.read_only,
                    steal: w.steal,
                    create_size: None,
                    layered: false,
                })
            })
            .chain(pvcs.into_iter().map(Ok))
            .collect::<Result<_, _>>()?,
    })
}

/// A volume of the create request, by backend.
enum Mount {
    Host(HostVolumeRequest),
    Workspace(WorkspaceRequest),
}

/// The size of a workspace a `pvc` volume creates without `storage`.
const DEFAULT_PVC_BYTES: u64 = 1 << 30;

/// `extensions.restartPolicy`: `rebind` re-creates the sandbox on a live
/// node of a cluster when its node dies (docs/cluster.md); `never` (or none)
/// is the default.
fn restart_policy(ext: Option<&std::collections::BTreeMap<String, String>>) -> Result<bool, ApiError> {
    match ext.and_then(|e| e.get("restartPolicy")).map(String::as_str) {
        None | Some("never") => Ok(false),
        Some("rebind") => Ok(true),
        Some(other) => {
            Err(ApiError::bad_request(format!("extensions.restartPolicy {other:?}: expected \"rebind\" or \"never\"")))
        }
    }
}

/// `host` volumes bind a host directory under the allow-list; `pvc` volumes
/// are ember workspaces (`claimName` = workspace name), created on demand
/// unless `createIfNotExists` is false, as upstream's default; `ossfs` does
/// not exist here.
fn volume(v: Volume) -> Result<Mount, ApiError> {
    let backends = [v.host.is_some(), v.pvc.is_some(), v.ossfs.is_some()].iter().filter(|b| **b).count();
    if backends != 1 {
        return Err(ApiError::new(
            axum::http::StatusCode::BAD_REQUEST,
            "VOLUME::INVALID_BACKEND",
            format!("volume {:?}: exactly one of host, pvc, ossfs is needed", v.name),
        ));
    }
    if let Some(pvc) = v.pvc {
        return pvc_volume(&v.name, pvc, v.mount_path, v.read_only, v.sub_path).map(Mount::Workspace);
    }
    let Some(host) = v.host else {
        return Err(ApiError::not_supported(format!("volume {:?}: the ossfs backend is not supported", v.name)));
    };
    Ok(Mount::Host(HostVolumeRequest {
        name: v.name,
        host_path: host.path,
        sub_path: v.sub_path,
        mount_path: v.mount_path,
        read_only: v.read_only,
    }))
}

fn pvc_volume(
    name: &str,
    pvc: PvcVolume,
    mount_path: String,
    read_only: bool,
    sub_path: Option<String>,
) -> Result<WorkspaceRequest, ApiError> {
    let bad = |m: String| ApiError::new(axum::http::StatusCode::BAD_REQUEST, "VOLUME::INVALID_PARAMETER", m);
    if sub_path.as_deref().is_some_and(|s| !s.is_empty()) {
        // A subdirectory of a workspace the sandbox can write could be a
        // symlink out of it; mounting one safely is not done yet.
        return Err(ApiError::not_supported(format!("volume {name:?}: subPath is not supported for pvc volumes")));
    }
    if pvc.delete_on_sandbox_termination == Some(true) {
        return Err(ApiError::not_supported(format!(
            "volume {name:?}: deleteOnSandboxTermination is not supported (workspaces outlive sandboxes; \
             DELETE /v1/workspaces/{{name}} removes one)"
        )));
    }
    if !mount_path.starts_with('/') || mount_path.split('/').any(|c| c == "..") {
        return Err(bad(format!("volume {name:?}: mountPath {mount_path:?} must be absolute, without '..'")));
    }
    let create_size = match pvc.create_if_not_exists {
        Some(false) => None,
        _ => Some(match pvc.storage.as_deref() {
            None => DEFAULT_PVC_BYTES,
            Some(s) => ember_types::parse_memory_bytes(s).map_err(|e| bad(format!("volume {name:?}: storage: {e}")))?,
        }),
    };
    Ok(WorkspaceRequest {
        name: pvc.claim_name,
        path: mount_path,
        read_only,
        steal: false,
        create_size,
        layered: false,
    })
}
