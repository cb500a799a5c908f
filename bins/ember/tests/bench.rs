//! `ember bench create` against a real daemon: ember and its crun reference do
//! the same work and are timed from the same side, and the bench leaves the
//! host as it found it (no package installs).
mod common;

use common::{agent_bin, Daemon};
use serde_json::Value;
use std::process::{Command, Output};

fn bench_create(d: &Daemon, runs: &str, path: Option<&std::path::Path>) -> Output {
    // The agent named relative to the bench's working directory, as
    // `EMBER_AGENT_BIN=target/release/ember-agent-static` from a checkout.
    let agent = agent_bin();
    let (dir, file) = (agent.parent().expect("the agent's dir"), agent.file_name().expect("the agent's name"));
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_ember"));
    cmd.args(["bench", "create", "--runs", runs, "--json"])
        .current_dir(dir)
        .env("EMBER_URL", &d.url)
        .env("EMBER_AGENT_BIN", std::path::Path::new(".").join(file));
    if let Some(p) = path {
        cmd.env("PATH", p);
    }
    cmd.output().expect("ember runs")
}

fn json(o: &Output) -> Value {
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "ember bench create failed: {err}");
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&o.stdout)))
}

#[test]
fn bench_create_times_crun_like_ember_and_judges_the_target_on_the_client_side() {
    let d = Daemon::start();
    let v = json(&bench_create(&d, "3", None));
    let targets = v["targets"].as_array().expect("targets");
    let create = targets.iter().find(|t| t["figure"].as_str().unwrap_or("").starts_with("cold create")).expect("row");
    assert_eq!(create["p50Ms"], v["ember"]["createWall"]["p50Ms"], "the target is judged on the client's wall time");

    let crun = &v["crun"];
    assert_eq!(crun["createToReady"]["samples"], 3, "crun measured to ready: {crun}");
    assert_eq!(crun["createToReady"]["failed"], 0, "{crun}");
    // The reference's init is ember's agent under ember's seccomp filter and
    // user mapping, read from the host's /proc.
    assert_eq!(crun["init"]["seccomp"], "2", "{crun}");
    assert_eq!(crun["init"]["uidMap"], "0 1000000000 65536", "{crun}");
    assert_eq!(crun["exec"]["failed"], 0, "{crun}");
}

/// Without crun on PATH the bench reports what is missing and which script
/// installs it; it never runs a package manager itself.
#[test]
fn bench_create_without_crun_names_the_setup_script_and_installs_nothing() {
    let d = Daemon::start();
    let bin = d.data_dir.with_extension("path");
    std::fs::create_dir_all(&bin).unwrap();
    let marker = bin.join("apt-get-ran");
    let stub = format!("#!/bin/sh\necho \"$@\" >> {}\nexit 1\n", marker.display());
    for name in ["apt-get", "apt"] {
        let p = bin.join(name);
        std::fs::write(&p, &stub).unwrap();
        std::fs::set_permissions(&p, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    }
    let o = bench_create(&d, "1", Some(&bin));
    let ran = std::fs::read_to_string(&marker).ok();
    let _ = std::fs::remove_dir_all(&bin);
    assert_eq!(ran, None, "the bench ran a package manager");
    let v = json(&o);
    let why = v["crun"]["unavailable"].as_str().unwrap_or_else(|| panic!("crun should be unavailable: {}", v["crun"]));
    assert!(why.contains("scripts/bench-setup.sh"), "{why}");
}

/// `ember bench claim --from-snapshot SNAP` on a snapshot with a workspace:
/// every figure measured (cold restores, plain and golden claims, each
/// launched as expected), and the bench leaves no pool, sandbox or
/// restored workspace copy behind. Then `ember bench autopause`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bench_claim_from_snapshot_and_bench_autopause_measure_and_clean_up() {
    let d = Daemon::start();
    d.client.create_workspace("data", "16Mi").await.expect("workspace");
    let ws = ember_types::api::WorkspaceMountSpec { name: "data".into(), ..Default::default() };
    let src = d.create(|r| r.workspaces = vec![ws]).await;
    d.sh(&src.id, "echo primed > /workspace/model", None).await;
    let sid = d.client.snapshot_sandbox(&src.id, None).await.expect("snapshot").id;
    d.client.delete_sandbox(&src.id).await.expect("delete the source");

    let bench = |args: &[&str]| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_ember"));
        cmd.arg("bench").args(args).arg("--json").env("EMBER_URL", &d.url);
        let o = cmd.output().expect("ember runs");
        let err = String::from_utf8_lossy(&o.stderr).into_owned();
        assert!(o.status.success(), "ember bench {args:?} failed: {err}");
        serde_json::from_slice::<Value>(&o.stdout).unwrap_or_else(|e| panic!("{e}: {err}"))
    };
    let v = bench(&["claim", "--from-snapshot", &sid, "--runs", "2"]);
    for row in ["coldRestore", "plainClaim", "goldenClaim"] {
        assert_eq!((&v[row]["samples"], &v[row]["failed"]), (&Value::from(2), &Value::from(0)), "{row}: {v}");
    }
    assert_eq!(v["wrongKind"], 0, "{v}");
    assert!(v["goldenRefillMs"].as_f64().is_some_and(|ms| ms > 0.0), "{v}");
    assert!(d.client.list_pools().await.expect("pools").is_empty(), "the bench left a pool");
    assert!(d.client.list_sandboxes("").await.expect("sandboxes").is_empty(), "the bench left a sandbox");
    let names: Vec<String> =
        d.client.list_workspaces().await.expect("workspaces").into_iter().map(|w| w.name).collect();
    assert_eq!(names, ["data"], "the bench left restored workspace copies");
    d.client.delete_sandbox_snapshot(&sid).await.expect("the bench's pools are gone: the snapshot is free");

    let v = bench(&["autopause", "--runs", "1"]);
    for row in ["resumeOnCall", "plainExec"] {
        assert_eq!((&v[row]["samples"], &v[row]["failed"]), (&Value::from(1), &Value::from(0)), "{row}: {v}");
    }
}

/// `ember bench mounts` puts each figure beside its reference (mount(8); the
/// host namespace's `mkfs.ext4`), every one measured, and leaves no mount
/// and no work dir behind.
#[test]
fn bench_mounts_measures_both_sides_and_leaves_nothing() {
    let dir = std::env::temp_dir().join(format!("ember-bench-mounts-test-{}", std::process::id()));
    let o = Command::new(env!("CARGO_BIN_EXE_ember"))
        .args(["bench", "mounts", "--runs", "3", "--tables", "0,50", "--work-dir"])
        .arg(&dir)
        .output()
        .expect("ember runs");
    let (out, err) = (String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    assert!(o.status.success(), "ember bench mounts failed: {out}{err}");
    let rows: Vec<&str> = out.lines().filter(|l| l.trim_start().starts_with(char::is_numeric)).collect();
    assert_eq!(rows.len(), 2, "one row per table size: {out}");
    for r in rows {
        // host mounts, load, then four p50/p90/p99 cells, all measured.
        let cells: Vec<&str> = r.split_whitespace().collect();
        assert_eq!(cells.len(), 6, "{r}");
        for c in &cells[2..] {
            let figures: Vec<f64> = c.split('/').map(|x| x.parse().unwrap_or_else(|_| panic!("{c} in {r}"))).collect();
            assert!(figures.len() == 3 && figures.iter().all(|x| *x > 0.0), "{c} in {r}");
        }
    }
    assert!(!dir.exists(), "the work dir is left: {}", dir.display());
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(!mounts.contains(&*dir.to_string_lossy()), "mounts left under {}", dir.display());
}
