//! `/v1/tasks`: submit, read, cancel, and follow logs.
use crate::{read_body, Client, ClientError};
use bytes::Bytes;
use ember_types::task::{SubmitTaskRequest, TaskList, TaskRecord};
use http_body_util::BodyExt;
use hyper::Method;

impl Client {
    /// Submits a task; `true` when it is new, `false` when its key named an
    /// existing one (which is returned).
    pub async fn submit_task(&self, req: &SubmitTaskRequest) -> Result<(TaskRecord, bool), ClientError> {
        let path = "/v1/tasks";
        let body =
            serde_json::to_vec(req).map_err(|e| ClientError::Protocol { path: path.into(), message: e.to_string() })?;
        let resp = self.send(Method::POST, path, body.into(), Some("application/json")).await?;
        let resp = Self::check(path, resp).await?;
        let created = resp.status() == hyper::StatusCode::CREATED;
        let bytes = read_body(path, resp).await?;
        let rec = serde_json::from_slice(&bytes)
            .map_err(|e| ClientError::Protocol { path: path.into(), message: e.to_string() })?;
        Ok((rec, created))
    }

    pub async fn get_task(&self, id: &str) -> Result<TaskRecord, ClientError> {
        Ok(self.json(Method::GET, &format!("/v1/tasks/{id}"), None).await?.0)
    }

    /// `query` is e.g. `state=Queued&tier=batch`.
    pub async fn list_tasks(&self, query: &str) -> Result<Vec<TaskRecord>, ClientError> {
        Ok(self.json::<TaskList>(Method::GET, &format!("/v1/tasks?{query}"), None).await?.0.items)
    }

    pub async fn cancel_task(&self, id: &str) -> Result<TaskRecord, ClientError> {
        Ok(self.json(Method::POST, &format!("/v1/tasks/{id}/cancel"), Some(Vec::new())).await?.0)
    }

    /// An attempt's log (default: the latest); with `follow`, `on_chunk` sees
    /// output as it is written until the attempt ends.
    pub async fn task_logs(
        &self,
        id: &str,
        attempt: Option<u32>,
        follow: bool,
        on_chunk: impl FnMut(&[u8]),
    ) -> Result<(), ClientError> {
        self.task_logs_from(id, attempt, follow, 0, on_chunk).await
    }

    /// [`Self::task_logs`] from byte `offset` of the log (a follower that lost
    /// its connection resumes with the bytes it already has).
    pub async fn task_logs_from(
        &self,
        id: &str,
        attempt: Option<u32>,
        follow: bool,
        offset: u64,
        mut on_chunk: impl FnMut(&[u8]),
    ) -> Result<(), ClientError> {
        let mut path = format!("/v1/tasks/{id}/logs?follow={follow}&offset={offset}");
        if let Some(a) = attempt {
            path.push_str(&format!("&attempt={a}"));
        }
        let resp = self.send(Method::GET, &path, Bytes::new(), None).await?;
        let mut body = Self::check(&path, resp).await?.into_body();
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|e| ClientError::Protocol { path: path.clone(), message: e.to_string() })?;
            if let Ok(data) = frame.into_data() {
                on_chunk(&data);
            }
        }
        Ok(())
    }
}
