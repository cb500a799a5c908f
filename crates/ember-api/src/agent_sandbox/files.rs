//! agent-sandbox's runtime file routes on the router's port 8888, as its
//! Python client (`sandbox.files.write/read/list/exists`) calls them through
//! a direct connection: `POST /upload` (multipart, one `file` part whose
//! filename is the path), `GET /download/{path}`, `GET /list/{path}`,
//! `GET /exists/{path}` (each path percent-encoded as one segment). They are
//! answered by ember's agent inside the sandbox (`/files/upload`,
//! `/files/download`, `/directories/list`, `/files/info`), so relative paths
//! resolve against the sandbox's working directory, as `/execute`'s commands
//! run there; the host never opens a sandbox path.
use crate::error::ApiError;
use crate::ApiState;
use axum::body::Body;
use axum::extract::Request;
use axum::http::{header, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use ember_types::execd::{FileInfo, EXECD_PORT};
use percent_encoding::{percent_decode_str, utf8_percent_encode, NON_ALPHANUMERIC};

/// An upload is held whole before it goes to the agent: at most this much.
pub const MAX_UPLOAD: usize = 64 << 20;
/// A directory listing read back from the agent: at most this much JSON.
const MAX_LISTING: usize = 16 << 20;

/// One of the runtime's file routes, its path decoded.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum FileRoute {
    Upload,
    Download(String),
    List(String),
    Exists(String),
}

impl FileRoute {
    /// The agent's route that answers it (for the key rule and the audit).
    pub(super) fn agent_path(&self) -> &'static str {
        match self {
            FileRoute::Upload => "files/upload",
            FileRoute::Download(_) => "files/download",
            FileRoute::List(_) => "directories/list",
            FileRoute::Exists(_) => "files/info",
        }
    }
}

/// `path` made relative to where `/execute`'s commands run: the template's
/// `workdir`, else the user's home (`~`, as the agent runs commands), so a
/// file written is the file a command sees. The client sends every path
/// relative (it strips a leading `/`).
pub(super) fn beside_commands(path: &str, workdir: Option<&str>) -> String {
    match (path.starts_with('/'), workdir) {
        (true, _) => path.to_string(),
        (false, Some(w)) => format!("{}/{path}", w.trim_end_matches('/')),
        (false, None) => format!("~/{path}"),
    }
}

/// The file route `method path` names, if it is one (`Err`: it is one, with
/// a path that is no UTF-8 text or empty).
pub(super) fn parse(method: &Method, path: &str) -> Option<Result<FileRoute, ApiError>> {
    if method == Method::POST && path == "/upload" {
        return Some(Ok(FileRoute::Upload));
    }
    if method != Method::GET {
        return None;
    }
    let (make, raw): (fn(String) -> FileRoute, &str) = if let Some(r) = path.strip_prefix("/download/") {
        (FileRoute::Download, r)
    } else if let Some(r) = path.strip_prefix("/list/") {
        (FileRoute::List, r)
    } else if let Some(r) = path.strip_prefix("/exists/") {
        (FileRoute::Exists, r)
    } else {
        return None;
    };
    let decoded = match percent_decode_str(raw).decode_utf8() {
        Ok(p) if !p.is_empty() && !p.contains('\0') => p.into_owned(),
        _ => return Some(Err(ApiError::bad_request(format!("{path}: the path is empty or not UTF-8 text")))),
    };
    Some(Ok(make(decoded)))
}

/// Answers `route` for sandbox `id`, whose commands run in `workdir` (its
/// template's; `None`: the user's home).
pub(super) async fn serve(
    st: ApiState,
    id: String,
    route: FileRoute,
    workdir: Option<String>,
    req: Request,
) -> Result<Response, ApiError> {
    let wd = workdir.as_deref();
    match &route {
        FileRoute::Upload => upload(st, id, wd, req).await,
        FileRoute::Download(p) => {
            agent(st, id, Method::GET, route.agent_path(), &beside_commands(p, wd), Body::empty(), None).await
        }
        FileRoute::List(p) => list(st, id, &beside_commands(p, wd)).await,
        FileRoute::Exists(p) => {
            let path = beside_commands(p, wd);
            let resp = agent(st, id, Method::GET, route.agent_path(), &path, Body::empty(), None).await?;
            match resp.status() {
                s if s.is_success() => Ok(axum::Json(serde_json::json!({ "exists": true })).into_response()),
                StatusCode::NOT_FOUND => Ok(axum::Json(serde_json::json!({ "exists": false })).into_response()),
                _ => Ok(resp),
            }
        }
    }
}

