//! A node that re-creates a dead node's sessions puts its own sandboxes'
//! CPU behind that work while it lasts.
//!
//! A rebind is a dozen steps on the daemon and the NATS servers (the
//! workspace taken over, its checkpoint fetched, the sandbox registry
//! written), each waiting for a core behind the node's busy sandboxes. On
//! the 300-session drill, with every node's sandbox group at a tenth of its
//! weight, those steps fell from ~0.77 s to ~50 ms a rebind and the 90
//! rebinds ended 1.6 s after the first instead of 4.8 s (docs/performance.md,
//! "The control plane's weight"); kept low for good, the sessions' own work
//! fell by ~40 %. So the group is lowered only while this node has rebinds
//! in flight, and set back when the last one ends. `ember serve` gives the
//! weights (`--recovery-cpu-shares`, `--sandboxes-cpu-shares`).
use std::sync::Arc;

/// Sets this node's sandbox group's CPU weight: `true` while it rebinds,
/// `false` once the last rebind ended.
#[derive(Clone)]
pub struct RecoveryWeight(pub Arc<dyn Fn(bool) + Send + Sync>);

impl std::fmt::Debug for RecoveryWeight {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RecoveryWeight")
    }
}

impl RecoveryWeight {
    pub(super) fn set(&self, rebinding: bool) {
        (self.0)(rebinding)
    }
}
