//! The hostile-workload suite: the same attacks against every runtime class
//! (`native`, `crun`, `runc`, `runsc`), through a real daemon. Each case runs in
//! an [`harness::Arena`] with a quiet neighbour sandbox, and ends by checking
//! that the neighbour and the daemon are unaffected and that the attacker ended
//! with the right reason (or is removed without leftovers when it survives).
//! Where a class genuinely differs (gVisor has its own kernel, `/proc` and
//! process table), the case asserts that class's behaviour and says why.
//!
//! OCI classes fail, not skip, when their runtime is missing: `.ci/run`
//! installs them.
mod common;
#[path = "hostile/files.rs"]
mod files;
#[path = "hostile/harness.rs"]
mod harness;
#[path = "hostile/probes.rs"]
mod probes;
#[path = "hostile/resources.rs"]
mod resources;
