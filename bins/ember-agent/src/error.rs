//! The one error type of the HTTP handlers and its mapping to execd's
//! `{code, message}` bodies. Status codes are decided here and nowhere else.
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use std::io;

/// execd's stable error codes (OpenSandbox protocol §3.1).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorCode {
    InvalidRequestBody,
    MissingQuery,
    RuntimeError,
    InvalidFile,
    InvalidFileContent,
    InvalidFileMetadata,
    FileNotFound,
    NotFound,
    NotSupported,
    RangeNotSatisfiable,
    /// A proxied in-sandbox server could not be reached.
    BadGateway,
    /// A code context id that does not exist.
    ContextNotFound,
    /// A one-time operation (a pool claim) was already done.
    Conflict,
    /// Another client is attached to a PTY session.
    AlreadyConnected,
}

impl ErrorCode {
    fn wire(self) -> &'static str {
        match self {
            ErrorCode::InvalidRequestBody => "INVALID_REQUEST_BODY",
            ErrorCode::MissingQuery => "MISSING_QUERY",
            ErrorCode::RuntimeError => "RUNTIME_ERROR",
            ErrorCode::InvalidFile => "INVALID_FILE",
            ErrorCode::InvalidFileContent => "INVALID_FILE_CONTENT",
            ErrorCode::InvalidFileMetadata => "INVALID_FILE_METADATA",
            ErrorCode::FileNotFound => "FILE_NOT_FOUND",
            // execd answers unknown command ids with INVALID_REQUEST_BODY.
            ErrorCode::NotFound => "INVALID_REQUEST_BODY",
            ErrorCode::NotSupported => "NOT_SUPPORTED",
            ErrorCode::RangeNotSatisfiable => "UNKNOWN",
            ErrorCode::BadGateway => "RUNTIME_ERROR",
            ErrorCode::ContextNotFound => "CONTEXT_NOT_FOUND",
            ErrorCode::Conflict => "CONFLICT",
            ErrorCode::AlreadyConnected => "ALREADY_CONNECTED",
        }
    }

    fn status(self) -> StatusCode {
        match self {
            ErrorCode::InvalidRequestBody
            | ErrorCode::MissingQuery
            | ErrorCode::InvalidFile
            | ErrorCode::InvalidFileContent
            | ErrorCode::InvalidFileMetadata => StatusCode::BAD_REQUEST,
            ErrorCode::RuntimeError => StatusCode::INTERNAL_SERVER_ERROR,
            ErrorCode::FileNotFound | ErrorCode::NotFound | ErrorCode::NotSupported => StatusCode::NOT_FOUND,
            ErrorCode::RangeNotSatisfiable => StatusCode::RANGE_NOT_SATISFIABLE,
            ErrorCode::BadGateway => StatusCode::BAD_GATEWAY,
            ErrorCode::ContextNotFound => StatusCode::NOT_FOUND,
            ErrorCode::Conflict | ErrorCode::AlreadyConnected => StatusCode::CONFLICT,
        }
    }
}

#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct ApiError {
    pub code: ErrorCode,
    pub message: String,
}

impl ApiError {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> ApiError {
        ApiError { code, message: message.into() }
    }

    pub fn bad_request(message: impl Into<String>) -> ApiError {
        ApiError::new(ErrorCode::InvalidRequestBody, message)
    }

    pub fn missing_query(name: &str) -> ApiError {
        ApiError::new(ErrorCode::MissingQuery, format!("missing query parameter '{name}'"))
    }

    pub fn runtime(message: impl Into<String>) -> ApiError {
        ApiError::new(ErrorCode::RuntimeError, message)
    }

    /// An IO error on `path` during `op`: a missing file is a 404, anything
    /// else a 500.
    pub fn io(op: &str, path: &str, err: &io::Error) -> ApiError {
        let code = match err.kind() {
            io::ErrorKind::NotFound => ErrorCode::FileNotFound,
            _ => ErrorCode::RuntimeError,
        };
        ApiError::new(code, format!("{op} {path}: {err}"))
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = serde_json::json!({ "code": self.code.wire(), "message": self.message });
        (self.code.status(), axum::Json(body)).into_response()
    }
}

pub type ApiResult<T> = Result<T, ApiError>;

/// A JSON request body. Unlike axum's `Json`, every failure (unreadable or
/// oversized body, bad JSON, wrong shape; any content type is accepted) is
/// an execd `{code, message}` 400.
pub struct JsonBody<T>(pub T);

impl<T: serde::de::DeserializeOwned, S: Send + Sync> axum::extract::FromRequest<S> for JsonBody<T> {
    type Rejection = ApiError;

    async fn from_request(req: axum::extract::Request, state: &S) -> Result<Self, ApiError> {
        let body = axum::body::Bytes::from_request(req, state)
            .await
            .map_err(|e| ApiError::bad_request(format!("error reading request body: {}", e.body_text())))?;
        parse_json(&body).map(JsonBody)
    }
}

/// Parses a JSON request body, mapping any failure to a 400.
pub fn parse_json<T: serde::de::DeserializeOwned>(body: &[u8]) -> ApiResult<T> {
    serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("error parsing request, MAYBE invalid body format. {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn io_errors_map_to_404_or_500() {
        let nf = ApiError::io("open", "/x", &io::Error::from(io::ErrorKind::NotFound));
        assert_eq!(nf.code.status(), StatusCode::NOT_FOUND);
        assert_eq!(nf.code.wire(), "FILE_NOT_FOUND");
        let other = ApiError::io("open", "/x", &io::Error::from(io::ErrorKind::PermissionDenied));
        assert_eq!(other.code.status(), StatusCode::INTERNAL_SERVER_ERROR);
    }

    #[test]
    fn bad_json_is_a_400() {
        let e = parse_json::<Vec<u32>>(b"{").unwrap_err();
        assert_eq!(e.code.status(), StatusCode::BAD_REQUEST);
    }
}
