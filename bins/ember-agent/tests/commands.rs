//! `/command` over raw HTTP: stream framing and order, exit codes, argv,
//! start failures, timeouts, background runs, status, logs and interrupts.
mod common;

use common::{events, kinds, require_root, texts, Agent};
use std::io::{Read, Write};
use std::time::{Duration, Instant};

#[test]
fn foreground_success_streams_init_output_complete() {
    let agent = Agent::start();
    let ev = agent.run(r#"{"command":"echo hello; echo oops >&2; printf 'a\n\nb'"}"#);
    let k = kinds(&ev);
    assert_eq!(k.first(), Some(&"init"));
    assert_eq!(k.last(), Some(&"execution_complete"));
    assert!(!k.contains(&"error"));
    assert_eq!(texts(&ev, "stdout"), vec!["hello", "a", "\n", "b"]);
    assert_eq!(texts(&ev, "stderr"), vec!["oops"]);
    let id = ev[0]["text"].as_str().unwrap();
    assert_eq!(id.len(), 16);
    assert!(ev.last().unwrap()["execution_time"].is_i64());
    let st = agent.wait_finished(id);
    assert_eq!((st["running"].as_bool(), st["exit_code"].as_i64()), (Some(false), Some(0)));
    assert!(st["finished_at"].is_string() && st.get("error").is_none());
}

#[test]
fn exact_bytes_of_a_frame() {
    let agent = Agent::start();
    let r = agent.post_json("/command", r#"{"command":"echo hi"}"#);
    let body = r.text();
    let frames: Vec<&str> = body.split_inclusive("\n\n").collect();
    assert_eq!(frames.len(), 3, "{body:?}");
    assert!(frames[1].starts_with(r#"{"type":"stdout","text":"hi","timestamp":"#), "{body:?}");
    assert!(frames[1].ends_with("}\n\n"));
}

#[test]
fn nonzero_exit_is_an_error_event_without_complete() {
    let agent = Agent::start();
    let ev = agent.run(r#"{"command":"echo before; exit 3"}"#);
    assert_eq!(kinds(&ev), vec!["init", "stdout", "error"]);
    let err = &ev[2]["error"];
    assert_eq!(err["ename"], "CommandExecError");
    assert_eq!(err["evalue"], "3");
    assert_eq!(err["traceback"][0], "exit status 3");
    let st = agent.wait_finished(ev[0]["text"].as_str().unwrap());
    assert_eq!(st["exit_code"], 3);
    assert_eq!(st["error"], "exit status 3");
}

#[test]
fn argv_with_cwd_and_envs() {
    let agent = Agent::start();
    let dir = common::temp_dir("argv");
    let body = serde_json::json!({
        "argv": ["sh", "-c", "pwd; echo \"$X|$1\"", "zero", "arg one"],
        "cwd": &*dir, "envs": {"X": "y z"},
    });
    let ev = agent.run(&body.to_string());
    assert_eq!(texts(&ev, "stdout"), vec![dir.to_str().unwrap(), "y z|arg one"]);
    assert_eq!(kinds(&ev).last(), Some(&"execution_complete"));
    // argv needs no shell: the program is exec'd directly, spaces intact.
    let ev = agent.run(r#"{"argv":["/bin/echo","a  b"]}"#);
    assert_eq!(texts(&ev, "stdout"), vec!["a  b"]);
}

#[test]
fn start_failures_are_init_then_error() {
    let agent = Agent::start();
    for body in [r#"{"argv":["/no/such/program"]}"#, r#"{"command":"true","cwd":"/no/such/dir"}"#] {
        let ev = agent.run(body);
        assert_eq!(kinds(&ev), vec!["init", "error"], "{body}");
        let evalue = ev[1]["error"]["evalue"].as_str().unwrap();
        assert!(evalue.to_lowercase().contains("no such"), "{evalue}");
    }
}

#[test]
fn timeout_kills_the_process_group() {
    let agent = Agent::start();
    let t = Instant::now();
    // The child `sleep` is in the same group and must die too, or the
    // stream would wait for its pipe.
    let ev = agent.run(r#"{"command":"sleep 30 & sleep 30; echo never","timeout":300}"#);
    assert!(t.elapsed() < Duration::from_secs(5), "took {:?}", t.elapsed());
    assert_eq!(kinds(&ev), vec!["init", "error"]);
    assert_eq!(ev[1]["error"]["evalue"], "137");
    assert_eq!(ev[1]["error"]["traceback"][0], "signal: killed");
}

#[test]
fn background_status_and_logs_with_cursor() {
    let agent = Agent::start();
    let ev = agent.run(r#"{"command":"echo one; sleep 0.1; echo two >&2; sleep 0.2; echo three","background":true}"#);
    assert_eq!(kinds(&ev), vec!["init", "execution_complete"]);
    let id = ev[0]["text"].as_str().unwrap().to_string();
    let st = agent.get(&format!("/command/status/{id}")).json();
    assert_eq!(st["running"], true);
    assert!(st["exit_code"].is_null() && st.as_object().unwrap().contains_key("exit_code"));
    assert!(st["finished_at"].is_null());
    assert_eq!(st["content"], "echo one; sleep 0.1; echo two >&2; sleep 0.2; echo three");
    let st = agent.wait_finished(&id);
    assert_eq!(st["exit_code"], 0);
    let r = agent.get(&format!("/command/{id}/logs"));
    assert_eq!(r.status, 200);
    assert!(r.header("content-type").unwrap().starts_with("text/plain"));
    assert_eq!(r.header("EXECD-COMMANDS-TAIL-CURSOR"), Some("3"));
    assert_eq!(r.text(), "one\ntwo\nthree\n");
    let r = agent.get(&format!("/command/{id}/logs?cursor=2"));
    assert_eq!((r.text().as_str(), r.header("execd-commands-tail-cursor")), ("three\n", Some("3")));
    let r = agent.get(&format!("/command/{id}/logs?cursor=3"));
    assert_eq!(r.text(), "");
    agent.get(&format!("/command/{id}/logs?cursor=x")).assert_error(400, "INVALID_REQUEST_BODY");
}

#[test]
fn interrupt_kills_a_background_command() {
    let agent = Agent::start();
    let ev = agent.run(r#"{"command":"sleep 30","background":true}"#);
    let id = ev[0]["text"].as_str().unwrap();
    assert_eq!(agent.delete(&format!("/command?id={id}")).status, 200);
    let st = agent.wait_finished(id);
    assert_eq!((st["running"].as_bool(), st["exit_code"].as_i64()), (Some(false), Some(137)));
    assert_eq!(agent.delete(&format!("/command?id={id}")).status, 200, "finished: still fine");
    agent.delete("/command?id=nope").assert_error(404, "INVALID_REQUEST_BODY");
    agent.delete("/command").assert_error(400, "MISSING_QUERY");
    agent.get("/command/status/nope").assert_error(404, "INVALID_REQUEST_BODY");
    agent.get("/command/nope/logs").assert_error(404, "INVALID_REQUEST_BODY");
}

#[test]
fn interrupt_ends_a_foreground_stream() {
    let agent = Agent::start();
    let mut s = agent.connect();
    let body = r#"{"command":"echo started; sleep 30"}"#;
    let req = format!(
        "POST /command HTTP/1.1\r\nHost: a\r\nConnection: close\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).unwrap();
    // Read until the init frame arrives, to learn the id.
    let mut raw = Vec::new();
    let mut buf = [0u8; 4096];
    while !String::from_utf8_lossy(&raw).contains("started") {
        let n = s.read(&mut buf).unwrap();
        assert!(n > 0, "stream ended early");
        raw.extend_from_slice(&buf[..n]);
    }
    let text = String::from_utf8_lossy(&raw).into_owned();
    let id = text.split(r#""type":"init","text":""#).nth(1).unwrap().split('"').next().unwrap().to_string();
    assert_eq!(agent.delete(&format!("/command?id={id}")).status, 200);
    s.read_to_end(&mut raw).unwrap();
    let resp = common::parse_response(&raw);
    let ev = events(&resp.body);
    assert_eq!(kinds(&ev), vec!["init", "stdout", "error"]);
    assert_eq!(ev[2]["error"]["evalue"], "137");
}

#[test]
fn client_disconnect_kills_a_foreground_command() {
    let agent = Agent::start();
    let marker_dir = common::temp_dir("disconnect");
    let marker = marker_dir.join("alive");
    let body = serde_json::json!({"command": format!("echo go; sleep 2; touch {}", marker.display())}).to_string();
    {
        let mut s = agent.connect();
        let req = format!("POST /command HTTP/1.1\r\nHost: a\r\nContent-Length: {}\r\n\r\n{body}", body.len());
        s.write_all(req.as_bytes()).unwrap();
        let mut buf = [0u8; 4096];
        let n = s.read(&mut buf).unwrap();
        assert!(n > 0);
    } // dropped: the client is gone
    std::thread::sleep(Duration::from_millis(2500));
    assert!(!marker.exists(), "the command outlived its client");
}

#[test]
fn long_lines_are_split_and_pings_keep_the_stream_alive() {
    let agent = Agent::start();
    let ev = agent.run(r#"{"command":"head -c 70000 /dev/zero | tr '\\0' x; echo; sleep 3.3"}"#);
    let out = texts(&ev, "stdout");
    assert_eq!(out.iter().map(|t| t.len()).collect::<Vec<_>>(), vec![65536, 70000 - 65536]);
    assert!(kinds(&ev).contains(&"ping"), "{:?}", kinds(&ev));
    assert_eq!(texts(&ev, "ping"), vec!["pong"]);
}

#[test]
fn bad_requests_are_json_400s() {
    let agent = Agent::start();
    for body in [
        "{not json",
        r#"{"command":"true","argv":["true"]}"#,
        r#"{}"#,
        r#"{"argv":[]}"#,
        r#"{"command":"true","gid":5}"#,
        r#"{"command":"true","timeout":-1}"#,
    ] {
        agent.post_json("/command", body).assert_error(400, "INVALID_REQUEST_BODY");
    }
}

#[test]
fn uid_and_gid_switching() {
    require_root("switching a command's uid and gid");
    let agent = Agent::start();
    let ev = agent.run(r#"{"command":"id -u; id -g; echo $HOME","uid":65534,"gid":65534}"#);
    let out = texts(&ev, "stdout");
    assert_eq!(&out[..2], &["65534", "65534"]);
    let ev = agent.run(r#"{"command":"id -u; id -g","uid":65534,"gid":12345}"#);
    assert_eq!(texts(&ev, "stdout"), vec!["65534", "12345"]);
    // The user cannot enter a directory only root may read.
    let dir = common::temp_dir("private");
    std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o700)).unwrap();
    let body = serde_json::json!({"command": "pwd", "uid": 65534, "cwd": &*dir}).to_string();
    assert_eq!(kinds(&agent.run(&body)), vec!["init", "error"]);
}

#[test]
fn exec_round_trip_latency() {
    let agent = Agent::start();
    agent.run(r#"{"argv":["true"]}"#);
    let n = 50;
    let t = Instant::now();
    for _ in 0..n {
        assert_eq!(kinds(&agent.run(r#"{"argv":["true"]}"#)), vec!["init", "execution_complete"]);
    }
    let per = t.elapsed() / n;
    eprintln!("exec round trip of `true`: {per:?}");
    // Generous bound for debug builds on a loaded CI machine.
    assert!(per < Duration::from_millis(100), "{per:?}");
}

#[test]
fn timeout_wins_over_a_flood_of_output() {
    let agent = Agent::start();
    let t = Instant::now();
    let r = agent.post_json("/command", r#"{"command":"yes","timeout":500}"#);
    assert!(t.elapsed() < Duration::from_secs(10), "took {:?}", t.elapsed());
    let ev = events(&r.body);
    assert_eq!(kinds(&ev).last(), Some(&"error"));
    assert_eq!(ev.last().unwrap()["error"]["evalue"], "137");
    assert!(texts(&ev, "stdout").len() > 100);
}

#[test]
fn a_descendant_holding_stdout_does_not_hold_the_stream() {
    let agent = Agent::start();
    let t = Instant::now();
    let ev = agent.run(r#"{"command":"sleep 30 & echo done"}"#);
    assert!(t.elapsed() < Duration::from_secs(2), "took {:?}", t.elapsed());
    assert_eq!(kinds(&ev), vec!["init", "stdout", "execution_complete"]);
}

#[test]
fn closing_stdout_does_not_end_the_command() {
    let agent = Agent::start();
    let ev = agent.run(r#"{"command":"echo a; exec 1>&-; sleep 0.3; echo b >&2"}"#);
    assert_eq!(kinds(&ev), vec!["init", "stdout", "stderr", "execution_complete"]);
    assert_eq!((texts(&ev, "stdout"), texts(&ev, "stderr")), (vec!["a"], vec!["b"]));
}
