//! ember's own image and template routes (`/v1/images...`, `/v1/templates...`).
//! Handlers parse into engine calls; errors go through `error.rs`.
use crate::convert::rfc3339;
use crate::error::ApiError;
use crate::{ApiJson, ApiPath, ApiState};
use axum::body::Body;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use ember_image::ImageRecord;
use ember_types::image::*;
use futures_util::StreamExt;
use tokio::io::AsyncWriteExt;

pub fn image_info(r: &ImageRecord) -> ImageInfo {
    ImageInfo {
        name: r.name.clone(),
        digest: r.digest.clone(),
        layers: r
            .layers
            .iter()
            .map(|l| LayerInfo { digest: l.digest.clone(), diff_id: l.diff_id.clone(), size: l.size })
            .collect(),
        size: r.size(),
        config: ImageConfigInfo {
            env: r.config.env.clone(),
            working_dir: r.config.working_dir.clone(),
            user: r.config.user.clone(),
            entrypoint: r.config.entrypoint.clone(),
            cmd: r.config.cmd.clone(),
        },
        created_at: rfc3339(r.created_ms),
        skipped_device_nodes: 0,
        warnings: Vec::new(),
    }
}

/// [`image_info`] with what the unpacker skipped in the image's layers.
async fn with_skipped(st: &ApiState, r: &ImageRecord) -> Result<ImageInfo, ApiError> {
    let mut info = image_info(r);
    let layers = st.engine.image_layers().await?;
    let skipped: u64 = layers
        .iter()
        .filter(|(m, _)| r.layers.iter().any(|l| l.digest == m.digest))
        .map(|(m, _)| m.skipped_devices)
        .sum();
    if skipped > 0 {
        info.warnings.push(format!("{skipped} device nodes skipped (the sandbox gets its own /dev)"));
    }
    info.skipped_device_nodes = skipped;
    Ok(info)
}

pub async fn list(State(st): State<ApiState>) -> Result<Response, ApiError> {
    let items = st.engine.list_images().await?.iter().map(image_info).collect();
    let layers = st
        .engine
        .image_layers()
        .await?
        .into_iter()
        .map(|(m, refs)| LayerStat {
            digest: m.digest,
            size: m.size,
            unpacked_bytes: m.unpacked_bytes,
            images: refs as u64,
        })
        .collect();
    Ok(Json(ImageList { items, layers }).into_response())
}

pub async fn get_one(State(st): State<ApiState>, ApiPath(name): ApiPath<String>) -> Result<Response, ApiError> {
    let rec = st.engine.image(&name).await?;
    Ok(Json(image_info(&rec)).into_response())
}

pub async fn remove(State(st): State<ApiState>, ApiPath(name): ApiPath<String>) -> Result<StatusCode, ApiError> {
    st.engine.remove_image(&name).await?;
    Ok(StatusCode::NO_CONTENT)
}

pub async fn pull(State(st): State<ApiState>, ApiJson(req): ApiJson<PullRequest>) -> Result<Response, ApiError> {
    let rec = st.engine.pull_image(&req.image, req.auth).await?;
    Ok(Json(image_info(&rec)).into_response())
}

pub async fn pulls(State(st): State<ApiState>) -> Result<Response, ApiError> {
    let list: Vec<PullStatus> = st
        .engine
        .image_pulls()
        .await?
        .into_iter()
        .map(|p| PullStatus {
            reference: p.reference,
            layers: p
                .layers
                .into_iter()
                .map(|l| LayerPull {
                    digest: l.digest,
                    size: l.size,
                    downloaded: l.downloaded,
                    state: serde_json::to_value(l.state)
                        .ok()
                        .and_then(|v| v.as_str().map(String::from))
                        .unwrap_or_default(),
                })
                .collect(),
        })
        .collect();
    Ok(Json(list).into_response())
}

pub async fn prune(State(st): State<ApiState>) -> Result<Response, ApiError> {
    let r = st.engine.prune_images().await?;
    Ok(Json(PruneResult { removed_layers: r.removed_layers, freed_bytes: r.freed_bytes }).into_response())
}

#[derive(serde::Deserialize)]
pub struct ImportQuery {
    name: Option<String>,
}

/// The body (a tar: a root filesystem or an OCI image layout) is streamed to a
/// temp file in the image store, imported, and the file removed.
pub async fn import(
    State(st): State<ApiState>,
    Query(q): Query<ImportQuery>,
    body: Body,
) -> Result<Response, ApiError> {
    let name = q.name.filter(|n| !n.is_empty()).ok_or_else(|| ApiError::bad_request("?name=NAME:TAG is required"))?;
    let path = st.engine.image_upload_path();
    let res = async {
        let mut f = tokio::fs::File::create(&path).await.map_err(upload_error)?;
        let mut stream = body.into_data_stream();
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(|e| ApiError::bad_request(format!("reading the upload: {e}")))?;
            f.write_all(&chunk).await.map_err(upload_error)?;
        }
        f.flush().await.map_err(upload_error)?;
        Ok::<_, ApiError>(st.engine.import_image(&name, path.clone()).await?)
    }
    .await;
    let _ = tokio::fs::remove_file(&path).await;
    Ok((StatusCode::CREATED, Json(with_skipped(&st, &res?).await?)).into_response())
}

/// A write of the upload that failed: a full disk (or quota) is the
/// documented 507, as for every other write the daemon makes; anything else is
/// ours.
fn upload_error(e: std::io::Error) -> ApiError {
    let (status, code) = match crate::error::io_full(&e) {
        true => (StatusCode::INSUFFICIENT_STORAGE, "STORE::NO_SPACE"),
        false => (StatusCode::INTERNAL_SERVER_ERROR, "IMAGE::IO_ERROR"),
    };
    ApiError::new(status, code, format!("writing the upload: {e}"))
}

fn template_out(mut t: TemplateInfo) -> TemplateInfo {
    t.created_at = t.created_at.and_then(|ms| ms.parse().ok()).map(rfc3339);
    t
}

pub async fn create_template(
    State(st): State<ApiState>,
    ApiJson(req): ApiJson<TemplateRequest>,
) -> Result<Response, ApiError> {
    let t = st.engine.create_template(req).await?;
    Ok((StatusCode::CREATED, Json(template_out(t))).into_response())
}

pub async fn list_templates(State(st): State<ApiState>) -> Result<Response, ApiError> {
    Ok(Json(st.engine.templates().await?.into_iter().map(template_out).collect::<Vec<_>>()).into_response())
}

/// The template a path names does not exist: a 404, as for every other
/// object a path names (a create naming an unknown template stays a 400
/// `SANDBOX::UNKNOWN_TEMPLATE`: there the body is at fault, not the path).
fn by_path(e: ember_engine::EngineError) -> ApiError {
    match e {
        ember_engine::EngineError::UnknownTemplate(name) => {
            ApiError::new(StatusCode::NOT_FOUND, "TEMPLATE::NOT_FOUND", format!("template {name} not found"))
        }
        e => e.into(),
    }
}

pub async fn get_template(State(st): State<ApiState>, ApiPath(name): ApiPath<String>) -> Result<Response, ApiError> {
    Ok(Json(template_out(st.engine.template(&name).await.map_err(by_path)?)).into_response())
}

pub async fn delete_template(
    State(st): State<ApiState>,
    ApiPath(name): ApiPath<String>,
) -> Result<StatusCode, ApiError> {
    st.engine.delete_template(&name).await.map_err(by_path)?;
    Ok(StatusCode::NO_CONTENT)
}
