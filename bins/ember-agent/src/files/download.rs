//! `GET /files/download?path=`: the whole file, one byte range (`Range:
//! bytes=a-b` → 206, unsatisfiable → 416), or a 1-based line window
//! (`offset`/`limit` → text/plain). Files are streamed, never loaded whole,
//! except for the requested lines of a line window.
use super::{required_path, with_fs};
use crate::error::{ApiError, ApiResult, ErrorCode};
use crate::query::Query;
use crate::server::App;
use axum::body::Body;
use axum::extract::{RawQuery, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use percent_encoding::{utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};
use std::io::{self, BufRead, Seek, SeekFrom};
use tokio::io::AsyncReadExt;

pub async fn download(State(app): State<App>, RawQuery(q): RawQuery, headers: HeaderMap) -> ApiResult<Response> {
    let q = Query::parse(q.as_deref());
    let raw = required_path(&q)?;
    let window = line_window(&q)?;
    let range = headers.get(header::RANGE).map(|v| v.to_str().unwrap_or("").to_string());
    if window.is_some() && range.is_some() {
        return Err(ApiError::bad_request("offset/limit and the Range header are mutually exclusive"));
    }
    let (file, size, name) = with_fs(&app, move |fs| {
        let path = fs.resolve(&raw)?;
        let file = std::fs::File::open(&path).map_err(|e| ApiError::io("open", &raw, &e))?;
        let meta = file.metadata().map_err(|e| ApiError::io("stat", &raw, &e))?;
        if meta.is_dir() {
            return Err(ApiError::bad_request(format!("path is a directory: {raw}")));
        }
        let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        Ok((file, meta.len(), name))
    })
    .await?;
    if let Some((offset, limit)) = window {
        return read_lines(file, offset, limit).await;
    }
    let (status, start, len) = match range {
        None => (StatusCode::OK, 0, size),
        Some(r) => match parse_range(&r, size) {
            Some((start, len)) => (StatusCode::PARTIAL_CONTENT, start, len),
            None => return Ok(unsatisfiable(size)),
        },
    };
    let mut resp = Response::new(file_body(file, start, len));
    *resp.status_mut() = status;
    let h = resp.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/octet-stream"));
    h.insert(header::CONTENT_LENGTH, HeaderValue::from(len));
    h.insert(header::ACCEPT_RANGES, HeaderValue::from_static("bytes"));
    if let Ok(v) = HeaderValue::from_str(&content_disposition(&name)) {
        h.insert(header::CONTENT_DISPOSITION, v);
    }
    if status == StatusCode::PARTIAL_CONTENT {
        let cr = format!("bytes {}-{}/{}", start, start + len - 1, size);
        h.insert(header::CONTENT_RANGE, HeaderValue::from_str(&cr).expect("ASCII digits"));
    }
    Ok(resp)
}

fn unsatisfiable(size: u64) -> Response {
    let mut resp = ApiError::new(ErrorCode::RangeNotSatisfiable, "requested range not satisfiable").into_response();
    let cr = HeaderValue::from_str(&format!("bytes */{size}")).expect("ASCII digits");
    resp.headers_mut().insert(header::CONTENT_RANGE, cr);
    resp
}

/// `offset` (1-based first line, default 1) and `limit` (line count,
/// default all); `None` when neither is given.
fn line_window(q: &Query) -> ApiResult<Option<(u64, Option<u64>)>> {
    let num = |k: &str| -> ApiResult<Option<u64>> {
        match q.get(k).filter(|v| !v.is_empty()) {
            None => Ok(None),
            Some(v) => match v.parse::<u64>() {
                Ok(n) if n >= 1 => Ok(Some(n)),
                _ => Err(ApiError::bad_request(format!("invalid query parameter '{k}': {v} (must be >= 1)"))),
            },
        }
    };
    let (offset, limit) = (num("offset")?, num("limit")?);
    Ok((offset.is_some() || limit.is_some()).then(|| (offset.unwrap_or(1), limit)))
}

async fn read_lines(file: std::fs::File, offset: u64, limit: Option<u64>) -> ApiResult<Response> {
    let text = tokio::task::spawn_blocking(move || -> io::Result<Vec<u8>> {
        let mut reader = io::BufReader::new(file);
        let mut out = Vec::new();
        let mut line = Vec::new();
        let end = limit.map_or(u64::MAX, |l| offset.saturating_add(l));
        let mut n = 1u64;
        while n < end && reader.read_until(b'\n', &mut line)? > 0 {
            if n >= offset {
                out.extend_from_slice(&line);
            }
            line.clear();
            n += 1;
        }
        Ok(out)
    })
    .await
    .map_err(|e| ApiError::runtime(format!("read task failed: {e}")))?
    .map_err(|e| ApiError::runtime(format!("read: {e}")))?;
    Ok(([(header::CONTENT_TYPE, "text/plain; charset=utf-8")], text).into_response())
}

/// The first range of a `bytes=` Range header as (start, length), clamped
/// to the file; `None` if malformed or unsatisfiable.
fn parse_range(header: &str, size: u64) -> Option<(u64, u64)> {
    let spec = header.trim().strip_prefix("bytes=")?.split(',').next()?.trim();
    let (a, b) = spec.split_once('-')?;
    let (a, b) = (a.trim(), b.trim());
    let (start, end) = if a.is_empty() {
        let n: u64 = b.parse().ok()?;
        (size.checked_sub(n.min(size)).filter(|_| n > 0)?, size.checked_sub(1)?)
    } else {
        let start: u64 = a.parse().ok()?;
        let end = if b.is_empty() { size.checked_sub(1)? } else { b.parse::<u64>().ok()?.min(size.checked_sub(1)?) };
        (start, end)
    };
    (start < size && start <= end).then(|| (start, end - start + 1))
}

/// RFC 6266 attachment header, with an RFC 5987 name for non-ASCII names.
fn content_disposition(name: &str) -> String {
    if name.is_ascii() && !name.contains(['"', '\\']) {
        return format!("attachment; filename=\"{name}\"");
    }
    // RFC 5987 attr-chars, trimmed to the unreserved ones; the rest escaped.
    const ESCAPED: &AsciiSet = &NON_ALPHANUMERIC.remove(b'-').remove(b'.').remove(b'_').remove(b'~');
    let enc = utf8_percent_encode(name, ESCAPED);
    format!("attachment; filename=\"{enc}\"; filename*=UTF-8''{enc}")
}

/// `len` bytes of `file` from `start`, in 64 KiB chunks.
fn file_body(file: std::fs::File, start: u64, len: u64) -> Body {
    let mut file = file;
    let seek = file.seek(SeekFrom::Start(start));
    let reader = seek.ok().map(|_| tokio::fs::File::from_std(file).take(len));
    let stream = futures_util::stream::unfold(reader, |r| async move {
        let mut r = r?;
        let mut buf = vec![0u8; 64 * 1024];
        match r.read(&mut buf).await {
            Ok(0) => None,
            Ok(n) => {
                buf.truncate(n);
                Some((Ok::<_, io::Error>(Bytes::from(buf)), Some(r)))
            }
            // Yield the error once, then end: the client sees a cut body.
            Err(e) => Some((Err(e), None)),
        }
    });
    Body::from_stream(stream)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges() {
        assert_eq!(parse_range("bytes=2-5", 10), Some((2, 4)));
        assert_eq!(parse_range("bytes=2-", 10), Some((2, 8)));
        assert_eq!(parse_range("bytes=-3", 10), Some((7, 3)));
        assert_eq!(parse_range("bytes=-30", 10), Some((0, 10)));
        assert_eq!(parse_range("bytes=5-100", 10), Some((5, 5)));
        assert_eq!(parse_range("bytes=0-0,4-5", 10), Some((0, 1)));
        assert_eq!(parse_range("bytes=10-", 10), None);
        assert_eq!(parse_range("bytes=5-2", 10), None);
        assert_eq!(parse_range("bytes=-0", 10), None);
        assert_eq!(parse_range("bytes=0-", 0), None);
        assert_eq!(parse_range("items=0-1", 10), None);
        assert_eq!(parse_range("bytes=x-1", 10), None);
    }

    #[test]
    fn dispositions() {
        assert_eq!(content_disposition("a.txt"), "attachment; filename=\"a.txt\"");
        assert!(content_disposition("é.txt").ends_with("UTF-8''%C3%A9.txt"));
    }
}
