//! A raw POST, for routes this client has no typed call for yet (the chaos
//! drill's workspace checkpoint).
use crate::{read_body, Client, ClientError};
use bytes::Bytes;
use hyper::Method;

impl Client {
    /// POSTs `body` as JSON (empty: no body); the answer's bytes, or the
    /// API's `{code, message}` as [`ClientError::Api`] for a non-2xx.
    pub async fn post_json(&self, path: &str, body: Bytes) -> Result<Bytes, ClientError> {
        let ct = (!body.is_empty()).then_some("application/json");
        let resp = self.send(Method::POST, path, body, ct).await?;
        let resp = Self::check(path, resp).await?;
        read_body(path, resp).await
    }
}
