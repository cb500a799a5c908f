//! Image and template calls (`/v1/images...`, `/v1/templates...`).
use crate::{Client, ClientError};
use bytes::Bytes;
use ember_types::image::*;
use hyper::Method;

/// Percent-encodes a path segment (image names have `/` and `:`).
pub fn segment(s: &str) -> String {
    percent_encoding::utf8_percent_encode(s, crate::COMPONENT).to_string()
}

fn to_json<T: serde::Serialize>(v: &T) -> Result<Vec<u8>, ClientError> {
    serde_json::to_vec(v).map_err(|e| ClientError::Protocol { path: "request".into(), message: e.to_string() })
}

impl Client {
    pub async fn pull_image(&self, req: &PullRequest) -> Result<ImageInfo, ClientError> {
        Ok(self.json(Method::POST, "/v1/images/pull", Some(to_json(req)?)).await?.0)
    }

    pub async fn image_pulls(&self) -> Result<Vec<PullStatus>, ClientError> {
        Ok(self.json(Method::GET, "/v1/images/pulls", None).await?.0)
    }

    /// Uploads a tar (a root filesystem or an OCI image layout) as image `name`.
    pub async fn import_image(&self, name: &str, tar: Bytes) -> Result<ImageInfo, ClientError> {
        let path = format!("/v1/images/import?name={}", segment(name));
        let resp = self.send(Method::POST, &path, tar, Some("application/x-tar")).await?;
        let resp = Self::check(&path, resp).await?;
        let body = crate::read_body(&path, resp).await?;
        serde_json::from_slice(&body).map_err(|e| ClientError::Protocol { path, message: e.to_string() })
    }

    pub async fn list_images(&self) -> Result<ImageList, ClientError> {
        Ok(self.json(Method::GET, "/v1/images", None).await?.0)
    }

    pub async fn get_image(&self, name: &str) -> Result<ImageInfo, ClientError> {
        Ok(self.json(Method::GET, &format!("/v1/images/{}", segment(name)), None).await?.0)
    }

    pub async fn remove_image(&self, name: &str) -> Result<(), ClientError> {
        let path = format!("/v1/images/{}", segment(name));
        let resp = self.send(Method::DELETE, &path, Bytes::new(), None).await?;
        Self::check(&path, resp).await.map(|_| ())
    }

    pub async fn prune_images(&self) -> Result<PruneResult, ClientError> {
        Ok(self.json(Method::POST, "/v1/images/prune", Some(b"{}".to_vec())).await?.0)
    }

    pub async fn create_template(&self, req: &TemplateRequest) -> Result<TemplateInfo, ClientError> {
        Ok(self.json(Method::POST, "/v1/templates", Some(to_json(req)?)).await?.0)
    }

    pub async fn list_templates(&self) -> Result<Vec<TemplateInfo>, ClientError> {
        Ok(self.json(Method::GET, "/v1/templates", None).await?.0)
    }

    pub async fn get_template(&self, name: &str) -> Result<TemplateInfo, ClientError> {
        Ok(self.json(Method::GET, &format!("/v1/templates/{}", segment(name)), None).await?.0)
    }

    pub async fn delete_template(&self, name: &str) -> Result<(), ClientError> {
        let path = format!("/v1/templates/{}", segment(name));
        let resp = self.send(Method::DELETE, &path, Bytes::new(), None).await?;
        Self::check(&path, resp).await.map(|_| ())
    }
}