/// A call of the agent's file API for `path` (sent as `?path=`).
async fn agent(
    st: ApiState,
    id: String,
    method: Method,
    route: &str,
    path: &str,
    body: Body,
    content_type: Option<String>,
) -> Result<Response, ApiError> {
    let query = utf8_percent_encode(path, NON_ALPHANUMERIC);
    let mut b = Request::builder().method(method).uri(format!("/{route}?path={query}"));
    if let Some(ct) = content_type {
        b = b.header(header::CONTENT_TYPE, ct);
    }
    let req = b.body(body).map_err(|e| super::internal(&e))?;
    crate::proxy::forward_path(st, id, EXECD_PORT, route.into(), req).await
}

/// `GET /list/{path}` → `[{name, size, type, mod_time}]`, the entries right
/// below `path` (files and directories: the client's model has no other kind).
async fn list(st: ApiState, id: String, path: &str) -> Result<Response, ApiError> {
    let resp = agent(st, id, Method::GET, "directories/list", path, Body::empty(), None).await?;
    if !resp.status().is_success() {
        return Ok(resp);
    }
    let body = axum::body::to_bytes(resp.into_body(), MAX_LISTING)
        .await
        .map_err(|e| bad_gateway(format!("the listing (at most {MAX_LISTING} bytes): {e}")))?;
    let entries: Vec<FileInfo> =
        serde_json::from_slice(&body).map_err(|e| bad_gateway(format!("the agent's listing: {e}")))?;
    Ok(axum::Json(legacy_listing(&entries)).into_response())
}

/// The agent's entries as agent-sandbox's runtime lists them.
pub(super) fn legacy_listing(entries: &[FileInfo]) -> Vec<serde_json::Value> {
    use time::format_description::well_known::Rfc3339;
    entries
        .iter()
        .filter(|e| matches!(e.kind.as_deref(), Some("file" | "directory")))
        .map(|e| {
            let name = e.path.rsplit('/').next().unwrap_or(&e.path);
            let at = time::OffsetDateTime::parse(&e.modified_at, &Rfc3339)
                .map_or(0.0, |t| t.unix_timestamp() as f64 + f64::from(t.nanosecond()) / 1e9);
            serde_json::json!({ "name": name, "size": e.size, "type": e.kind, "mod_time": at })
        })
        .collect()
}

/// `POST /upload`: the client's one `file` part (its filename the path),
/// held up to [`MAX_UPLOAD`], then written by the agent.
async fn upload(st: ApiState, id: String, workdir: Option<&str>, req: Request) -> Result<Response, ApiError> {
    let ct = req.headers().get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or_default();
    let boundary = multer::parse_boundary(ct).map_err(|e| ApiError::bad_request(format!("/upload: {e}")))?;
    let limit = multer::SizeLimit::new().whole_stream(MAX_UPLOAD as u64 + 64 * 1024);
    let constraints = multer::Constraints::new().size_limit(limit);
    let mut form = multer::Multipart::with_constraints(req.into_body().into_data_stream(), boundary, constraints);
    while let Some(mut field) = form.next_field().await.map_err(too_big)? {
        if field.name() != Some("file") {
            continue;
        }
        let name = field.file_name().filter(|n| !n.is_empty()).map(str::to_string);
        let name = name.ok_or_else(|| ApiError::bad_request("/upload: the file part has no filename (the path)"))?;
        let mut data = Vec::new();
        while let Some(chunk) = field.chunk().await.map_err(too_big)? {
            if data.len() + chunk.len() > MAX_UPLOAD {
                return Err(too_big(format!("more than {MAX_UPLOAD} bytes")));
            }
            data.extend_from_slice(&chunk);
        }
        let path = beside_commands(&name, workdir);
        let (body, ct) = agent_form(&path, &data);
        let resp = agent(st, id, Method::POST, "files/upload", &path, Body::from(body), Some(ct)).await?;
        if !resp.status().is_success() {
            return Ok(resp);
        }
        let message = format!("File '{name}' uploaded successfully.");
        return Ok(axum::Json(serde_json::json!({ "message": message })).into_response());
    }
    Err(ApiError::bad_request("/upload: no `file` part"))
}

