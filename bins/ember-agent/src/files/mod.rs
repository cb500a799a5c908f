//! File and directory routes (protocol §3.4).
//!
//! Layout: this file holds path resolution, FileInfo and ownership helpers
//! and `/files/info`; `ops` the small mutations, `walk` search and listing,
//! `upload` and `download` the transfers. All file IO runs on tokio's
//! blocking pool, never on the runtime thread.
pub mod download;
pub mod ops;
pub mod upload;
pub mod walk;

use crate::config::AgentConfig;
use crate::error::{ApiError, ApiResult};
use crate::paths;
use crate::query::Query;
use crate::server::App;
use crate::stream::rfc3339;
use crate::users::UserDb;
use axum::extract::{RawQuery, State};
use axum::Json;
use ember_types::execd::{mode_from_wire, mode_to_wire, FileInfo, FileMetadata};
use std::collections::BTreeMap;
use std::fs::Metadata;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, UNIX_EPOCH};

/// Runs blocking file work off the runtime thread.
pub async fn blocking<T: Send + 'static>(f: impl FnOnce() -> ApiResult<T> + Send + 'static) -> ApiResult<T> {
    tokio::task::spawn_blocking(f).await.map_err(|e| ApiError::runtime(format!("file task failed: {e}")))?
}

/// What file handlers work with: the user database and the path resolver.
pub struct Fs {
    pub db: UserDb,
    pub resolver: Resolver,
}

impl Fs {
    pub fn resolve(&self, raw: &str) -> ApiResult<PathBuf> {
        self.resolver.resolve(raw)
    }
}

tokio::task_local! {
    /// The (uid, gid) of an identity-scoped request (`/v1/filesystem/{uid}/{gid}/...`),
    /// set by [`identity_scope`] around the handler.
    static FS_IDENTITY: (u32, u32);
}

/// Middleware of the identity-scoped file routes: every file operation of the
/// request runs with that uid/gid as the thread's filesystem identity, so the
/// kernel checks permissions as for that user (no root override).
pub async fn identity_scope(
    axum::extract::Path(params): axum::extract::Path<Vec<(String, String)>>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    use axum::response::IntoResponse;
    let get = |k: &str| params.iter().find(|(n, _)| n == k).and_then(|(_, v)| v.parse::<u32>().ok());
    match (get("uid"), get("gid")) {
        (Some(uid), Some(gid)) => FS_IDENTITY.scope((uid, gid), next.run(req)).await,
        _ => ApiError::bad_request("uid and gid must be non-negative integers").into_response(),
    }
}

/// Runs `f` on the blocking pool with a fresh [`Fs`] (the user database is
/// re-read so changes made inside the sandbox are seen), as the request's
/// filesystem identity when it has one.
pub async fn with_fs<T: Send + 'static>(
    app: &App,
    f: impl FnOnce(&Fs) -> ApiResult<T> + Send + 'static,
) -> ApiResult<T> {
    let config = app.config.clone();
    let identity = FS_IDENTITY.try_with(|i| *i).ok();
    blocking(move || {
        let db = UserDb::load();
        let mut resolver = Resolver::new(&config, &db);
        let _guard = match identity {
            Some((uid, gid)) => {
                resolver.default_owner = Some((uid, gid));
                let groups = db.groups_of(db.user_by_uid(uid), gid);
                let g = ember_sys::process::ThreadFsIdentity::enter(uid, gid, &groups)
                    .map_err(|e| ApiError::runtime(format!("switch to uid {uid} gid {gid}: {e}")))?;
                Some(g)
            }
            None => None,
        };
        f(&Fs { db, resolver })
    })
    .await
}

/// How user paths are resolved: `$VAR` from the sandbox env, `~` to the
/// default user's home, relative paths against the agent's cwd.
#[derive(Clone)]
pub struct Resolver {
    env: Vec<(String, String)>,
    home: PathBuf,
    /// Owner given to created files and directories when the request names
    /// none: the default command identity, so commands can modify them.
    pub default_owner: Option<(u32, u32)>,
}

impl Resolver {
    pub fn new(config: &AgentConfig, db: &UserDb) -> Resolver {
        let env = config
            .base_env
            .iter()
            .map(|(k, v)| (k.to_string_lossy().into_owned(), v.to_string_lossy().into_owned()))
            .collect();
        let ident = config.default_identity;
        let user = ident.and_then(|i| db.user_by_uid(i.uid));
        let home = match user {
            Some(u) => u.home.clone(),
            None => PathBuf::from(config.env_var("HOME").unwrap_or_else(|| "/".into())),
        };
        let default_owner = ident.map(|i| (i.uid, i.gid.or(user.map(|u| u.gid)).unwrap_or(i.uid)));
        Resolver { env, home, default_owner }
    }

