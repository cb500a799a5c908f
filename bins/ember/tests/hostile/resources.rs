//! Resource exhaustion: fork bomb, memory balloon, disk fill (writable layer
//! and workspace), CPU spin, zombie storm.
use crate::harness::{Arena, Limits};
use crate::per_class;
use ember_types::api::WorkspaceMountSpec;
use std::time::Duration;

/// Counts processes with a glob (no fork needed when the pid limit is full).
const COUNT_PROCS: &str = "set -- /proc/[0-9]*; echo $#";

async fn fork_bomb(class: &'static str) {
    let a = Arena::new(class).await;
    let bomb = a.attacker(Limits { pids: 32, ..Default::default() }).await;
    // dash gives up at its first failed fork, so the bomb is a child shell;
    // its sleeps are short so the sandbox is usable again afterwards.
    let script = format!("sh -c 'for i in $(seq 300); do sleep 4 & done' 2>/dev/null; {COUNT_PROCS}");
    let mut out = String::new();
    let req = ember_types::execd::RunCommandRequest { command: Some(script), ..Default::default() };
    let _ =
        a.d.client
            .exec(&bomb.id, &req, |ev| {
                if ev.kind == "stdout" {
                    out.push_str(ev.text.as_deref().unwrap_or(""))
                }
            })
            .await;
    if class == "runsc" {
        // The limit binds on host tasks (Sentry threads, ptrace stubs; see
        // OciClass::host_pids): reaching it ends the whole gVisor sandbox,
        // killed, or (seen once in CI) by the Sentry's own exit: Go's runtime
        // exits with status 2 when it cannot start an OS thread.
        let ends = [("Terminated", "Killed"), ("Failed", "Exited(2)")];
        a.assert_ended_as_one_of(&bomb.id, &ends, Duration::from_secs(30)).await;
        a.assert_unaffected().await;
        return;
    }
    let seen: usize = out.trim().parse().unwrap_or_else(|_| panic!("{class}: a process count, got {out:?}"));
    assert!(seen <= 32, "{class}: {seen} processes visible under a pids limit of 32");
    assert!(seen >= 10, "{class}: the bomb should have filled the limit, saw {seen}");
    let tasks = a.d.tasks(class, &bomb.id);
    assert!(tasks <= 32, "{class}: {tasks} host tasks in the cgroup under a limit of 32");
    a.assert_unaffected().await;
    // Once the sleeps end the attacker is usable again: the agent survived.
    let mut answered = false;
    for _ in 0..100 {
        let req = ember_types::execd::RunCommandRequest { command: Some("echo back".into()), ..Default::default() };
        let mut out = String::new();
        let r = a.d.client.exec(&bomb.id, &req, |ev| out.push_str(ev.text.as_deref().unwrap_or(""))).await;
        if r.is_ok_and(|r| r.exit_code == Some(0)) && out.contains("back") {
            answered = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(answered, "{class}: the attacker's agent never answered again after the bomb");
    a.remove(&bomb.id).await;
    a.assert_unaffected().await;
}
per_class!(fork_bomb);

async fn memory_balloon(class: &'static str) {
    let a = Arena::new(class).await;
    let hog = a.attacker(Limits { memory: "64Mi", ..Default::default() }).await;
    // A 300 MiB buffer, touched: far over the limit. The stream may end with
    // an error or be cut when the sandbox is torn down; the state is what counts.
    let req = ember_types::execd::RunCommandRequest {
        command: Some("dd if=/dev/zero of=/dev/null bs=300M count=1".into()),
        ..Default::default()
    };
    let _ = a.d.client.exec(&hog.id, &req, |_| {}).await;
    a.assert_ended(&hog.id, "Failed", "OOMKilled", Duration::from_secs(30)).await;
    a.assert_unaffected().await;
}
per_class!(memory_balloon);

/// Fills a mount with `dd` until ENOSPC; returns (dd's exit code, what it said).
async fn fill(a: &Arena, id: &str, file: &str) -> (Option<i32>, String) {
    let script = format!("dd if=/dev/zero of={file} bs=1M count=400 2>&1; echo rc=$?");
    let (code, out, err) = a.d.sh(id, &script, None).await;
    (code, format!("{out}{err}"))
}

async fn disk_fill_writable_layer(class: &'static str) {
    let a = Arena::new(class).await;
    let s = a.attacker(Limits { memory: "512Mi", disk: Some("64Mi"), ..Default::default() }).await;
    let (_, out) = fill(&a, &s.id, "/home/sandbox/fill").await;
    assert!(out.contains("No space left on device"), "{class}: filling the writable layer: {out}");
    assert!(!out.contains("rc=0"), "{class}: dd succeeded past the disk limit: {out}");
    let (_, size, _) = a.d.sh(&s.id, "wc -c < /home/sandbox/fill", None).await;
    let size: u64 = size.trim().parse().unwrap_or(u64::MAX);
    assert!(size <= 64 << 20, "{class}: {size} bytes written under a 64 MiB disk");
    // Full, but alive: freeing space makes it writable again.
    let (code, out, _) =
        a.d.sh(&s.id, "rm /home/sandbox/fill && echo ok > /home/sandbox/small && cat /home/sandbox/small", None).await;
    assert_eq!((code, out.as_str()), (Some(0), "ok\n"), "{class}: the sandbox after a full disk");
    a.assert_unaffected().await;
    a.remove(&s.id).await;
}
per_class!(disk_fill_writable_layer);

async fn disk_fill_workspace(class: &'static str) {
    let a = Arena::new(class).await;
    a.d.client.create_workspace("hostile", "64Mi").await.expect("create workspace");
    let mut req = a.request(Limits { memory: "512Mi", ..Default::default() });
    req.workspaces = vec![WorkspaceMountSpec { name: "hostile".into(), ..Default::default() }];
    let created = a.d.client.create_sandbox(&req).await;
    let s = created.unwrap_or_else(|e| panic!("{class}: create with a workspace: {e}")).0;
    let (_, out) = fill(&a, &s.id, "/workspace/fill").await;
    assert!(out.contains("No space left on device"), "{class}: filling the workspace: {out}");
    let (code, out, _) = a.d.sh(&s.id, "rm /workspace/fill && echo ok > /workspace/f && cat /workspace/f", None).await;
    assert_eq!((code, out.as_str()), (Some(0), "ok\n"), "{class}: the workspace after it was full");
    a.assert_unaffected().await;
    a.remove(&s.id).await;
    // The lease is released: the workspace can be mounted again.
    let (again, _) = a.d.client.create_sandbox(&req).await.expect("the workspace mounts again");
    let (code, out, _) = a.d.sh(&again.id, "cat /workspace/f", None).await;
    assert_eq!((code, out.as_str()), (Some(0), "ok\n"));
    a.remove(&again.id).await;
}
per_class!(disk_fill_workspace);

async fn cpu_spin(class: &'static str) {
    let a = Arena::new(class).await;
    // Half a core, four spinners, and a TTL: the spin must end as Expired.
    let spin = a.attacker(Limits { cpu: Some("500m"), ttl_secs: Some(8), ..Default::default() }).await;
    let (code, _, _) = a.d.sh(&spin.id, "for i in 1 2 3 4; do sh -c 'while :; do :; done' & done; echo go", None).await;
    assert_eq!(code, Some(0), "{class}: starting the spinners");
    tokio::time::sleep(Duration::from_millis(500)).await;
    let during = a.neighbour_latency().await;
    // Relative to the same neighbour before the spin, with a generous factor:
    // the quota caps the spinner at half of one of the node's cores.
    let bound = a.baseline * 10 + Duration::from_millis(20);
    assert!(during <= bound, "{class}: neighbour exec {during:?} during the spin vs {:?} before", a.baseline);
    a.assert_ended(&spin.id, "Terminated", "Expired", Duration::from_secs(30)).await;
    a.assert_unaffected().await;
}
per_class!(cpu_spin);

async fn zombie_storm(class: &'static str) {
    let a = Arena::new(class).await;
    // 128: under gVisor's ptrace platform a process costs ~13-25 host tasks
    // (OciClass::host_pids), and a storm is not a bomb: it must fit.
    let s = a.attacker(Limits { pids: 128, ..Default::default() }).await;
    // Rounds of 40 children that exit at once under a parent that never reaps
    // them; the parent then exits, and the orphans go to PID 1 (the agent).
    let storm = "for r in 1 2 3 4 5; do perl -e 'for (1..40) { fork or exit 0 } sleep 1'; done; echo done";
    let (code, out, _) = a.d.sh(&s.id, storm, None).await;
    assert_eq!((code, out.as_str()), (Some(0), "done\n"), "{class}: the storm ran (a fork failed?)");
    // During a round the zombies are there (the check can fail)...
    let count = r#"perl -e 'for (1..30) { fork or exit 0 } sleep 1; my $n = 0;
        for (glob "/proc/[0-9]*/stat") { open my $f, "<", $_ or next; $n++ if <$f> =~ /\) Z / } print "$n\n"'"#;
    let (_, z, _) = a.d.sh(&s.id, count, None).await;
    let zombies: usize = z.trim().parse().unwrap_or(0);
    assert!(zombies >= 20, "{class}: expected the unreaped children as zombies, saw {z:?}");
    // ...and once their parent is gone, PID 1 reaps them all.
    let mut left = usize::MAX;
    for _ in 0..50 {
        let (_, z, _) = a.d.sh(&s.id, "grep -l '^[0-9]* ([^)]*) Z' /proc/[0-9]*/stat 2>/dev/null | wc -l", None).await;
        left = z.trim().parse().unwrap_or(usize::MAX);
        if left == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(left, 0, "{class}: zombies were not reaped by PID 1");
    // The pid budget is whole again: 50 processes at once fit.
    let (code, out, _) = a.d.sh(&s.id, &format!("for i in $(seq 50); do sleep 1 & done; {COUNT_PROCS}"), None).await;
    assert_eq!(code, Some(0), "{class}: forking after the storm: {out}");
    a.assert_unaffected().await;
    a.remove(&s.id).await;
}
per_class!(zombie_storm);
