//! Sandbox snapshots: `POST /v1/sandboxes/{id}/snapshots`, `/v1/snapshots...`.
//! Restoring one is [`Client::create_sandbox`] with `snapshot_id`.
use crate::{Client, ClientError};
use bytes::Bytes;
use ember_types::api::{CreateSnapshotRequest, SandboxSnapshotInfo, SandboxSnapshotList};
use hyper::Method;

impl Client {
    /// Snapshots a Running sandbox; returns once the snapshot is Ready.
    pub async fn snapshot_sandbox(&self, id: &str, name: Option<&str>) -> Result<SandboxSnapshotInfo, ClientError> {
        let req = CreateSnapshotRequest { name: name.map(str::to_string) };
        let body = serde_json::to_vec(&req)
            .map_err(|e| ClientError::Protocol { path: "snapshot".into(), message: e.to_string() })?;
        Ok(self.json(Method::POST, &format!("/v1/sandboxes/{id}/snapshots"), Some(body)).await?.0)
    }

    /// Every sandbox snapshot, following pagination; `query` is e.g. `sandboxId=...`.
    pub async fn list_sandbox_snapshots(&self, query: &str) -> Result<Vec<SandboxSnapshotInfo>, ClientError> {
        let mut out = Vec::new();
        for page in 1.. {
            let path = format!("/v1/snapshots?pageSize=200&page={page}&{query}");
            let (l, _): (SandboxSnapshotList, _) = self.json(Method::GET, &path, None).await?;
            out.extend(l.items);
            if !l.pagination.has_next_page {
                break;
            }
        }
        Ok(out)
    }

    pub async fn get_sandbox_snapshot(&self, id: &str) -> Result<SandboxSnapshotInfo, ClientError> {
        Ok(self.json(Method::GET, &format!("/v1/snapshots/{id}"), None).await?.0)
    }

    pub async fn delete_sandbox_snapshot(&self, id: &str) -> Result<(), ClientError> {
        let path = format!("/v1/snapshots/{id}");
        let resp = self.send(Method::DELETE, &path, Bytes::new(), None).await?;
        Self::check(&path, resp).await.map(|_| ())
    }
}
