//! Secrets (`secrets` on create and on a warm claim): files on a tmpfs at
//! `/run/secrets/<name>`, mode 0400 for the sandbox user, and nowhere else —
//! not in PID 1's environment nor a command's, not in `inspect`, not in the
//! data dir (records, agent logs, writable layers), not in a sandbox
//! snapshot or what a restore of it holds, not in the daemon's debug log.
mod common;

use common::Daemon;
use ember_types::api::{CreatePoolRequest, CreateSandboxRequest};
use ember_types::secrets::Secrets;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

/// A value no file of a fresh data dir could hold by chance.
fn value(tag: &str) -> String {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("clock").as_nanos();
    format!("ember-secret-{tag}-{}-{nanos}", std::process::id())
}

fn secrets(pairs: &[(&str, &str)]) -> Option<Secrets> {
    Some(Secrets(pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()))
}

/// Every file under `dir` holding `needle` (sockets and fifos skipped, not read).
fn files_holding(dir: &Path, needle: &str) -> String {
    let out = Command::new("grep").args(["-r", "-l", "-a", "-F", "-D", "skip", "-e", needle]).arg(dir).output();
    String::from_utf8_lossy(&out.expect("grep runs").stdout).into_owned()
}

/// What a sandbox's secret looks like from inside: its file (content, mode,
/// owner) as the default user, and whether PID 1's or a command's
/// environment carries the value. (`find -printf`, not `stat`: gVisor answers
/// coreutils' `statx` with EINVAL.)
async fn check_inside(d: &Daemon, id: &str, name: &str, value: &str) {
    let (code, out, err) =
        d.sh(id, &format!("cat /run/secrets/{name}; echo; find /run/secrets/{name} -printf '%m %U\\n'"), None).await;
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(out, format!("{value}\n400 1000\n"), "the file, as the sandbox user");
    let (_, fs, _) = d.sh(id, "stat -f -c %T /run/secrets", None).await;
    assert_eq!(fs.trim(), "tmpfs");
    let (code, env, err) = d.sh(id, "tr '\\0' '\\n' < /proc/1/environ; echo; env", Some(0)).await;
    assert_eq!(code, Some(0), "{err}");
    assert!(env.contains("PATH="), "the environments were read: {env}");
    assert!(!env.contains(value), "the value is in an environment:\n{env}");
    let (code, _, _) = d.sh(id, &format!("echo x > /run/secrets/{name}"), None).await;
    assert_ne!(code, Some(0), "the sandbox user could overwrite its secret");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_secret_is_a_file_for_the_sandbox_user_and_nowhere_else() {
    let log = std::env::temp_dir().join(format!("ember-secrets-log-{}", std::process::id()));
    let _ = std::fs::remove_file(&log);
    let d = Daemon::start_logging(&[], &log);
    let (cold, warm) = (value("cold"), value("warm"));

    // A cold create whose entrypoint looks for the file at once: it is
    // written before the entrypoint starts.
    let boot = "test -s /run/secrets/api-token && echo present > /tmp/boot || echo absent > /tmp/boot; sleep 600";
    let s = d
        .create(|r| {
            r.secrets = secrets(&[("api-token", &cold)]);
            r.entrypoint = Some(vec!["sh".into(), "-c".into(), boot.into()]);
        })
        .await;
    check_inside(&d, &s.id, "api-token", &cold).await;
    let mut seen = String::new();
    for _ in 0..200 {
        seen = d.sh(&s.id, "cat /tmp/boot 2>/dev/null", None).await.1;
        if !seen.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert_eq!(seen, "present\n", "the entrypoint ran before its secret was written");
    let inspect = serde_json::to_string(&d.client.get_sandbox(&s.id).await.expect("inspect")).expect("json");
    assert!(inspect.contains("\"secrets\":[\"api-token\"]"), "{inspect}");
    assert!(!inspect.contains(&cold), "inspect shows the value: {inspect}");

    // A sandbox snapshot holds the writable layer, not the secrets' tmpfs;
    // its restore has no secret of its own.
    let snap = d.client.snapshot_sandbox(&s.id, None).await.expect("snapshot");
    let req = CreateSandboxRequest { snapshot_id: Some(snap.id.clone()), ..Default::default() };
    let (restored, _) = d.client.create_sandbox(&req).await.expect("restore");
    let (code, out, err) = d.sh(&restored.id, "ls -A /run/secrets", None).await;
    assert_eq!((code, out.as_str()), (Some(0), ""), "{err}");
    assert!(restored.secrets.is_empty(), "{:?}", restored.secrets);

    // A warm claim binds its secrets like its env, and its record names them
    // as a cold create's does.
    let pool = CreatePoolRequest { template: "host".into(), min: 1, max: 1, ..Default::default() };
    one_idle(&d, pool).await;
    let claimed = d.create(|r| r.secrets = secrets(&[("db.password", &warm)])).await;
    assert_eq!(claimed.launch.as_ref().map(|l| l.kind.as_str()), Some("warm"));
    check_inside(&d, &claimed.id, "db.password", &warm).await;
    assert_eq!(claimed.secrets, ["db.password"], "a warm claim's record does not name its secrets");

    for v in [&cold, &warm] {
        assert_eq!(files_holding(&d.data_dir, v), "", "the data dir holds a secret");
        assert_eq!(files_holding(&log, v), "", "the daemon's log holds a secret");
    }
    let logged = std::fs::read_to_string(&log).expect("log");
    assert!(!logged.is_empty(), "the daemon logged nothing: the log check saw nothing");
    let _ = std::fs::remove_file(&log);
}

/// Creates `pool` and waits until it has an idle member.
async fn one_idle(d: &Daemon, pool: CreatePoolRequest) {
    let name = pool.name.clone().unwrap_or_else(|| pool.template.clone());
    d.client.create_pool(&pool).await.expect("pool");
    let mut idle = 0;
    for _ in 0..800 {
        idle = d.client.get_pool(&name).await.expect("pool").idle;
        if idle == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert_eq!(idle, 1, "pool {name} filled");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_secrets_are_refused_with_a_code_and_without_their_value() {
    let d = Daemon::start();
    let v = value("refused");
    let big = "x".repeat(ember_types::secrets::MAX_VALUE_BYTES + 1);
    for (name, val) in [("../escape", v.as_str()), ("a/b", v.as_str()), ("..", v.as_str()), ("big", big.as_str())] {
        let req = CreateSandboxRequest {
            template: Some("host".into()),
            secrets: secrets(&[(name, val)]),
            ..Default::default()
        };
        let e = d.client.create_sandbox(&req).await.expect_err("refused").to_string();
        assert!(e.contains("SANDBOX::INVALID_PARAMETER") && e.contains("secret"), "{name}: {e}");
        assert!(!e.contains(&v) && !e.contains(&big[..64]), "{name}: the error carries the value: {e}");
    }
    assert!(d.client.list_sandboxes("").await.expect("list").is_empty(), "a refused create left a sandbox");
}

/// The OCI classes get the same tmpfs from their bundle (a `tmpfs` mount at
/// `/run/secrets`); under gVisor the sandbox user can read PID 1's environ,
/// and a checkpoint (whose image would hold the tmpfs) is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oci_sandboxes_get_their_secrets_on_a_tmpfs() {
    let d = Daemon::start();
    for class in ["crun", "runsc"] {
        let v = value(class);
        let s = d
            .create(|r| {
                r.runtime_class = Some(class.into());
                r.secrets = secrets(&[("token", &v)]);
            })
            .await;
        check_inside(&d, &s.id, "token", &v).await;
        if class == "runsc" {
            // A checkpoint image holds the sandbox's memory, its tmpfs included.
            let e = d.client.checkpoint_sandbox(&s.id).await.expect_err("checkpoint refused").to_string();
            assert!(e.contains("SANDBOX::INVALID_PARAMETER") && e.contains("secrets"), "{e}");
        }
        assert_eq!(files_holding(&d.data_dir, &v), "", "{class}: the data dir holds a secret");
        d.client.delete_sandbox(&s.id).await.expect("delete");
    }
    // So is a warm claim's: the refusal reads the secrets' names from the
    // record, which the claim must fill (it did not, and the image kept them).
    let runsc = || Some("runsc".to_string());
    let pool =
        CreatePoolRequest { template: "host".into(), runtime_class: runsc(), min: 1, max: 1, ..Default::default() };
    one_idle(&d, pool).await;
    let v = value("warm-runsc");
    let s = d
        .create(|r| {
            r.runtime_class = runsc();
            r.secrets = secrets(&[("token", &v)]);
        })
        .await;
    assert_eq!(s.launch.as_ref().map(|l| l.kind.as_str()), Some("warm"));
    let e = d.client.checkpoint_sandbox(&s.id).await.expect_err("checkpoint of a claim refused").to_string();
    assert!(e.contains("SANDBOX::INVALID_PARAMETER") && e.contains("secrets"), "{e}");
    assert_eq!(files_holding(&d.data_dir, &v), "", "warm runsc: the data dir holds a secret");
}
