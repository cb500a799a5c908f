//! The small file mutations: delete, chmod/chown, move, mkdir, rm -rf and
//! search-and-replace.
use super::{apply_permission, wire_mode, with_fs};
use crate::error::{ApiError, ApiResult, JsonBody};
use crate::query::Query;
use crate::server::App;
use axum::extract::{RawQuery, State};
use axum::response::{IntoResponse, Response};
use axum::Json;
use ember_types::execd::{FileMetadata, RenameFileItem, ReplaceFileContentItem, ReplaceFileContentResult};
use std::collections::BTreeMap;
use std::io;
use std::path::Path;

/// Mode of directories created without one (the SDK's default).
const DEFAULT_MODE: u32 = 0o755;

/// `DELETE /files?path=`: removes files (and symlinks); a missing file is
/// not an error, a directory is.
pub async fn remove_files(State(app): State<App>, RawQuery(q): RawQuery) -> ApiResult<()> {
    let paths = Query::parse(q.as_deref()).all("path");
    with_fs(&app, move |fs| {
        for raw in &paths {
            let path = fs.resolve(raw)?;
            match std::fs::symlink_metadata(&path) {
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) => return Err(ApiError::io("stat", raw, &e)),
                Ok(m) if m.is_dir() => {
                    return Err(ApiError::runtime(format!("error removing file {raw}: path is a directory")))
                }
                Ok(_) => std::fs::remove_file(&path).map_err(|e| ApiError::io("remove", raw, &e))?,
            }
        }
        Ok(())
    })
    .await
}

/// `POST /files/permissions` `{path: {mode, owner?, group?}}`.
pub async fn chmod(State(app): State<App>, JsonBody(req): JsonBody<BTreeMap<String, FileMetadata>>) -> ApiResult<()> {
    with_fs(&app, move |fs| {
        for (raw, perm) in &req {
            let mode = wire_mode(raw, perm.mode)?;
            let path = fs.resolve(raw)?;
            std::fs::symlink_metadata(&path).map_err(|e| ApiError::io("stat", raw, &e))?;
            apply_permission(&path, mode, perm, &fs.db, None).map_err(|e| ApiError::io("chmod", raw, &e))?;
        }
        Ok(())
    })
    .await
}

/// `POST /files/mv` `[{src, dest}]`: the destination's parent is created;
/// an existing destination is refused.
pub async fn rename(State(app): State<App>, JsonBody(req): JsonBody<Vec<RenameFileItem>>) -> ApiResult<()> {
    with_fs(&app, move |fs| {
        for item in &req {
            let (src, dest) = (fs.resolve(&item.src)?, fs.resolve(&item.dest)?);
            std::fs::symlink_metadata(&src).map_err(|e| ApiError::io("stat", &item.src, &e))?;
            if std::fs::symlink_metadata(&dest).is_ok() {
                return Err(ApiError::runtime(format!("destination path already exists: {}", item.dest)));
            }
            if let Some(parent) = dest.parent() {
                std::fs::create_dir_all(parent).map_err(|e| ApiError::io("mkdir", &item.dest, &e))?;
            }
            move_path(&src, &dest).map_err(|e| ApiError::io("rename", &item.src, &e))?;
        }
        Ok(())
    })
    .await
}

/// rename(2), falling back to copy and delete for a file moved across
/// filesystems (e.g. from a tmpfs /tmp into the workspace).
fn move_path(src: &Path, dest: &Path) -> io::Result<()> {
    match std::fs::rename(src, dest) {
        Err(e) if e.raw_os_error() == Some(18 /* EXDEV */) && src.is_file() => {
            std::fs::copy(src, dest)?;
            std::fs::remove_file(src)
        }
        r => r,
    }
}

/// `POST /directories` `{path: {mode, owner?, group?}}`: mkdir -p, then the
/// mode (default 755) and owner (default: the command user) of the leaf.
pub async fn mkdir(State(app): State<App>, JsonBody(req): JsonBody<BTreeMap<String, FileMetadata>>) -> ApiResult<()> {
    with_fs(&app, move |fs| {
        for (raw, perm) in &req {
            let mode = wire_mode(raw, perm.mode)?.unwrap_or(DEFAULT_MODE);
            let path = fs.resolve(raw)?;
            std::fs::create_dir_all(&path).map_err(|e| ApiError::io("mkdir", raw, &e))?;
            apply_permission(&path, Some(mode), perm, &fs.db, fs.resolver.default_owner)
                .map_err(|e| ApiError::io("chmod", raw, &e))?;
        }
        Ok(())
    })
    .await
}

/// `DELETE /directories?path=`: rm -rf; missing paths are fine.
pub async fn remove_dirs(State(app): State<App>, RawQuery(q): RawQuery) -> ApiResult<()> {
    let paths = Query::parse(q.as_deref()).all("path");
    with_fs(&app, move |fs| {
        for raw in &paths {
            let path = fs.resolve(raw)?;
            let r = match std::fs::symlink_metadata(&path) {
                Ok(m) if m.is_dir() => std::fs::remove_dir_all(&path),
                Ok(_) => std::fs::remove_file(&path),
                Err(e) => Err(e),
            };
            match r {
                Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(ApiError::io("remove", raw, &e)),
                _ => {}
            }
        }
        Ok(())
    })
    .await
}

/// `POST /files/replace[?verbose=true]` `{path: {old, new}}`: replaces every
/// occurrence, byte-wise, keeping the file's inode, mode and owner.
pub async fn replace(
    State(app): State<App>,
    RawQuery(q): RawQuery,
    JsonBody(req): JsonBody<BTreeMap<String, ReplaceFileContentItem>>,
) -> ApiResult<Response> {
    let verbose = Query::parse(q.as_deref()).get("verbose") == Some("true");
    if let Some((raw, _)) = req.iter().find(|(_, item)| item.old.is_empty()) {
        return Err(ApiError::bad_request(format!("old content must not be empty ({raw})")));
    }
    let counts = with_fs(&app, move |fs| {
        let mut counts = BTreeMap::new();
        for (raw, item) in &req {
            let path = fs.resolve(raw)?;
            let data = std::fs::read(&path).map_err(|e| ApiError::io("read", raw, &e))?;
            let (out, n) = replace_all(&data, item.old.as_bytes(), item.new.as_bytes());
            if n > 0 {
                std::fs::write(&path, out).map_err(|e| ApiError::io("write", raw, &e))?;
            }
            counts.insert(raw.clone(), ReplaceFileContentResult { replaced_count: n });
        }
        Ok(counts)
    })
    .await?;
    Ok(if verbose { Json(counts).into_response() } else { ().into_response() })
}

/// Non-overlapping, left-to-right replacement (Go's strings.ReplaceAll).
fn replace_all(data: &[u8], old: &[u8], new: &[u8]) -> (Vec<u8>, u64) {
    let mut out = Vec::with_capacity(data.len());
    let mut count = 0;
    let mut i = 0;
    while i < data.len() {
        if data[i..].starts_with(old) {
            out.extend_from_slice(new);
            i += old.len();
            count += 1;
        } else {
            out.push(data[i]);
            i += 1;
        }
    }
    (out, count)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replace_all_is_non_overlapping() {
        assert_eq!(replace_all(b"aaaa", b"aa", b"b"), (b"bb".to_vec(), 2));
        assert_eq!(replace_all(b"x-y-z", b"-", b"--"), (b"x--y--z".to_vec(), 2));
        assert_eq!(replace_all(b"abc", b"zz", b""), (b"abc".to_vec(), 0));
    }
}
