//! The pool section of the conformance suite: a template names its class, a
//! pool of it fills, claims are warm and bind the caller's env, user and
//! entrypoint through the agent (an entrypoint's exit ends the claimed
//! sandbox with its code), the pool refills, and removing the claimed
//! sandboxes and the pool leaves nothing, in every class.
use crate::common::Daemon;
use bytes::Bytes;
use ember_types::api::{CreatePoolRequest, CreateSandboxRequest, SandboxInfo};
use ember_types::image::TemplateRequest;
use ember_types::UserSpec;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// Idle sandboxes the pool keeps.
const SIZE: u32 = 2;
/// How long a pool of the slowest class (gVisor) may take to fill.
const FILL: Duration = Duration::from_secs(60);

/// Waits until the pool holds `n` idle sandboxes and none is starting.
async fn wait_idle(d: &Daemon, name: &str, n: u32) -> ember_types::api::PoolInfo {
    let deadline = Instant::now() + FILL;
    loop {
        let p = d.client.get_pool(name).await.expect("get pool");
        if (p.idle == n && p.starting == 0) || Instant::now() > deadline {
            return p;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn claim(d: &Daemon, template: &str, f: impl FnOnce(&mut CreateSandboxRequest)) -> SandboxInfo {
    let mut req = CreateSandboxRequest { template: Some(template.into()), ..Default::default() };
    f(&mut req);
    d.client.create_sandbox(&req).await.unwrap_or_else(|e| panic!("claim from {template}: {e}")).0
}

/// Every sandbox of `class` the host still holds anything of: host dirs,
/// cgroups, containers the runtime lists.
fn all_leftovers(d: &Daemon, class: &str) -> Vec<String> {
    let (dir, group) = match class {
        "native" => (d.data_dir.join("sandboxes"), d.group.clone()),
        c => (d.data_dir.join("oci").join(c).join("sandboxes"), format!("{}-{c}", d.group)),
    };
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    let cg = ember_cgroups::detect("/sys/fs/cgroup".as_ref(), &group).expect("cgroups");
    names.extend(cg.list().unwrap_or_default());
    if class != "native" {
        let root = d.data_dir.join("oci").join(class).join("state");
        let out = std::process::Command::new(class).arg("--root").arg(&root).args(["list", "-q"]).output();
        let out = out.map(|o| String::from_utf8_lossy(&o.stdout).into_owned()).unwrap_or_default();
        names.extend(out.split_whitespace().map(String::from));
    }
    names.sort();
    names.dedup();
    names.into_iter().flat_map(|n| d.leftovers(class, &n).into_iter().map(move |l| format!("{n}: {l}"))).collect()
}

async fn wait_no_leftovers(d: &Daemon, class: &str) -> Vec<String> {
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut left = all_leftovers(d, class);
    while !left.is_empty() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
        left = all_leftovers(d, class);
    }
    left
}

pub async fn pool_conformance(class: &str) {
    let d = Daemon::start();
    let template = format!("pool-{class}");
    let env = BTreeMap::from([("FROM".to_string(), "template".to_string()), ("KEEP".to_string(), "t".to_string())]);
    let t = TemplateRequest {
        name: template.clone(),
        runtime_class: Some(class.into()),
        env: Some(env),
        ..Default::default()
    };
    let ti = d.client.create_template(&t).await.unwrap_or_else(|e| panic!("{class} template: {e}"));
    assert_eq!(ti.runtime_class, class);
    let req = CreatePoolRequest {
        name: Some(template.clone()),
        template: template.clone(),
        min: SIZE,
        max: SIZE,
        target: Some(SIZE.into()),
        ..Default::default()
    };
    let p = d.client.create_pool(&req).await.unwrap_or_else(|e| panic!("{class} pool: {e}"));
    assert_eq!(p.runtime_class, class, "the pool takes its template's class");
    let p = wait_idle(&d, &template, SIZE).await;
    assert_eq!((p.idle, p.create_failures), (SIZE, 0), "{class} pool did not fill: {p:?}");

    // A claim with env, a user and an entrypoint, all bound through the agent.
    let a = claim(&d, &template, |r| {
        r.env = Some(BTreeMap::from([("FROM".to_string(), Some("claim".to_string()))]));
        r.user = Some(UserSpec { uid: 0, gid: 0 });
        r.entrypoint = Some(vec![
            "sh".into(),
            "-c".into(),
            "echo \"$FROM\" > /tmp/entry; id -u >> /tmp/entry; exec sleep 600".into(),
        ]);
    })
    .await;
    assert_eq!(a.launch.as_ref().map(|l| l.kind.as_str()), Some("warm"), "{class}: {a:?}");
    assert_eq!(a.status.state, "Running");
    let (code, out, _) = d.sh(&a.id, "echo \"$FROM $KEEP\"; id -u", None).await;
    assert_eq!((code, out.as_str()), (Some(0), "claim t\n0\n"), "{class}: env and user bound at claim");
    let mut entry = String::new();
    for _ in 0..100 {
        entry = d.sh(&a.id, "cat /tmp/entry 2>/dev/null", None).await.1;
        if entry.lines().count() == 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(entry, "claim\n0\n", "{class}: the claimed entrypoint ran with the claim's env and user");

    // A claim with nothing bound: the template's env, the default user.
    let b = claim(&d, &template, |_| {}).await;
    assert_eq!(b.launch.as_ref().map(|l| l.kind.as_str()), Some("warm"), "{class}: {b:?}");
    let (code, out, _) = d.sh(&b.id, "echo \"$FROM $KEEP\"; id -u", None).await;
    assert_eq!((code, out.as_str()), (Some(0), "template t\n1000\n"), "{class}: defaults of an unbound claim");

    // Files through the agent of a claimed sandbox.
    let data = Bytes::from(format!("claimed {class}\n").repeat(100));
    d.client.upload(&b.id, "/home/sandbox/in.txt", data.clone(), 0o644).await.expect("upload");
    let (code, _, _) = d.sh(&b.id, "cp /home/sandbox/in.txt /tmp/out.txt", None).await;
    assert_eq!(code, Some(0));
    assert_eq!(d.client.download(&b.id, "/tmp/out.txt").await.expect("download"), data);

    // A claimed entrypoint that exits at once ends its sandbox with its code.
    let p = wait_idle(&d, &template, SIZE).await;
    assert_eq!(p.idle, SIZE, "{class}: refill {p:?}");
    let c = claim(&d, &template, |r| r.entrypoint = Some(vec!["sh".into(), "-c".into(), "exit 4".into()])).await;
    assert_eq!(c.launch.as_ref().map(|l| l.kind.as_str()), Some("warm"), "{class}: {c:?}");
    let c = d.wait_state(&c.id, "Failed", Duration::from_secs(20)).await;
    assert_eq!(c.status.reason.as_deref(), Some("Exited(4)"), "{class}: {:?}", c.status);

    // Refill; claimed sandboxes are the callers', not idle members.
    let p = wait_idle(&d, &template, SIZE).await;
    assert_eq!((p.idle, p.claims_total, p.misses_total), (SIZE, 3, 0), "{class}: refill {p:?}");
    let listed = d.client.list_sandboxes("").await.expect("list");
    assert_eq!(listed.len(), 3, "{class}: idle members are not listed");

    // Removing the claimed sandboxes, then the pool, leaves nothing.
    for id in [&a.id, &b.id, &c.id] {
        d.client.delete_sandbox(id).await.expect("delete claimed");
    }
    d.client.delete_pool(&template).await.expect("delete pool");
    let left = wait_no_leftovers(&d, class).await;
    assert!(left.is_empty(), "{class}: pool and claims left {left:?}");
    d.client.delete_template(&template).await.expect("delete template");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pool_native() {
    pool_conformance("native").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pool_crun() {
    pool_conformance("crun").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pool_runc() {
    pool_conformance("runc").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pool_runsc() {
    pool_conformance("runsc").await;
}
