//! `ember-agent mount-workspace <slot entry> <target>`: the in-sandbox half of
//! a workspace mount under gVisor, whose Sentry keeps its own mount table (see
//! `ember_runtime::oci::slot`). The daemon runs it through `runsc exec` as a
//! separate one-shot process holding `CAP_SYS_ADMIN` inside gVisor for this
//! one bind; the agent serving as PID 1 never holds it, so no command it
//! spawns can. The binary is the agent's own, bound read-only from the host,
//! so the workload cannot substitute the program that runs with it.
//!
//! Read-only workspaces are enforced on the host (the slot entry is a
//! read-only mount: gVisor's file server's writes fail with EROFS); this
//! gVisor release cannot remount a bind read-only (EINVAL) in its own VFS.
use std::path::Path;

/// The verb, as the first argument.
pub const VERB: &str = "mount-workspace";

/// Runs the verb with the arguments after it; the process's exit code.
pub fn run(args: &[String]) -> i32 {
    match mount(args) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("ember-agent {VERB}: {e}");
            1
        }
    }
}

fn mount(args: &[String]) -> Result<(), String> {
    let [source, target] = args else {
        return Err(format!("usage: ember-agent {VERB} <slot entry> <target>"));
    };
    let (source, target) = (Path::new(source), Path::new(target));
    let normal = |p: &Path| {
        p.is_absolute()
            && p.components().all(|c| matches!(c, std::path::Component::RootDir | std::path::Component::Normal(_)))
    };
    if !normal(source) || !normal(target) || target == Path::new("/") {
        return Err(format!("{} and {} must be absolute paths without . or ..", source.display(), target.display()));
    }
    std::fs::create_dir_all(target).map_err(|e| format!("creating {}: {e}", target.display()))?;
    ember_sys::slot::bind_mount(source, target).map_err(|e| format!("{e}: {}", e.source))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_arguments_are_refused_before_any_mount() {
        let a = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(run(&a(&["/.ember/ws/x"])), 1);
        assert!(mount(&a(&["/.ember/ws/x", "/"])).is_err());
        assert!(mount(&a(&["/.ember/ws/../etc", "/w"])).is_err());
        assert!(mount(&a(&["/.ember/ws/x", "relative"])).is_err());
    }
}
