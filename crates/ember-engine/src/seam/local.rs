//! [`ControlPlane`] for this node's engine: each call is handed to the one
//! service that owns what it touches (`self.sandboxes.get(..)`,
//! `self.pools.create_pool(..)`, ...), or is the few lines the API used to
//! hold, for lists and metrics. On `Arc<Engine>`, the type the binary holds.
//!
//! A call on the engine itself is written `Engine::method(self, ..)`: with
//! the trait in scope a bare `self.runtime_classes()` on `&Arc<Engine>`
//! would pick the trait's own method (found one auto-deref step before
//! `Engine`'s) and recurse.
use super::{AgentRoute, ControlPlane};
use crate::pool::plan::Target;
use crate::pool::{CreatePool, PoolStatus};
use crate::tasks::TaskFilter;
use crate::templates::Template;
use crate::{
    CreateSandbox, Engine, EngineError, ListFilter, NetworkStatus, SandboxRecord, SandboxSnapshotRecord,
    SnapshotFilter, SnapshotOp, WorkspaceStatus,
};
use ember_image::{ImageRecord, LayerMeta, PruneReport, PullProgress};
use ember_snapshot::{GcReport, SnapshotSummary};
use ember_types::api::{NetworkPolicy, NetworkRule, RuntimeClassInfo};
use ember_types::image::{RegistryAuth, TemplateRequest};
use ember_types::task::{SubmitTaskRequest, TaskRecord};
use ember_types::{BoundaryReport, DeniedFlow, EgressPolicy};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

#[async_trait::async_trait]
impl ControlPlane for Arc<Engine> {
    async fn create(&self, req: CreateSandbox) -> Result<SandboxRecord, EngineError> {
        self.provision.create(req).await
    }
    async fn get(&self, id: &str) -> Result<SandboxRecord, EngineError> {
        self.sandboxes.get(id)
    }
    async fn list(&self, f: &ListFilter) -> Result<Vec<SandboxRecord>, EngineError> {
        Ok(self.sandboxes.list(f))
    }
    async fn remove(&self, id: &str) -> Result<(), EngineError> {
        self.sandboxes.remove(id).await
    }
    async fn launch_standby(&self, req: CreateSandbox) -> Result<(), EngineError> {
        self.provision.launch_standby(req).await
    }
    async fn standbys(&self) -> Vec<String> {
        self.provision.standbys()
    }
    async fn remove_standby(&self, id: &str) -> Result<(), EngineError> {
        self.provision.remove_standby(id).await
    }
    async fn pause(&self, id: &str) -> Result<(), EngineError> {
        self.sandboxes.pause(id).await
    }
    async fn resume(&self, id: &str) -> Result<(), EngineError> {
        self.sandboxes.resume(id).await
    }
    async fn checkpoint(&self, id: &str) -> Result<(), EngineError> {
        self.sandboxes.checkpoint(id).await
    }
    async fn renew(&self, id: &str, expires_at_ms: i64) -> Result<SandboxRecord, EngineError> {
        self.sandboxes.renew(id, expires_at_ms).await
    }
    async fn patch_metadata(
        &self,
        id: &str,
        patch: BTreeMap<String, Option<String>>,
    ) -> Result<SandboxRecord, EngineError> {
        self.sandboxes.patch_metadata(id, patch).await
    }
    async fn boundary(&self, id: &str) -> Result<BoundaryReport, EngineError> {
        self.sandboxes.boundary(id).await
    }
    async fn stats(&self, id: &str) -> Result<ember_types::SandboxStats, EngineError> {
        self.sandboxes.stats(id).await
    }
    async fn agent_log(&self, id: &str, max: u64) -> Result<(String, bool), EngineError> {
        self.sandboxes.agent_log(id, max).await
    }
    async fn agent_route(&self, id: &str) -> Result<AgentRoute, EngineError> {
        self.sandboxes.touch(id).await?;
        Ok(AgentRoute::Local { socket: self.sandboxes.agent_socket(id)? })
    }

    async fn egress_policy(&self, id: &str) -> Result<NetworkPolicy, EngineError> {
        self.sandboxes.egress_policy(id)
    }
    async fn patch_egress(&self, id: &str, rules: Vec<NetworkRule>) -> Result<NetworkPolicy, EngineError> {
        self.sandboxes.patch_egress(id, rules).await
    }
    async fn delete_egress(&self, id: &str, targets: Vec<String>) -> Result<NetworkPolicy, EngineError> {
        self.sandboxes.delete_egress(id, targets).await
    }
    async fn egress_enforced(&self, id: &str) -> Result<bool, EngineError> {
        self.sandboxes.egress_enforced(id)
    }

