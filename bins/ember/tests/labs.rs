//! `ember lab run N --scale small` against a real daemon, as a newcomer runs
//! it: each lab's invariants read back from its report.json (never its
//! timings), and its files checked to exist and parse.
mod common;

use common::Daemon;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;

fn out_dir(d: &Daemon, lab: u32) -> PathBuf {
    let dir = d.data_dir.with_extension(format!("lab{lab}"));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

/// Runs the lab; returns its report.json. The lab exits non-zero when an
/// invariant failed, so the report is read either way and checked below.
fn run_lab(d: &Daemon, lab: u32, dir: &Path) -> Value {
    run_lab_at(&d.url, lab, dir)
}

fn run_lab_at(url: &str, lab: u32, dir: &Path) -> Value {
    run_lab_with(url, lab, dir, &[])
}

fn run_lab_with(url: &str, lab: u32, dir: &Path, extra: &[&str]) -> Value {
    let o = Command::new(env!("CARGO_BIN_EXE_ember"))
        .args(["lab", "run", &lab.to_string(), "--scale", "small", "--out"])
        .arg(dir)
        .args(extra)
        .env("EMBER_URL", url)
        // Lab 2's Kubernetes leg runs only when asked (tests/k8s/lab2.rs).
        .env_remove("KUBECONFIG")
        .output()
        .expect("ember runs");
    let text = String::from_utf8_lossy(&o.stdout);
    let err = String::from_utf8_lossy(&o.stderr);
    let raw = std::fs::read(dir.join("report.json")).unwrap_or_else(|e| panic!("no report.json ({e}): {text}\n{err}"));
    let v: Value = serde_json::from_slice(&raw).expect("report.json parses");
    assert!(o.status.success(), "lab {lab} failed: {text}\n{err}");
    assert!(text.contains("invariants"), "the tables and invariants are printed: {text}");
    v
}

/// report.md exists, every chart listed is well-formed SVG, and `ember lab
/// report` renders the run into the folder's page.
fn check_files(v: &Value, dir: &Path) {
    let md = std::fs::read_to_string(dir.join("report.md")).expect("report.md");
    assert!(md.starts_with("## Lab "), "{md}");
    let charts = v["charts"].as_array().expect("charts");
    assert!(!charts.is_empty(), "every lab draws at least one chart");
    for c in charts {
        let svg = std::fs::read_to_string(dir.join(c.as_str().expect("file name"))).expect("chart file");
        let mut r = quick_xml::Reader::from_str(&svg);
        let mut root = None;
        loop {
            match r.read_event().unwrap_or_else(|e| panic!("{c}: not well-formed XML: {e}")) {
                quick_xml::events::Event::Eof => break,
                quick_xml::events::Event::Start(e) if root.is_none() => {
                    root = Some(String::from_utf8_lossy(e.name().as_ref()).into_owned())
                }
                _ => {}
            }
        }
        assert_eq!(root.as_deref(), Some("svg"), "{c}");
    }
    let parent = dir.parent().expect("parent");
    let o = Command::new(env!("CARGO_BIN_EXE_ember")).args(["lab", "report"]).arg(dir).output().expect("ember runs");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let page = std::fs::read_to_string(dir.join("index.md")).expect("index.md");
    assert!(page.contains(v["title"].as_str().expect("title")), "{page}");
    assert!(parent.exists());
}

fn invariant<'a>(v: &'a Value, name: &str) -> &'a Value {
    let all = v["invariants"].as_array().expect("invariants");
    all.iter().find(|i| i["name"] == name).unwrap_or_else(|| panic!("no invariant {name:?}: {all:?}"))
}

