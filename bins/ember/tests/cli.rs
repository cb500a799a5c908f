//! The `ember` CLI end to end: it is a client of the API only, so these drive
//! the built binary against a real daemon.
mod common;

use common::Daemon;
use std::process::{Command, Output};

fn ember(d: &Daemon, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_ember")).args(args).env("EMBER_URL", &d.url).output().expect("ember runs")
}

fn text(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

#[test]
fn create_exec_cp_inspect_ls_rm() {
    let d = Daemon::start();
    let o = ember(
        &d,
        &["sandbox", "create", "--memory", "128Mi", "--pids", "64", "--env", "GREETING=hello", "--label", "team=a"],
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let id = text(&o).trim().to_string();
    assert_eq!(id.len(), 36, "create prints the id: {id:?}");

    let o = ember(&d, &["exec", &id, "--", "sh", "-c", "echo $GREETING; echo oops >&2; exit 7"]);
    assert_eq!(o.status.code(), Some(7), "exit code propagates");
    assert_eq!(text(&o), "hello\n");
    assert_eq!(String::from_utf8_lossy(&o.stderr), "oops\n");

    let o = ember(&d, &["exec", &id, "--user", "0", "--cwd", "/tmp", "--", "sh", "-c", "id -u; pwd"]);
    assert_eq!(text(&o), "0\n/tmp\n");

    let local = d.data_dir.join("upload.txt");
    std::fs::write(&local, "payload\n").expect("write local file");
    let dst = format!("{id}:/tmp/up.txt");
    assert!(ember(&d, &["cp", local.to_str().expect("utf8"), &dst]).status.success());
    let o = ember(&d, &["exec", &id, "--", "cat", "/tmp/up.txt"]);
    assert_eq!(text(&o), "payload\n");
    let back = d.data_dir.join("back.txt");
    assert!(ember(&d, &["cp", &dst, back.to_str().expect("utf8")]).status.success());
    assert_eq!(std::fs::read_to_string(&back).expect("downloaded"), "payload\n");

    let o = ember(&d, &["sandbox", "inspect", &id, "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("inspect --json is JSON");
    assert_eq!(v["sandbox"]["status"]["state"], "Running");
    assert_eq!(v["sandbox"]["resources"]["memoryBytes"], 128 << 20);
    assert_eq!(v["boundary"]["memoryLimitBytes"], 128 << 20, "limit read back from the kernel");
    assert_eq!(v["boundary"]["pidsLimit"], 64);

    let o = ember(&d, &["sandbox", "ls", "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("ls --json is JSON");
    assert_eq!(v.as_array().map(|a| a.len()), Some(1));
    assert_eq!(v[0]["metadata"]["team"], "a");

    assert!(ember(&d, &["sandbox", "rm", &id]).status.success());
    let o = ember(&d, &["sandbox", "inspect", &id]);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("SANDBOX::NOT_FOUND"));
}

/// 100,000 bytes of every kind: invalid UTF-8, `\r\n`, lone `\r`, blank lines,
/// a line longer than the agent's 64 KiB cut, and no newline at the end.
fn binary_blob() -> Vec<u8> {
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut b: Vec<u8> = (0..30_000)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 56) as u8
        })
        .collect();
    b.extend_from_slice("a\r\nb\rc\n\n€\u{1F600}\n".as_bytes());
    b.extend(std::iter::repeat_n(b'z', 70_000 - 16));
    b.extend_from_slice(&[0xff, 0xfe, b'\r']);
    b.truncate(100_000);
    b
}

/// `ember sandbox create --memory 128Mi`; the new sandbox's id.
fn create_small(d: &Daemon) -> String {
    let o = ember(d, &["sandbox", "create", "--memory", "128Mi"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    text(&o).trim().to_string()
}

#[test]
fn exec_output_arrives_byte_for_byte() {
    let d = Daemon::start();
    let id = create_small(&d);
    let blob = binary_blob();
    let local = d.data_dir.join("blob.bin");
    std::fs::write(&local, &blob).expect("write local file");
    assert!(ember(&d, &["cp", local.to_str().expect("utf8"), &format!("{id}:/tmp/blob")]).status.success());
    let o = ember(&d, &["exec", &id, "--", "cat", "/tmp/blob"]);
    assert_eq!(o.status.code(), Some(0), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(o.stdout.len(), blob.len(), "stdout length");
    assert!(o.stdout == blob, "stdout differs from the file");
    let o = ember(&d, &["exec", &id, "--", "sh", "-c", "cat /tmp/blob >&2"]);
    assert!(o.stderr == blob, "stderr differs from the file ({} bytes)", o.stderr.len());
    // Text keeps its exact line ends too.
    let o = ember(&d, &["exec", &id, "--", "printf", "one\\r\\ntwo\\n\\nthree"]);
    assert_eq!(String::from_utf8_lossy(&o.stdout), "one\r\ntwo\n\nthree");
}

#[test]
fn run_creates_executes_and_removes() {
    let d = Daemon::start();
    let o = ember(&d, &["run", "--memory", "64Mi", "--", "sh", "-c", "hostname; exit 3"]);
    assert_eq!(o.status.code(), Some(3));
    assert!(text(&o).starts_with("sbx-"));
    let o = ember(&d, &["sandbox", "ls", "--json"]);
    assert_eq!(serde_json::from_slice::<serde_json::Value>(&o.stdout).expect("json"), serde_json::json!([]));
}

#[test]
fn bad_input_gets_a_clear_error() {
    let d = Daemon::start();
    let o = ember(&d, &["sandbox", "create", "--memory", "lots"]);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("SANDBOX::INVALID_PARAMETER") && err.contains("lots"), "{err}");
    let o = ember(&d, &["exec", "no-such-sandbox", "--", "true"]);
    assert!(String::from_utf8_lossy(&o.stderr).contains("SANDBOX::NOT_FOUND"));
    let o = ember(&d, &["sandbox", "create", "--template", "nope"]);
    assert!(String::from_utf8_lossy(&o.stderr).contains("SANDBOX::UNKNOWN_TEMPLATE"));
}

#[test]
fn a_non_loopback_listener_needs_an_api_key() {
    // A name of this run's own: other runs (and other checkouts) share /tmp.
    let dir = std::env::temp_dir().join(format!("ember-never-created-{}", std::process::id()));
    let o = Command::new(env!("CARGO_BIN_EXE_ember"))
        .args(["serve", "--listen", "0.0.0.0:0", "--data-dir"])
        .arg(&dir)
        .env_remove("EMBER_API_KEY")
        .output()
        .expect("ember runs");
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("needs an API key"));
    assert!(!dir.exists(), "refused before touching anything");
}

#[test]
fn an_api_key_is_enforced_when_configured() {
    let d = Daemon::start_with(&["--api-key", "k3y"]);
    let o = ember(&d, &["sandbox", "ls"]);
    assert!(String::from_utf8_lossy(&o.stderr).contains("MISSING_API_KEY"));
    let o = Command::new(env!("CARGO_BIN_EXE_ember"))
        .args(["sandbox", "ls", "--json"])
        .env("EMBER_URL", &d.url)
        .env("EMBER_API_KEY", "wrong")
        .output()
        .expect("ember runs");
    assert!(String::from_utf8_lossy(&o.stderr).contains("INVALID_API_KEY"));
    let o = Command::new(env!("CARGO_BIN_EXE_ember"))
        .args(["run", "--", "echo", "authorised"])
        .env("EMBER_URL", &d.url)
        .env("EMBER_API_KEY", "k3y")
        .output()
        .expect("ember runs");
    assert_eq!(text(&o), "authorised\n", "{}", String::from_utf8_lossy(&o.stderr));
}

#[test]
fn the_readiness_timeout_is_a_serve_flag() {
    // Release to exec alone takes far more than a nanosecond, so the create
    // fails and names the configured timeout: the flag reached the runtime.
    let d = Daemon::start_with(&["--ready-timeout", "1ns"]);
    let o = ember(&d, &["sandbox", "create"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.contains("within 1ns"), "{err}");
    let dir = std::env::temp_dir().join(format!("ember-never-created-rt-{}", std::process::id()));
    let o = Command::new(env!("CARGO_BIN_EXE_ember"))
        .args(["serve", "--ready-timeout", "0s", "--data-dir"])
        .arg(&dir)
        .output()
        .expect("ember runs");
    assert!(String::from_utf8_lossy(&o.stderr).contains("--ready-timeout must be more than 0"));
    assert!(!dir.exists(), "a bad flag is refused before the data dir is touched");
}

#[test]
fn cp_carries_any_bytes_under_any_name() {
    let d = Daemon::start();
    let id = create_small(&d);
    // What a fixed multipart boundary would be, inside the file: the upload
    // must not end there. And a name with a quote and a space.
    let mut blob = b"head\r\n--ember-upload-7d1f0a2c9b--\r\n".to_vec();
    blob.extend_from_slice(&binary_blob());
    let local = d.data_dir.join("blob.bin");
    std::fs::write(&local, &blob).expect("write local file");
    let remote = format!("{id}:/tmp/we\"ird name");
    let o = ember(&d, &["cp", local.to_str().expect("utf8"), &remote]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let o = ember(&d, &["exec", &id, "--", "cat", "/tmp/we\"ird name"]);
    assert_eq!(o.stdout.len(), blob.len(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(o.stdout == blob, "the uploaded file differs");
    let back = d.data_dir.join("back.bin");
    let o = ember(&d, &["cp", &remote, back.to_str().expect("utf8")]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(std::fs::read(&back).expect("downloaded") == blob, "the downloaded file differs");
}

#[test]
fn list_filters_are_url_encoded() {
    let d = Daemon::start();
    // A space and an `&` in a filter value: one value, not a broken request
    // or a second parameter.
    let o = ember(&d, &["snapshot", "ls", "--workspace", "no such&state=x", "--json"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(serde_json::from_slice::<serde_json::Value>(&o.stdout).expect("json"), serde_json::json!([]));
    let o = ember(&d, &["sandbox", "ls", "--state", "Running&x=1", "--json"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success() || err.contains("Running&x=1"), "{err}");
}

/// Debian's alternatives (`awk`, `vi`, `pager` are symlinks into
/// `/etc/alternatives`) resolve in the `host` template, whose `/etc` is
/// generated: only the alternatives' links come from the host, nothing else
/// of its `/etc`.
#[test]
fn host_template_resolves_debian_alternatives() {
    let d = Daemon::start();
    let script = "echo via-awk | awk 1; vi --version | head -n1; pager --version | head -n1; \
                  find /etc/alternatives -mindepth 1 ! -type l | wc -l; \
                  ls /etc/shadow /etc/machine-id /etc/apt 2>&1 | grep -c 'No such file'";
    let o = ember(&d, &["run", "--", "sh", "-c", script]);
    let out = text(&o);
    assert!(o.status.success(), "{out}{}", String::from_utf8_lossy(&o.stderr));
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.first(), Some(&"via-awk"), "{out}");
    assert!(lines.get(1).is_some_and(|l| l.starts_with("VIM - Vi IMproved")), "{out}");
    assert!(lines.get(2).is_some_and(|l| l.starts_with("less ")), "{out}");
    assert_eq!(lines.get(3), Some(&"0"), "only symlinks under /etc/alternatives: {out}");
    assert_eq!(lines.get(4), Some(&"3"), "the host's own /etc stays out: {out}");
}

/// Task flags out of range are refused with the flag named, before the data
/// dir is touched: a log cap of nothing, or a duration too long for the
/// millisecond clock (it used to wrap into a negative age).
#[test]
fn serve_refuses_task_flags_out_of_range() {
    let dir = std::env::temp_dir().join(format!("ember-never-created-task-{}", std::process::id()));
    for (flag, value, says) in [
        ("--task-log-limit", "0", "--task-log-limit"),
        ("--task-aging", "300000000y", "--task-aging"),
        ("--task-aging", "1000y", "at most 100 years"),
        ("--task-retention", "300000000y", "--task-retention"),
    ] {
        // A flag that is wrongly accepted starts a daemon: stop it and fail.
        let mut child = Command::new(env!("CARGO_BIN_EXE_ember"))
            .args(["serve", "--listen", "127.0.0.1:0", flag, value, "--data-dir"])
            .arg(&dir)
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("ember runs");
        let mut ended = None;
        for _ in 0..300 {
            ended = child.try_wait().expect("wait");
            if ended.is_some() {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        if ended.is_none() {
            let _ = child.kill();
            let _ = child.wait();
            let _ = Command::new("umount").args(["-R", "-l"]).arg(&dir).status();
            let _ = std::fs::remove_dir_all(&dir);
            panic!("ember serve {flag} {value} started instead of refusing the flag");
        }
        let o = child.wait_with_output().expect("output");
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success() && err.contains(says), "{flag} {value}: {err}");
        assert!(!err.contains("panicked"), "{flag} {value}: {err}");
        assert!(!dir.exists(), "{flag} {value}: a bad flag is refused before the data dir is touched");
    }
}
