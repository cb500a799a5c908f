//! Agent-level behaviour: health, unknown routes, metrics, the environment
//! commands see, the entrypoint and shutdown.
mod common;

use common::{kinds, require_root, texts, Agent};
use std::io::{Read, Write};
use std::time::{Duration, Instant};

#[test]
fn ping_and_unknown_routes() {
    let agent = Agent::start();
    let r = agent.get("/ping");
    assert_eq!((r.status, r.body.len()), (200, 0));
    agent.get("/session").assert_error(404, "NOT_SUPPORTED");
    agent.request("PUT", "/ping", &[], b"").assert_error(404, "NOT_SUPPORTED");
}

#[test]
fn metrics_and_watch() {
    let agent = Agent::start();
    let m = agent.get("/metrics").json();
    for k in ["cpu_count", "cpu_used_pct", "mem_total_mib", "mem_used_mib"] {
        assert!(m[k].is_f64(), "{k} in {m}");
    }
    assert!(m["timestamp"].is_i64());
    assert!(m["mem_used_mib"].as_f64().unwrap() > 0.0, "the agent itself uses memory");

    let mut s = agent.connect();
    s.write_all(b"GET /metrics/watch HTTP/1.1\r\nHost: a\r\n\r\n").unwrap();
    let mut raw = Vec::new();
    let mut buf = [0u8; 4096];
    let start = Instant::now();
    while raw.windows(11).filter(|w| w == b"\"cpu_count\"").count() < 2 {
        let n = s.read(&mut buf).unwrap();
        assert!(n > 0 && start.elapsed() < Duration::from_secs(10));
        raw.extend_from_slice(&buf[..n]);
    }
    let text = String::from_utf8_lossy(&raw);
    assert!(text.contains("content-type: text/event-stream"), "{text}");
    assert!(text.contains("}\n\n"), "frames end with two newlines: {text}");
}

#[test]
fn limits_come_from_the_environment() {
    let agent =
        Agent::start_with(&[("EMBER_AGENT_MEMORY_LIMIT_BYTES", "536870912"), ("EMBER_AGENT_CPU_MILLIS", "1500")]);
    let m = agent.get("/metrics").json();
    assert_eq!((m["mem_total_mib"].as_f64(), m["cpu_count"].as_f64()), (Some(512.0), Some(1.5)));
}