    pub fn resolve(&self, raw: &str) -> ApiResult<PathBuf> {
        if raw.is_empty() {
            return Err(ApiError::bad_request("empty path"));
        }
        let lookup = |k: &str| self.env.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
        let p = paths::expand(raw, lookup, &self.home).map_err(ApiError::bad_request)?;
        std::path::absolute(&p).map_err(|e| ApiError::bad_request(format!("bad path {raw}: {e}")))
    }
}

/// Builds FileInfo from `lstat` metadata (symlinks are reported as such).
pub fn file_info(path: &Path, meta: &Metadata, db: &UserDb) -> FileInfo {
    let ft = meta.file_type();
    let kind = if ft.is_symlink() {
        "symlink"
    } else if ft.is_dir() {
        "directory"
    } else if ft.is_file() {
        "file"
    } else {
        "other"
    };
    let ctime = UNIX_EPOCH + Duration::new(meta.ctime().max(0) as u64, meta.ctime_nsec().clamp(0, 999_999_999) as u32);
    FileInfo {
        path: path.display().to_string(),
        size: meta.len() as i64,
        modified_at: rfc3339(meta.modified().unwrap_or(UNIX_EPOCH)),
        // Birth time where the filesystem records it, else the inode change
        // time as execd reports.
        created_at: rfc3339(meta.created().unwrap_or(ctime)),
        owner: db.user_name(meta.uid()),
        group: db.group_name(meta.gid()),
        mode: mode_to_wire(meta.permissions().mode() & 0o777),
        kind: Some(kind.to_string()),
    }
}

/// Parses a wire mode (octal digits, e.g. 755); `None` if absent or 0.
pub fn wire_mode(path: &str, mode: Option<u32>) -> ApiResult<Option<u32>> {
    match mode {
        None | Some(0) => Ok(None),
        Some(m) => mode_from_wire(m)
            .map(Some)
            .ok_or_else(|| ApiError::bad_request(format!("invalid mode {m} for {path}: expected octal digits"))),
    }
}

/// Applies mode and ownership. Names that do not resolve are ignored, as
/// execd does; with neither owner nor group, `fallback` (if any) is used.
pub fn apply_permission(
    path: &Path,
    mode: Option<u32>,
    meta: &FileMetadata,
    db: &UserDb,
    fallback: Option<(u32, u32)>,
) -> std::io::Result<()> {
    if let Some(mode) = mode {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))?;
    }
    let named = |v: &Option<String>| v.as_deref().filter(|s| !s.is_empty()).map(str::to_string);
    let (owner, group) = (named(&meta.owner), named(&meta.group));
    let (uid, gid) = if owner.is_none() && group.is_none() {
        fallback.map_or((None, None), |(u, g)| (Some(u), Some(g)))
    } else {
        (owner.and_then(|o| db.resolve_user(&o)), group.and_then(|g| db.resolve_group(&g)))
    };
    if uid.is_some() || gid.is_some() {
        std::os::unix::fs::chown(path, uid, gid)?;
    }
    Ok(())
}

/// `GET /files/info?path=a&path=b` → `{path: FileInfo}`.
pub async fn info(State(app): State<App>, RawQuery(q): RawQuery) -> ApiResult<Json<BTreeMap<String, FileInfo>>> {
    let paths = Query::parse(q.as_deref()).all("path");
    with_fs(&app, move |fs| {
        let mut out = BTreeMap::new();
        for raw in paths {
            let path = fs.resolve(&raw)?;
            let meta = std::fs::symlink_metadata(&path).map_err(|e| ApiError::io("stat", &raw, &e))?;
            out.insert(raw, file_info(&path, &meta, &fs.db));
        }
        Ok(Json(out))
    })
    .await
}

/// The `path` query parameter, required.
pub fn required_path(q: &Query) -> ApiResult<String> {
    q.get("path").filter(|p| !p.is_empty()).map(str::to_string).ok_or_else(|| ApiError::missing_query("path"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wire_modes() {
        assert_eq!(wire_mode("/x", Some(644)).unwrap(), Some(0o644));
        assert_eq!(wire_mode("/x", Some(0)).unwrap(), None);
        assert!(wire_mode("/x", Some(999)).is_err());
    }

    #[test]
    fn file_info_of_a_directory() {
        let meta = std::fs::symlink_metadata("/").unwrap();
        let fi = file_info(Path::new("/"), &meta, &UserDb::default());
        assert_eq!(fi.kind.as_deref(), Some("directory"));
        assert_eq!(fi.owner, meta.uid().to_string());
        assert!(fi.modified_at.ends_with('Z'));
    }
}