    async fn network_status(&self, id: &str) -> Result<NetworkStatus, EngineError> {
        self.sandboxes.network_status(id)
    }
    async fn set_network_policy(&self, id: &str, policy: EgressPolicy) -> Result<NetworkStatus, EngineError> {
        self.sandboxes.set_network_policy(id, policy).await
    }
    async fn network_events(&self, id: &str) -> Result<Vec<DeniedFlow>, EngineError> {
        self.sandboxes.network_events(id)
    }
    fn network_range(&self) -> Option<String> {
        self.network.range()
    }
    fn network_stats(&self) -> Option<ember_net::NetStats> {
        self.network.stats()
    }

    async fn create_pool(&self, req: CreatePool) -> Result<PoolStatus, EngineError> {
        self.pools.create_pool(req).await
    }
    async fn list_pools(&self) -> Result<Vec<PoolStatus>, EngineError> {
        let mut out = Vec::new();
        for name in self.pools.pool_names() {
            // A pool removed since the names were read is no longer listed.
            if let Ok(s) = self.pools.pool_status(&name).await {
                out.push(s);
            }
        }
        Ok(out)
    }
    async fn pool_status(&self, name: &str) -> Result<PoolStatus, EngineError> {
        self.pools.pool_status(name).await
    }
    async fn resize_pool(
        &self,
        name: &str,
        min: Option<u32>,
        max: Option<u32>,
        target: Option<Target>,
    ) -> Result<PoolStatus, EngineError> {
        self.pools.resize_pool(name, min, max, target).await
    }
    async fn remove_pool(&self, name: &str) -> Result<(), EngineError> {
        self.pools.remove_pool(name).await
    }

    async fn create_workspace(&self, name: String, size_bytes: u64) -> Result<WorkspaceStatus, EngineError> {
        self.workspaces.create_workspace(name, size_bytes).await
    }
    async fn list_workspaces(&self) -> Result<Vec<WorkspaceStatus>, EngineError> {
        self.workspaces.list_workspaces().await
    }
    async fn workspace(&self, name: &str) -> Result<WorkspaceStatus, EngineError> {
        self.workspaces.workspace(name).await
    }
    async fn remove_workspace(&self, name: &str) -> Result<(), EngineError> {
        self.workspaces.remove_workspace(name).await
    }

    async fn snapshot_workspace_op(
        &self,
        name: &str,
        fence: Option<(String, u64)>,
        op: Option<String>,
    ) -> Result<SnapshotSummary, EngineError> {
        self.snapshots.snapshot_workspace_op(name, fence, op).await
    }
    async fn checkpoint_workspace(&self, name: &str) -> Result<crate::WorkspaceCheckpoint, EngineError> {
        self.snapshots.checkpoint_workspace(name).await
    }
    async fn list_snapshots(&self, workspace: Option<String>) -> Result<Vec<SnapshotSummary>, EngineError> {
        self.snapshots.list_snapshots(workspace).await
    }
    async fn inspect_snapshot(&self, id: &str) -> Result<SnapshotSummary, EngineError> {
        self.snapshots.inspect_snapshot(id).await
    }
    async fn delete_snapshot(&self, id: &str) -> Result<(), EngineError> {
        self.snapshots.delete_snapshot(id).await
    }
    async fn restore_workspace_op(
        &self,
        id: &str,
        name: &str,
        size: Option<u64>,
        op: Option<String>,
    ) -> Result<WorkspaceStatus, EngineError> {
        self.snapshots.restore_workspace_op(id, name, size, op).await
    }
    async fn fork_snapshot_op(
        &self,
        id: &str,
        count: u32,
        prefix: &str,
        op: Option<String>,
    ) -> Result<Vec<WorkspaceStatus>, EngineError> {
        self.snapshots.fork_snapshot_op(id, count, prefix, op).await
    }
    async fn snapshot_ops(&self) -> Result<Vec<SnapshotOp>, EngineError> {
        Ok(self.snapshots.snapshot_ops())
    }
    async fn snapshot_op(&self, id: &str) -> Result<SnapshotOp, EngineError> {
        self.snapshots.snapshot_op(id)
    }
    async fn gc_snapshots(&self, min_age: Option<Duration>) -> Result<GcReport, EngineError> {
        self.snapshots.gc_snapshots(min_age).await
    }

