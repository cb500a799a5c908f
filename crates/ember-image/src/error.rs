//! The image store's errors. Every variant names the reference, digest or path
//! that failed; the API maps them to `{code, message}` in one place.
use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    #[error("invalid image reference {reference:?}: {message}")]
    BadReference { reference: String, message: String },
    #[error("image {0:?} is not in the store")]
    NotFound(String),
    #[error("registry refused {reference}: authentication failed or is required (HTTP 401/403)")]
    Unauthorized { reference: String },
    #[error("image {reference} not found in its registry")]
    NotInRegistry { reference: String },
    #[error("pulling {reference}: {message}")]
    Registry { reference: String, message: String },
    #[error("blob {digest} of {reference}: content does not match its digest ({message})")]
    DigestMismatch { reference: String, digest: String, message: String },
    #[error("image {reference} has no manifest for {platform}")]
    NoPlatform { reference: String, platform: String },
    #[error("unsupported media type {media_type:?} in {reference}")]
    MediaType { reference: String, media_type: String },
    #[error("layer {digest}: unsafe entry {entry:?}: {message}")]
    UnsafeEntry { digest: String, entry: String, message: String },
    #[error("layer {digest}: {message}")]
    BadLayer { digest: String, message: String },
    /// A cap of `bounds.rs` was passed: `what` of `subject` went over `limit`
    /// bytes; `why` names the cap (the flag that sets it).
    #[error("{what} of {subject} is over its cap of {limit} bytes ({why})")]
    TooLarge { what: &'static str, subject: String, limit: u64, why: &'static str },
    #[error("import: {message}")]
    BadImport { message: String },
    #[error("{what} {path}")]
    Io {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Sys(#[from] ember_sys::SysError),
    #[error("image {image} is used by template {template:?}")]
    InUse { image: String, template: String },
    #[error("user {user:?} of image {image}: {message}")]
    User { image: String, user: String, message: String },
}

impl ImageError {
    pub(crate) fn io(what: &'static str, path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> ImageError {
        let path = path.into();
        move |source| ImageError::Io { what, path, source }
    }
}