#[test]
fn lab_1_the_oom_takes_the_shared_process_and_only_its_own_sandbox_and_the_secret_stays_out() {
    let d = Daemon::start();
    let dir = out_dir(&d, 1);
    let v = run_lab(&d, 1, &dir);
    let shared = &v["data"]["shared"];
    let ember = &v["data"]["ember"];
    // Before: the kernel's OOM killer ended the worker; both neighbours were
    // mid-task; the payload read both planted secrets.
    assert_eq!(shared["signal"], 9, "{shared}");
    assert_eq!(shared["hogCapped"], false, "the cgroup's limit, not the hog's cap, ended it: {shared}");
    for t in shared["tasks"].as_array().expect("tasks") {
        assert_eq!(t["finished"], false, "a neighbour outlived the shared process's OOM: {t}");
    }
    assert_eq!((shared["leakedEnv"].as_bool(), shared["leakedFile"].as_bool()), (Some(true), Some(true)), "{shared}");
    // After: only the hog's sandbox ended, with the reason; the others finished.
    assert_eq!(ember["hogReason"], "OOMKilled", "{ember}");
    assert_eq!(ember["neighboursRunning"], true, "{ember}");
    for t in ember["tasks"].as_array().expect("tasks") {
        assert_eq!(t["finished"], true, "a sandboxed neighbour died with the hog: {t}");
        assert_eq!(t["stepsDone"], t["steps"], "{t}");
    }
    assert_eq!((ember["leakedEnv"].as_bool(), ember["leakedFile"].as_bool()), (Some(false), Some(false)), "{ember}");
    for name in ["the OOM took the shared process", "the payload read no secret in the sandbox"] {
        assert_eq!(invariant(&v, name)["holds"], true, "{name}");
    }
    check_files(&v, &dir);
    // The lab's own cgroup is gone.
    let group = std::fs::read_dir("/sys/fs/cgroup/memory").into_iter().flatten().flatten();
    let left: Vec<_> = group.filter(|e| e.file_name().to_string_lossy().starts_with("ember-lab-")).collect();
    assert!(left.is_empty(), "lab cgroups left: {left:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lab_3_claims_warm_from_each_pool_and_checks_the_sizing_against_the_simulation() {
    let d = Daemon::start();
    let dir = out_dir(&d, 3);
    let v = tokio::task::spawn_blocking({
        let (url, dir) = (d.url.clone(), dir.clone());
        move || run_lab_at(&url, 3, &dir)
    })
    .await
    .expect("lab thread");
    let data = &v["data"];
    // Real claims: without a pool every create was cold; each pool, full at
    // the start, answered warm.
    assert_eq!(data["coldWarm"], 0, "{data}");
    assert_eq!(data["cold"]["samples"], 3, "{data}");
    let phases = data["phases"].as_array().expect("phases");
    assert_eq!(phases.iter().map(|p| p["pool"].as_u64()).collect::<Vec<_>>(), [Some(1), Some(2)]);
    for p in phases {
        assert!(p["hits"].as_u64() > Some(0), "a full pool answered no warm claim: {p}");
        assert_eq!(p["claims"], 6, "{p}");
    }
    assert_eq!(data["leftovers"], serde_json::json!([]), "{data}");
    // The sweep: one series per rate, pool size 0 never warm, and one sizing
    // row per rate from ember's own plan::size.
    let sim = data["simulation"].as_array().expect("simulation");
    assert_eq!(sim.len(), 3);
    for rate in sim {
        assert_eq!(rate[0]["hits"], 0, "{}", rate[0]);
    }
    assert_eq!(data["sizing"].as_array().map(Vec::len), Some(3));
    check_files(&v, &dir);
    // The lab removed its pool and every sandbox it claimed.
    assert!(d.client.list_pools().await.expect("pools").is_empty());
    let live = d.client.list_sandboxes("").await.expect("sandboxes");
    assert!(live.iter().all(|s| s.status.state != "Running"), "{live:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn lab_5_the_push_allocator_runs_stalled_tasks_twice_and_the_pull_queue_runs_each_once() {
    let dir = std::env::temp_dir().join(format!("ember-test-lab5-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    // Lab 5 needs no daemon: both sides run in the lab's process, the pull
    // side on ember's embedded queue.
    let v = run_lab_at("http://127.0.0.1:1", 5, &dir);
    let (push, pull) = (&v["data"]["push"], &v["data"]["pull"]);
    assert!(push["pauses"].as_u64() > Some(0) && push["crashes"].as_u64() > Some(0), "the fault plan ran: {push}");
    assert_eq!(push["pauses"], pull["pauses"], "the same faults on both sides");
    assert!(push["duplicated"].as_u64() > Some(0), "the push allocator ran no stalled task twice: {push}");
    assert_eq!(pull["exactlyOnce"], pull["tasks"], "{pull}");
    assert_eq!((pull["duplicated"].as_u64(), pull["lost"].as_u64()), (Some(0), Some(0)), "{pull}");
    assert!(pull["fenced"].as_u64() > Some(0), "stalled pullers were refused at report: {pull}");
    assert!(pull["overtakesMean"].as_f64() < push["overtakesMean"].as_f64(), "tiers: {pull} vs {push}");
    check_files(&v, &dir);
    assert!(!dir.join("queue").exists(), "the lab's queue journal is removed");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn lab_4_a_fresh_sandbox_carries_on_from_the_workspace_after_every_kill() {
    let d = Daemon::start();
    let dir = out_dir(&d, 4);
    let v = run_lab(&d, 4, &dir);
    let data = &v["data"];
    // Before: the records written in the killed sandbox's own layer are gone.
    assert!(data["baseline"]["written"].as_u64() > Some(0), "{data}");
    assert_eq!(data["baseline"]["survived"], 0, "{data}");
    // After: both kill modes ran, each fresh sandbox resumed from a record,
    // and the records are all there, once, in order, checksums intact.
    let after = &data["after"];
    let kills: Vec<&str> = after["kills"].as_array().expect("kills").iter().filter_map(|k| k[0].as_str()).collect();
    assert_eq!(kills, ["apiRemove", "sigkill", "apiRemove", "sigkill"], "{after}");
    let resumed: Vec<u64> = after["resumedAt"].as_array().expect("resumed").iter().filter_map(Value::as_u64).collect();
    assert_eq!(resumed.len(), 4, "{after}");
    assert!(resumed.windows(2).all(|w| w[0] < w[1]) && resumed[0] > 0, "each resumed past the last: {resumed:?}");
    assert_eq!(after["records"], data["total"], "{after}");
    assert_eq!(after["inOrder"], true, "{after}");
    for k in ["missing", "duplicated", "badChecksums"] {
        assert_eq!(after[k], 0, "{k}: {after}");
    }
    check_files(&v, &dir);
    // The lab removed its workspace and sandboxes.
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    assert!(rt.block_on(d.client.list_workspaces()).expect("workspaces").is_empty());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn lab_6_a_native_sandbox_sees_the_host_kernel_and_a_gvisor_one_does_not() {
    let d = Daemon::start();
    let dir = out_dir(&d, 6);
    let v = run_lab(&d, 6, &dir);
    let host = std::fs::read_to_string("/proc/sys/kernel/osrelease").expect("host release");
    let classes = v["data"]["classes"].as_array().expect("classes");
    let probe = |class: &str| {
        let c = classes.iter().find(|c| c["class"] == class).unwrap_or_else(|| panic!("no {class}: {classes:?}"));
        c["probe"].clone()
    };
    let (native, runsc) = (probe("native"), probe("runsc"));
    assert_eq!(native["release"], host.trim(), "{native}");
    assert_ne!(runsc["release"], host.trim(), "{runsc}");
    assert!(!runsc["procVersion"].as_str().unwrap_or(host.trim()).contains(host.trim()), "{runsc}");
    // ember's seccomp refuses the probe's dangerous calls in both classes.
    for p in [&native, &runsc] {
        for call in ["bpf", "keyctl", "init_module", "kexec_load", "perf_event_open", "userfaultfd"] {
            assert_eq!(p["syscalls"][call], "EPERM", "{call}: {p}");
        }
    }
    check_files(&v, &dir);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn lab_2_a_cold_node_pulls_each_new_image_and_every_request_reaches_its_first_instruction() {
    let port = std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("a free port").port();
    let d = Daemon::start_with(&["--insecure-registry", &format!("127.0.0.1:{port}")]);
    let dir = out_dir(&d, 2);
    let v = run_lab_with(&d.url, 2, &dir, &["--registry-port", &port.to_string()]);
    let data = &v["data"];
    assert_eq!(data["absentBefore"], data["runs"], "each cold request named an image new to the node: {data}");
    assert_eq!(data["cold"]["pull"]["samples"], data["runs"], "{data}");
    for side in ["cold", "cached"] {
        assert_eq!(data[side]["total"]["samples"], data["runs"], "{side}: {data}");
    }
    // Without a Kubernetes API the leg is skipped, with a note, not failed.
    assert!(data["kubernetesLeg"].is_null(), "{data}");
    let notes = v["notes"].as_array().expect("notes");
    assert!(notes.iter().any(|n| n.as_str().is_some_and(|n| n.contains("--kubeconfig"))), "{notes:?}");
    check_files(&v, &dir);
    // The lab removed its templates and images.
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    let templates = rt.block_on(d.client.list_templates()).expect("templates");
    assert!(templates.iter().all(|t| !t.name.starts_with("lab2-")), "{templates:?}");
    let _ = std::fs::remove_dir_all(&dir);
}
