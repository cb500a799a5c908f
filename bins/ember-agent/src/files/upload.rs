//! `POST /files/upload`: multipart pairs of a `metadata` part (JSON
//! `{path, owner, group, mode}`) and a `file` part, paired by order.
//!
//! The SDK streams the body with `Transfer-Encoding: chunked` and no
//! Content-Length; parts are read as they arrive and file contents go
//! straight to disk, so an upload never sits whole in memory.
use super::{apply_permission, wire_mode, with_fs};
use crate::error::{ApiError, ApiResult, ErrorCode};
use crate::server::App;
use axum::extract::multipart::{Field, MultipartRejection};
use axum::extract::{Multipart, State};
use ember_types::execd::FileMetadata;
use std::collections::VecDeque;
use std::path::PathBuf;
use tokio::io::{AsyncWriteExt, BufWriter};

/// The SDK's default mode for written files.
const DEFAULT_MODE: u32 = 0o755;
/// A metadata part is a small JSON object; anything bigger is refused.
const MAX_METADATA: usize = 64 * 1024;

pub async fn upload(State(app): State<App>, form: Result<Multipart, MultipartRejection>) -> ApiResult<()> {
    let mut form = form.map_err(|e| ApiError::new(ErrorCode::InvalidFile, format!("invalid multipart form: {e}")))?;
    // Metadata parts not yet matched with a file part, oldest first.
    let mut pending: VecDeque<FileMetadata> = VecDeque::new();
    let mut written = 0usize;
    while let Some(field) = form.next_field().await.map_err(bad_part)? {
        match field.name() {
            Some("metadata") => pending.push_back(read_metadata(field).await?),
            Some("file") => {
                let meta = pending.pop_front().ok_or_else(|| {
                    ApiError::new(ErrorCode::InvalidFileMetadata, "file part without a preceding metadata part")
                })?;
                write_file(&app, meta, field).await?;
                written += 1;
            }
            // Unknown parts are skipped (and drained by the parser).
            _ => {}
        }
    }
    if !pending.is_empty() {
        let msg = format!("metadata and file count mismatch: {} vs {}", written + pending.len(), written);
        return Err(ApiError::new(ErrorCode::InvalidFile, msg));
    }
    if written == 0 {
        return Err(ApiError::new(ErrorCode::InvalidFileMetadata, "metadata file is missing"));
    }
    Ok(())
}

/// Middleware of the upload route: the body is read to its end even after
/// the handler is done with it. The multipart parser stops at the closing
/// boundary, before the chunked body's terminator; answering then would make
/// hyper close the connection under a client (the daemon's proxy) that is
/// still writing the last bytes, and that client would see a broken pipe
/// instead of the answer.
pub async fn read_to_end(req: axum::extract::Request, next: axum::middleware::Next) -> axum::response::Response {
    use futures_util::StreamExt;
    let (parts, body) = req.into_parts();
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<bytes::Bytes, axum::Error>>(4);
    tokio::spawn(async move {
        let mut stream = body.into_data_stream();
        let mut forwarding = true;
        while let Some(chunk) = stream.next().await {
            if forwarding && tx.send(chunk).await.is_err() {
                forwarding = false;
            }
        }
    });
    let stream = futures_util::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|c| (c, rx)) });
    next.run(axum::extract::Request::from_parts(parts, axum::body::Body::from_stream(stream))).await
}

fn bad_part(e: axum::extract::multipart::MultipartError) -> ApiError {
    ApiError::new(ErrorCode::InvalidFileContent, format!("error reading multipart body: {e}"))
}

async fn read_metadata(mut field: Field<'_>) -> ApiResult<FileMetadata> {
    let mut buf = Vec::new();
    while let Some(chunk) = field.chunk().await.map_err(bad_part)? {
        buf.extend_from_slice(&chunk);
        if buf.len() > MAX_METADATA {
            return Err(ApiError::new(ErrorCode::InvalidFileMetadata, "metadata part too large"));
        }
    }
    let meta: FileMetadata = serde_json::from_slice(&buf)
        .map_err(|e| ApiError::new(ErrorCode::InvalidFileMetadata, format!("invalid metadata format. {e}")))?;
    if meta.path.as_deref().is_none_or(str::is_empty) {
        return Err(ApiError::new(ErrorCode::InvalidFileMetadata, "metadata path is empty"));
    }
    Ok(meta)
}

/// Streams one file part to its path, then applies mode (default 755) and
/// owner (default: the command user).
async fn write_file(app: &App, meta: FileMetadata, mut field: Field<'_>) -> ApiResult<()> {
    let raw = meta.path.clone().unwrap_or_default();
    let mode = wire_mode(&raw, meta.mode)?.unwrap_or(DEFAULT_MODE);
    let r = raw.clone();
    let (file, path): (std::fs::File, PathBuf) = with_fs(app, move |fs| {
        let path = fs.resolve(&r)?;
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).map_err(|e| ApiError::io("mkdir", &r, &e))?;
        }
        let file = std::fs::File::create(&path).map_err(|e| ApiError::io("create", &r, &e))?;
        Ok((file, path))
    })
    .await?;
    // Few, large writes: each write of a tokio File is a blocking-pool hop.
    let mut out = BufWriter::with_capacity(1 << 20, tokio::fs::File::from_std(file));
    while let Some(chunk) = field.chunk().await.map_err(bad_part)? {
        out.write_all(&chunk).await.map_err(|e| ApiError::io("write", &raw, &e))?;
    }
    out.flush().await.map_err(|e| ApiError::io("write", &raw, &e))?;
    drop(out);
    with_fs(app, move |fs| {
        apply_permission(&path, Some(mode), &meta, &fs.db, fs.resolver.default_owner)
            .map_err(|e| ApiError::io("chmod", &raw, &e))
    })
    .await
}
