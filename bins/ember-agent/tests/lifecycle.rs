//! Agent-level behaviour: health, unknown routes, metrics, the environment
//! commands see, the entrypoint and shutdown.
mod common;

use common::{kinds, texts, Agent};
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
    let mut agent = Agent::start_with(&[("EMBER_AGENT_ENTRYPOINT", r#"["sh","-c","sleep 0.3; exit 7"]"#)]);
    assert_eq!(agent.get("/ping").status, 200);
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