#[test]
fn command_env_strips_control_vars_and_merges_execd_envs() {
    let dir = common::temp_dir("envs");
    let file = dir.join(".env");
    std::fs::write(&file, "# comment\nFROM_FILE=file\nOVERRIDDEN=file\nEXPANDED=$SANDBOX_VAR-x\n").unwrap();
    let agent = Agent::start_with(&[
        ("EMBER_AGENT_SECRET", "hidden"),
        ("SANDBOX_VAR", "visible"),
        ("EXECD_ENVS", file.to_str().unwrap()),
    ]);
    let ev = agent.run(r#"{"command":"env","envs":{"OVERRIDDEN":"request"}}"#);
    let out = texts(&ev, "stdout");
    assert!(out.contains(&"SANDBOX_VAR=visible"), "{out:?}");
    assert!(out.contains(&"FROM_FILE=file") && out.contains(&"OVERRIDDEN=request"), "{out:?}");
    assert!(out.contains(&"EXPANDED=visible-x"), "{out:?}");
    assert!(!out.iter().any(|l| l.starts_with("EMBER_AGENT_")), "{out:?}");
    // Re-read per command: an appended variable is seen at once.
    std::fs::write(&file, "LATER=1\n").unwrap();
    let ev = agent.run(r#"{"command":"echo $LATER"}"#);
    assert_eq!(texts(&ev, "stdout"), vec!["1"]);
}

#[test]
fn entrypoint_exit_ends_the_agent_with_its_code() {
    let mut agent = Agent::start_with(&[("EMBER_AGENT_ENTRYPOINT", r#"["sh","-c","echo booted; sleep 0.5; exit 7"]"#)]);
    assert_eq!(agent.get("/ping").status, 200);
    let st = agent.get("/command/status/entrypoint").json();
    assert_eq!(
        (st["running"].as_bool(), st["content"].as_str()),
        (Some(true), Some("sh -c echo booted; sleep 0.5; exit 7"))
    );
    let deadline = Instant::now() + Duration::from_secs(5);
    while agent.get("/command/entrypoint/logs").text() != "booted\n" {
        assert!(Instant::now() < deadline, "entrypoint output not logged");
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(agent.wait_exit(Duration::from_secs(10)), Some(7));
}

#[test]
fn missing_entrypoint_exits_127() {
    let mut agent = Agent::start_with(&[("EMBER_AGENT_ENTRYPOINT", r#"["/no/such/entrypoint"]"#)]);
    assert_eq!(agent.wait_exit(Duration::from_secs(10)), Some(127));
}

#[test]
fn sigterm_stops_running_commands_and_exits_zero() {
    let mut agent = Agent::start();
    let ev = agent.run(r#"{"command":"sleep 60","background":true}"#);
    assert_eq!(kinds(&ev), vec!["init", "execution_complete"]);
    let st = agent.get(&format!("/command/status/{}", ev[0]["text"].as_str().unwrap())).json();
    assert_eq!(st["running"], true);
    // Find the sleep: a child of the agent.
    let children = std::fs::read_to_string(format!("/proc/{0}/task/{0}/children", agent.pid())).unwrap();
    let sleep_pid: i32 = children.split_whitespace().next().expect("a child").parse().unwrap();
    let t = Instant::now();
    assert_eq!(agent.terminate(), Some(0));
    assert!(t.elapsed() < Duration::from_secs(3), "{:?}", t.elapsed());
    assert!(ember_sys::process::kill(sleep_pid, 0).is_err() || is_zombie(sleep_pid), "the command survived the agent");
}

fn is_zombie(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).map_or(true, |s| s.contains(") Z "))
}

/// One request over a unix socket, `Connection: close`.
fn unix_request(path: &std::path::Path, method: &str, target: &str, body: &str) -> common::Response {
    let mut s = std::os::unix::net::UnixStream::connect(path).expect("connect unix socket");
    let req = format!(
        "{method} {target} HTTP/1.1\r\nHost: a\r\nConnection: close\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).unwrap();
    common::parse_response(&raw)
}

fn wait_for_socket(path: &std::path::Path) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::os::unix::net::UnixStream::connect(path).is_err() {
        assert!(Instant::now() < deadline, "agent never listened on {}", path.display());
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn listens_on_a_unix_path() {
    let sock_dir = common::temp_dir("unix");
    let sock = sock_dir.join("agent.sock");
    let mut child = std::process::Command::new(common::BIN)
        .arg("--listen")
        .arg(format!("unix:{}", sock.display()))
        .spawn()
        .unwrap();
    wait_for_socket(&sock);
    let r = unix_request(&sock, "GET", "/ping", "");
    assert_eq!(r.status, 200);
    let _ = ember_sys::process::kill(child.id() as i32, ember_sys::process::SIGTERM);
    assert_eq!(child.wait().unwrap().code(), Some(0));
}

#[test]
fn serves_an_inherited_listening_fd_and_keeps_it_from_commands() {
    let sock_dir = common::temp_dir("fd");
    let sock = sock_dir.join("agent.sock");
    let listener = std::os::unix::net::UnixListener::bind(&sock).unwrap();
    // bash moves the listener from stdin to fd 3 (dup2 clears close-on-exec),
    // as the runtime hands it over, then becomes the agent.
    let mut child = std::process::Command::new("bash")
        .args(["-c", r#"exec 3<&0 0</dev/null; exec "$0""#, common::BIN])
        .env("EMBER_AGENT_LISTEN_FD", "3")
        .stdin(std::process::Stdio::from(std::os::fd::OwnedFd::from(listener)))
        .spawn()
        .unwrap();
    wait_for_socket(&sock);
    assert_eq!(unix_request(&sock, "GET", "/ping", "").status, 200);
    let r = unix_request(&sock, "POST", "/command", r#"{"command":"readlink /proc/$$/fd/3 || echo closed"}"#);
    let ev = common::events(&r.body);
    assert_eq!(texts(&ev, "stdout"), vec!["closed"], "commands must not inherit the listener");
    let _ = ember_sys::process::kill(child.id() as i32, ember_sys::process::SIGTERM);
    assert_eq!(child.wait().unwrap().code(), Some(0));
}

/// The agent as PID 1 of a new pid namespace (needs root and unshare).
fn start_pid1() -> Agent {
    require_root("the agent as PID 1 of a new pid namespace");
    let unshare = std::path::Path::new("/usr/bin/unshare");
    assert!(unshare.exists(), "{} is missing: install util-linux", unshare.display());
    let mut cmd = std::process::Command::new(unshare);
    cmd.args(["--pid", "--fork", "--mount-proc", common::BIN, "--listen", "tcp:127.0.0.1:0"]);
    Agent::spawn(cmd)
}

/// The host pid of the agent under unshare (unshare's only child).
fn pid1_host_pid(agent: &Agent) -> i32 {
    let children = std::fs::read_to_string(format!("/proc/{0}/task/{0}/children", agent.pid())).unwrap();
    children.split_whitespace().next().expect("unshare's child").parse().unwrap()
}

#[test]
fn as_pid1_runs_as_1000_reaps_orphans_and_stops_everyone() {
    let mut agent = start_pid1();
    assert_eq!(texts(&agent.run(r#"{"command":"echo $$; id -u"}"#), "stdout")[1], "1000");
    // The subshell exits at once, orphaning its sleep to PID 1: the agent.
    agent.run(r#"{"command":"(sleep 0.2 &); true"}"#);
    std::thread::sleep(Duration::from_millis(600));
    let zombies = agent.run(r#"{"command":"cat /proc/[0-9]*/stat | grep -c ') Z ' || true"}"#);
    assert_eq!(texts(&zombies, "stdout"), vec!["0"], "orphans must be reaped");
    // One process ignores SIGTERM (the ignore survives exec): it takes the
    // SIGKILL after the 2 s grace.
    agent.run(r#"{"command":"sleep 60","background":true}"#);
    let ev = agent.run(r#"{"command":"trap '' TERM; echo ready; exec sleep 60","background":true}"#);
    let logs = format!("/command/{}/logs", ev[0]["text"].as_str().unwrap());
    let deadline = Instant::now() + Duration::from_secs(5);
    while agent.get(&logs).text() != "ready\n" {
        assert!(Instant::now() < deadline, "the trap was never set");
        std::thread::sleep(Duration::from_millis(10));
    }
    let t = Instant::now();
    let _ = ember_sys::process::kill(pid1_host_pid(&agent), ember_sys::process::SIGTERM);
    assert_eq!(agent.wait_exit(Duration::from_secs(10)), Some(0));
    let took = t.elapsed();
    assert!(took >= Duration::from_millis(1900) && took < Duration::from_secs(5), "{took:?}");
}