    async fn snapshot_sandbox(&self, id: &str, name: Option<String>) -> Result<SandboxSnapshotRecord, EngineError> {
        self.snapshots.snapshot_sandbox(id, name).await
    }
    async fn sandbox_snapshot(&self, id: &str) -> Result<SandboxSnapshotRecord, EngineError> {
        self.snapshots.sandbox_snapshot(id)
    }
    async fn delete_sandbox_snapshot(&self, id: &str) -> Result<(), EngineError> {
        self.snapshots.delete_sandbox_snapshot(id).await
    }
    async fn list_sandbox_snapshots(&self, f: &SnapshotFilter) -> Result<Vec<SandboxSnapshotRecord>, EngineError> {
        self.snapshots.list_sandbox_snapshots(f)
    }

    async fn list_images(&self) -> Result<Vec<ImageRecord>, EngineError> {
        Ok(self.catalog.images().list())
    }
    async fn image_layers(&self) -> Result<Vec<(LayerMeta, usize)>, EngineError> {
        Ok(self.catalog.images().layers())
    }
    async fn image(&self, reference: &str) -> Result<ImageRecord, EngineError> {
        Ok(self.catalog.images().get(reference)?)
    }
    async fn remove_image(&self, reference: &str) -> Result<ImageRecord, EngineError> {
        self.catalog.remove_image(reference)
    }
    async fn pull_image(&self, reference: &str, auth: Option<RegistryAuth>) -> Result<ImageRecord, EngineError> {
        self.catalog.pull_image(reference, auth).await
    }
    async fn image_pulls(&self) -> Result<Vec<PullProgress>, EngineError> {
        Ok(self.catalog.images().pulls())
    }
    fn image_upload_path(&self) -> PathBuf {
        self.catalog.images().temp_path("upload")
    }
    async fn import_image(&self, name: &str, tar: PathBuf) -> Result<ImageRecord, EngineError> {
        self.catalog.import_image(name, tar).await
    }
    async fn prune_images(&self) -> Result<PruneReport, EngineError> {
        let held = self.sandboxes.list(&ListFilter::default()).into_iter().flat_map(|r| r.spec.lower_dirs).collect();
        self.catalog.prune_images(held).await
    }
    async fn create_template(&self, req: TemplateRequest) -> Result<Template, EngineError> {
        self.catalog.create_template(req).await
    }
    async fn templates(&self) -> Result<Vec<Template>, EngineError> {
        Ok(self.catalog.templates())
    }
    async fn template(&self, name: &str) -> Result<Template, EngineError> {
        self.catalog.template(name)
    }
    async fn delete_template(&self, name: &str) -> Result<(), EngineError> {
        self.catalog.delete_template(name)
    }

    async fn submit_task(&self, req: SubmitTaskRequest) -> Result<(TaskRecord, bool), EngineError> {
        self.tasks()?.submit_task(req).await
    }
    async fn list_tasks(&self, f: &TaskFilter) -> Result<Vec<TaskRecord>, EngineError> {
        self.tasks()?.list_tasks(f).await
    }
    async fn task(&self, id: &str) -> Result<TaskRecord, EngineError> {
        self.tasks()?.task(id).await
    }
    async fn cancel_task(&self, id: &str) -> Result<TaskRecord, EngineError> {
        self.tasks()?.cancel_task(id).await
    }
    async fn task_log(&self, id: &str, attempt: Option<u32>, offset: u64) -> Result<(Vec<u8>, bool, u32), EngineError> {
        self.tasks()?.task_log(id, attempt, offset).await
    }

    fn runtime_classes(&self) -> Vec<RuntimeClassInfo> {
        Engine::runtime_classes(self)
    }
    fn metrics_text(&self) -> String {
        let recs = self.sandboxes.refresh_gauges();
        self.pools.refresh_metrics(&Engine::metrics(self).pools, &recs);
        if let Some(n) = self.runtimes.default_runtime().launch_table_mounts() {
            Engine::metrics(self).launch_table_mounts.set(n as i64);
        }
        let mut body = Engine::metrics(self).encode();
        if let Some(tasks) = self.tasks.get().and_then(|t| t.encode_task_metrics()) {
            body = crate::process_metrics::splice(body, &tasks);
        }
        crate::process_metrics::append_process(body)
    }
    fn observe_exec(&self, took: std::time::Duration) {
        Engine::metrics(self).exec_seconds.observe(took.as_secs_f64());
    }
}
