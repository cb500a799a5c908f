//! How often a sandbox's launch and removal run its OCI runtime. A run of
//! runsc starts a ~50 MB Go binary (~15 ms here) on the path of every create
//! and removal: a launch runs `run --detach` (the init's pid in its
//! `--pid-file`), a removal `delete --force`, and nothing else: no separate
//! `create` and `start`, no `state` for the pid, none polled while the agent
//! comes up (the init's pidfd says whether the container stopped), no `kill`
//! before the delete (docs/performance.md, "Fewer runs of the runtime").
//! Under gVisor a checkpoint runs `checkpoint` and `delete`, and the resume
//! `restore` alone (its pid from the `--pid-file` too; no `delete` ahead of
//! it unless the restore fails). None of these steps runs mount(8) or
//! umount(8): the rootfs, its tmpfs and runsc's workspace slot are the
//! daemon's own syscalls (a process each was ~4 ms on the same paths).
use crate::common::Daemon;
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// A binary (an OCI runtime, mount) on this process's PATH.
fn real_binary(name: &str) -> PathBuf {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
        .unwrap_or_else(|| panic!("{name} is not on PATH (.ci/run installs it)"))
}

/// The verb of one logged command line: the first word that is not a global
/// flag (`--root` takes the next word; the others are `--flag=value`).
fn verb(line: &str) -> String {
    let mut words = line.split_whitespace();
    while let Some(w) = words.next() {
        match w {
            "--root" => _ = words.next(),
            w if w.starts_with("--") => {}
            w => return w.to_string(),
        }
    }
    String::new()
}

async fn runtime_runs(class: &str, expected: &[&str]) {
    // Removed when the test ends, passed or failed (a panic unwinds).
    let tmp = tempfile::Builder::new().prefix(&format!("ember-runs-{class}-")).tempdir().expect("wrapper dir");
    let dir = tmp.path();
    let (log, mounts) = (dir.join("runs.log"), dir.join("mounts.log"));
    // The real runtime, mount(8) and umount(8) behind wrappers that log
    // each command line first.
    for (name, log) in [(class, &log), ("mount", &mounts), ("umount", &mounts)] {
        let wrapper = dir.join(name);
        let script = format!(
            "#!/bin/sh\nprintf '%s\\n' \"$*\" >> '{}'\nexec '{}' \"$@\"\n",
            log.display(),
            real_binary(name).display()
        );
        std::fs::write(&wrapper, script).expect("write wrapper");
        std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755)).expect("chmod wrapper");
    }
    let path = format!("{}:{}", dir.display(), std::env::var("PATH").unwrap_or_default());
    let d = Daemon::start_with_env(&[], &[("PATH", &path)]);

    let s = super::create(&d, class, "128Mi").await;
    let (code, out, _) = d.sh(&s.id, "echo ready", None).await;
    assert_eq!((code, out.as_str()), (Some(0), "ready\n"), "a command in the {class} sandbox");
    if expected.contains(&"checkpoint") {
        d.client.checkpoint_sandbox(&s.id).await.expect("checkpoint");
        d.client.resume_sandbox(&s.id).await.expect("resume");
        let (code, out, _) = d.sh(&s.id, "echo resumed", None).await;
        assert_eq!((code, out.as_str()), (Some(0), "resumed\n"), "a command after the resume");
    }
    d.client.delete_sandbox(&s.id).await.expect("delete");
    let deadline = Instant::now() + Duration::from_secs(10);
    while !d.leftovers(class, &s.id).is_empty() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(d.leftovers(class, &s.id), Vec::<String>::new(), "what the removal left");

    let runs = std::fs::read_to_string(&log).expect("the wrapper's log");
    let verbs: Vec<String> = runs.lines().filter(|l| l.contains(s.id.as_str())).map(verb).collect();
    assert_eq!(verbs, expected, "{class} runs for one sandbox:\n{runs}");
    let mount_runs = std::fs::read_to_string(&mounts).unwrap_or_default();
    let ours: Vec<&str> = mount_runs.lines().filter(|l| l.contains(s.id.as_str())).collect();
    assert_eq!(ours, Vec::<&str>::new(), "mount(8)/umount(8) runs for a {class} sandbox");
    drop(d);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_launch_and_a_removal_run_runsc_twice_and_a_checkpoint_and_resume_three_times() {
    runtime_runs("runsc", &["run", "checkpoint", "delete", "restore", "delete"]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_launch_and_a_removal_run_crun_twice() {
    runtime_runs("crun", &["run", "delete"]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_launch_and_a_removal_run_runc_twice() {
    runtime_runs("runc", &["run", "delete"]).await;
}