/// The agent's upload form: a `metadata` part naming the path, then the file.
pub(super) fn agent_form(path: &str, data: &[u8]) -> (Vec<u8>, String) {
    let meta = serde_json::json!({ "path": path }).to_string();
    let boundary = boundary_for(data);
    let mut out = Vec::with_capacity(data.len() + meta.len() + 512);
    for (name, ct, content) in
        [("metadata", "application/json", meta.as_bytes()), ("file", "application/octet-stream", data)]
    {
        out.extend_from_slice(format!("--{boundary}\r\n").as_bytes());
        out.extend_from_slice(
            format!(
                "Content-Disposition: form-data; name=\"{name}\"; filename=\"{name}\"\r\nContent-Type: {ct}\r\n\r\n"
            )
            .as_bytes(),
        );
        out.extend_from_slice(content);
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(format!("--{boundary}--\r\n").as_bytes());
    (out, format!("multipart/form-data; boundary={boundary}"))
}

/// A boundary that does not occur in `data`.
fn boundary_for(data: &[u8]) -> String {
    use std::hash::{BuildHasher, Hasher};
    let mut n = 0u64;
    loop {
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u64(n);
        let b = format!("ember-{:016x}{n}", h.finish());
        if !data.windows(b.len()).any(|w| w == b.as_bytes()) {
            return b;
        }
        n += 1;
    }
}

fn too_big(e: impl std::fmt::Display) -> ApiError {
    ApiError::new(
        StatusCode::PAYLOAD_TOO_LARGE,
        "GENERAL::TOO_LARGE",
        format!("/upload (at most {MAX_UPLOAD} bytes): {e}"),
    )
}

fn bad_gateway(message: String) -> ApiError {
    ApiError::new(StatusCode::BAD_GATEWAY, "SANDBOX::AGENT_UNREACHABLE", message)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_routes_are_parsed_with_their_path_decoded() {
        let get = |p: &str| parse(&Method::GET, p).map(|r| r.map_err(drop));
        assert_eq!(get("/download/notes%2Fa%20b.txt"), Some(Ok(FileRoute::Download("notes/a b.txt".into()))));
        assert_eq!(get("/list/."), Some(Ok(FileRoute::List(".".into()))));
        assert_eq!(get("/exists/x"), Some(Ok(FileRoute::Exists("x".into()))));
        assert!(matches!(get("/download/"), Some(Err(_))), "an empty path");
        assert!(matches!(get("/download/%FF"), Some(Err(_))), "not UTF-8");
        assert!(matches!(get("/download/a%00b"), Some(Err(_))), "a NUL");
        assert_eq!(get("/execute"), None);
        assert!(matches!(parse(&Method::POST, "/upload"), Some(Ok(FileRoute::Upload))));
        assert!(parse(&Method::POST, "/download/x").is_none());
    }

    #[test]
    fn relative_paths_are_where_commands_run() {
        assert_eq!(beside_commands("notes/a", None), "~/notes/a");
        assert_eq!(beside_commands("notes/a", Some("/app/")), "/app/notes/a");
        assert_eq!(beside_commands("/etc/x", Some("/app")), "/etc/x");
    }

    #[test]
    fn the_listing_keeps_files_and_directories_by_name() {
        let e = |path: &str, kind: &str| FileInfo {
            path: path.into(),
            size: 3,
            modified_at: "2026-01-01T00:00:01.5Z".into(),
            created_at: String::new(),
            owner: "root".into(),
            group: "root".into(),
            mode: 644,
            kind: Some(kind.into()),
        };
        let out = legacy_listing(&[e("/w/a.txt", "file"), e("/w/d", "directory"), e("/w/l", "symlink")]);
        assert_eq!(out.len(), 2);
        assert_eq!((out[0]["name"].as_str(), out[0]["type"].as_str()), (Some("a.txt"), Some("file")));
        assert_eq!(out[0]["mod_time"].as_f64(), Some(1_767_225_601.5));
        assert_eq!(out[1]["name"], "d");
    }

    #[test]
    fn the_agent_form_has_a_boundary_not_in_the_data() {
        let (body, ct) = agent_form("a/b.txt", b"hello");
        let boundary = ct.strip_prefix("multipart/form-data; boundary=").expect("a boundary");
        let text = String::from_utf8(body).expect("text");
        assert!(text.contains("{\"path\":\"a/b.txt\"}") && text.contains("\r\n\r\nhello\r\n"), "{text}");
        assert!(text.ends_with(&format!("--{boundary}--\r\n")));
    }
}
