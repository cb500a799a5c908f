//! Recursive search and directory listing. Neither follows symlinks, so
//! neither can loop or escape the tree it was asked about.
use super::{file_info, required_path, with_fs, Fs};
use crate::error::{ApiError, ApiResult};
use crate::query::Query;
use crate::server::App;
use axum::extract::{RawQuery, State};
use axum::Json;
use ember_types::execd::FileInfo;
use std::path::Path;

/// `GET /files/search?path=<root>&pattern=<glob>`: files (not directories)
/// under `root` whose name matches `pattern` (default `**`). A pattern with
/// a `/` is matched against the path relative to `root` instead.
pub async fn search(State(app): State<App>, RawQuery(q): RawQuery) -> ApiResult<Json<Vec<FileInfo>>> {
    let q = Query::parse(q.as_deref());
    let raw = required_path(&q)?;
    let pattern = q.get("pattern").filter(|p| !p.is_empty()).unwrap_or("**").to_string();
    let glob =
        glob::Pattern::new(&pattern).map_err(|e| ApiError::bad_request(format!("invalid pattern {pattern}: {e}")))?;
    with_fs(&app, move |fs| {
        let root = fs.resolve(&raw)?;
        std::fs::metadata(&root).map_err(|e| ApiError::io("stat", &raw, &e))?;
        let mut out = Vec::new();
        let by_path = pattern.contains('/');
        search_dir(fs, &root, &root, &glob, by_path, &mut out)?;
        Ok(Json(out))
    })
    .await
}

fn search_dir(
    fs: &Fs,
    root: &Path,
    dir: &Path,
    glob: &glob::Pattern,
    by_path: bool,
    out: &mut Vec<FileInfo>,
) -> ApiResult<()> {
    for (path, meta) in sorted_entries(dir)? {
        if meta.is_dir() {
            // An unreadable subdirectory hides its files, it does not fail
            // the whole search.
            let _ = search_dir(fs, root, &path, glob, by_path, out);
            continue;
        }
        let subject = if by_path {
            path.strip_prefix(root).unwrap_or(&path)
        } else {
            Path::new(path.file_name().unwrap_or_default())
        };
        if glob.matches_path(subject) {
            out.push(file_info(&path, &meta, &fs.db));
        }
    }
    Ok(())
}

/// `GET /directories/list?path=&depth=1`: entries below `path` (excluded) in
/// lexical order, each directory's descendants right after it, down to
/// `depth` levels. A symlink as `path` is refused rather than followed.
pub async fn list(State(app): State<App>, RawQuery(q): RawQuery) -> ApiResult<Json<Vec<FileInfo>>> {
    let q = Query::parse(q.as_deref());
    let raw = required_path(&q)?;
    let depth = match q.get("depth").filter(|d| !d.is_empty()) {
        None => 1,
        Some(d) => {
            d.parse::<u32>().map_err(|_| ApiError::bad_request(format!("invalid query parameter 'depth': {d}")))?
        }
    };
    with_fs(&app, move |fs| {
        let root = fs.resolve(&raw)?;
        let meta = std::fs::symlink_metadata(&root).map_err(|e| ApiError::io("stat", &raw, &e))?;
        if meta.file_type().is_symlink() {
            return Err(ApiError::bad_request(format!("path is a symbolic link, refusing to traverse: {raw}")));
        }
        if !meta.is_dir() {
            return Err(ApiError::bad_request(format!("path is not a directory: {raw}")));
        }
        let mut out = Vec::new();
        list_dir(fs, &root, depth, &mut out)?;
        Ok(Json(out))
    })
    .await
}

fn list_dir(fs: &Fs, dir: &Path, levels: u32, out: &mut Vec<FileInfo>) -> ApiResult<()> {
    if levels == 0 {
        return Ok(());
    }
    for (path, meta) in sorted_entries(dir)? {
        out.push(file_info(&path, &meta, &fs.db));
        if meta.is_dir() {
            list_dir(fs, &path, levels - 1, out)?;
        }
    }
    Ok(())
}

/// A directory's entries with their `lstat` metadata, sorted by name.
/// Entries that vanish while we look are skipped.
fn sorted_entries(dir: &Path) -> ApiResult<Vec<(std::path::PathBuf, std::fs::Metadata)>> {
    let shown = dir.display().to_string();
    let rd = std::fs::read_dir(dir).map_err(|e| ApiError::io("read directory", &shown, &e))?;
    let mut entries: Vec<_> = rd
        .filter_map(Result::ok)
        .filter_map(|e| {
            let path = e.path();
            std::fs::symlink_metadata(&path).ok().map(|m| (path, m))
        })
        .collect();
    entries.sort_by(|a, b| a.0.file_name().cmp(&b.0.file_name()));
    Ok(entries)
}
