//! `/pty` against the built agent with a real WebSocket client: a real
//! terminal, replay from an offset, one client at a time with takeover,
//! resize, signals, pipe mode, exit frames, status and delete.
mod common;

use common::Agent;
use futures_util::{SinkExt, StreamExt};
use serde_json::Value;
use std::time::Duration;
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::{Error as WsError, Message};
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

type Ws = WebSocketStream<MaybeTlsStream<TcpStream>>;

/// A guard against a hang, not a performance threshold.
const HANG: Duration = Duration::from_secs(30);

/// What the server sent, decoded.
#[derive(Debug)]
enum Frame {
    Stdout(Vec<u8>),
    Stderr(Vec<u8>),
    Replay(u64, Vec<u8>),
    Json(Value),
    Close(Option<u16>),
}

async fn connect(agent: &Agent, id: &str, query: &str) -> Result<Ws, WsError> {
    let url = format!("ws://127.0.0.1:{}/pty/{id}/ws{query}", agent.port);
    tokio::time::timeout(HANG, tokio_tungstenite::connect_async(url)).await.expect("connect hung").map(|(ws, _)| ws)
}

async fn next(ws: &mut Ws) -> Frame {
    loop {
        let m = tokio::time::timeout(HANG, ws.next()).await.expect("no frame in time");
        match m {
            Some(Ok(Message::Binary(b))) => {
                return match b[0] {
                    1 => Frame::Stdout(b[1..].to_vec()),
                    2 => Frame::Stderr(b[1..].to_vec()),
                    3 => Frame::Replay(u64::from_be_bytes(b[1..9].try_into().unwrap()), b[9..].to_vec()),
                    t => panic!("unknown frame type {t}"),
                }
            }
            Some(Ok(Message::Text(t))) => return Frame::Json(serde_json::from_str(t.as_str()).unwrap()),
            Some(Ok(Message::Close(c))) => return Frame::Close(c.map(|c| u16::from(c.code))),
            Some(Ok(_)) => continue,
            None | Some(Err(_)) => return Frame::Close(None),
        }
    }
}

/// Reads stdout frames until their text contains `needle`; returns the text.
async fn until(ws: &mut Ws, needle: &str) -> String {
    let mut seen = String::new();
    while !seen.contains(needle) {
        match next(ws).await {
            Frame::Stdout(b) | Frame::Stderr(b) => seen.push_str(&String::from_utf8_lossy(&b)),
            Frame::Json(v) if v["type"] == "connected" => {}
            other => panic!("waiting for {needle:?} after {seen:?}: {other:?}"),
        }
    }
    seen
}

/// Reads until the exit frame and the close that follows it.
async fn exit_code(ws: &mut Ws) -> i64 {
    loop {
        match next(ws).await {
            Frame::Json(v) if v["type"] == "exit" => {
                assert!(matches!(next(ws).await, Frame::Close(Some(1000))));
                return v["exit_code"].as_i64().expect("exit_code");
            }
            Frame::Close(c) => panic!("closed ({c:?}) before the exit frame"),
            _ => {}
        }
    }
}

async fn stdin(ws: &mut Ws, text: &str) {
    let mut b = vec![0u8];
    b.extend_from_slice(text.as_bytes());
    ws.send(Message::Binary(b.into())).await.unwrap();
}

async fn control(ws: &mut Ws, v: Value) {
    ws.send(Message::Text(v.to_string().into())).await.unwrap();
}

fn create(agent: &Agent, body: &str) -> String {
    let r = agent.post_json("/pty", body);
    assert_eq!(r.status, 201, "{}", r.text());
    r.json()["session_id"].as_str().unwrap().to_string()
}

#[tokio::test(flavor = "current_thread")]
async fn terminal_replay_takeover_and_exit() {
    let agent = Agent::start();
    let dir = std::env::temp_dir().join(format!("ember-pty-test-{}", std::process::id()));
    let id = create(&agent, &format!(r#"{{"cwd":"{}"}}"#, dir.display()));
    assert!(dir.is_dir(), "the cwd is created");
    let st = agent.get(&format!("/pty/{id}")).json();
    assert_eq!((st["running"].as_bool(), st["launch_attempted"].as_bool()), (Some(false), Some(false)));

    let mut ws = connect(&agent, &id, "").await.unwrap();
    match next(&mut ws).await {
        Frame::Json(v) => assert_eq!((v["type"].as_str(), v["mode"].as_str()), (Some("connected"), Some("pty"))),
        other => panic!("expected the connected frame first, got {other:?}"),
    }
    stdin(&mut ws, "echo marker-$((6*7)); pwd; tty\n").await;
    let out = until(&mut ws, "/dev/pts/").await;
    assert!(out.contains("marker-42") && out.contains(&dir.display().to_string()), "{out:?}");
    control(&mut ws, serde_json::json!({"type": "resize", "cols": 132, "rows": 43})).await;
    stdin(&mut ws, "stty size\n").await;
    until(&mut ws, "43 132").await;
    control(&mut ws, serde_json::json!({"type": "ping"})).await;
    loop {
        if let Frame::Json(v) = next(&mut ws).await {
            assert_eq!(v["type"], "pong");
            break;
        }
    }

    // A second client is refused before the upgrade while one is attached.
    match connect(&agent, &id, "").await {
        Err(WsError::Http(r)) => {
            assert_eq!(r.status().as_u16(), 409);
            let body: Value = serde_json::from_slice(r.body().as_deref().unwrap_or_default()).unwrap();
            assert_eq!(body["code"], "ALREADY_CONNECTED");
        }
        other => panic!("expected a 409, got {:?}", other.map(|_| ())),
    }
    // A takeover evicts the first client with 4001 and replays from `since`.
    let mut second = connect(&agent, &id, "?since=0&takeover=1").await.unwrap();
    loop {
        match next(&mut ws).await {
            Frame::Close(c) => {
                assert_eq!(c, Some(4001));
                break;
            }
            Frame::Stdout(_) => {}
            other => panic!("first client: {other:?}"),
        }
    }
    match next(&mut second).await {
        Frame::Replay(0, bytes) => assert!(String::from_utf8_lossy(&bytes).contains("marker-42")),
        other => panic!("expected a replay from offset 0, got {other:?}"),
    }
    let offset = agent.get(&format!("/pty/{id}")).json()["output_offset"].as_u64().unwrap();
    assert!(offset > 0);
    stdin(&mut second, "exit 3\n").await;
    assert_eq!(exit_code(&mut second).await, 3);
    let st = agent.get(&format!("/pty/{id}")).json();
    assert_eq!((st["running"].as_bool(), st["launch_attempted"].as_bool()), (Some(false), Some(true)));

    // Replay from a later offset returns only what came after it.
    let mut third = connect(&agent, &id, &format!("?since={offset}")).await.unwrap();
    if let Frame::Replay(at, _) = next(&mut third).await {
        assert_eq!(at, offset);
    }
    drop(third);
    assert_eq!(agent.delete(&format!("/pty/{id}")).status, 200);
    let gone = agent.get(&format!("/pty/{id}"));
    assert_eq!((gone.status, gone.json()["code"].as_str()), (404, Some("CONTEXT_NOT_FOUND")));
    let _ = std::fs::remove_dir(&dir);
}

#[tokio::test(flavor = "current_thread")]
async fn pipe_mode_keeps_stdout_and_stderr_apart() {
    let agent = Agent::start();
    let id = create(&agent, r#"{"command":"echo out; echo err >&2; read x; echo got-$x; exit 7"}"#);
    let mut ws = connect(&agent, &id, "?pty=0").await.unwrap();
    let (mut out, mut err) = (String::new(), String::new());
    let mut sent = false;
    let code = loop {
        match next(&mut ws).await {
            Frame::Json(v) if v["type"] == "connected" => assert_eq!(v["mode"], "pipe"),
            Frame::Json(v) if v["type"] == "exit" => break v["exit_code"].as_i64().unwrap(),
            Frame::Stdout(b) | Frame::Replay(_, b) => out.push_str(&String::from_utf8_lossy(&b)),
            Frame::Stderr(b) => err.push_str(&String::from_utf8_lossy(&b)),
            other => panic!("{other:?}"),
        }
        if out.contains("out\n") && !sent {
            control(&mut ws, serde_json::json!({"type": "stdin", "data": "abc\n"})).await;
            sent = true;
        }
    };
    assert_eq!(code, 7);
    assert!(out.contains("got-abc"), "{out:?}");
    assert_eq!(err, "err\n");
    assert!(!out.contains("err"), "stderr stays out of stdout in pipe mode: {out:?}");
}

#[tokio::test(flavor = "current_thread")]
async fn a_signal_reaches_the_process_group_and_errors_are_framed() {
    let agent = Agent::start();
    let id = create(&agent, r#"{"command":"echo started; sleep 600"}"#);
    let mut ws = connect(&agent, &id, "").await.unwrap();
    until(&mut ws, "started").await;
    control(&mut ws, serde_json::json!({"type": "bogus"})).await;
    loop {
        if let Frame::Json(v) = next(&mut ws).await {
            assert_eq!((v["type"].as_str(), v["code"].as_str()), (Some("error"), Some("INVALID_FRAME")));
            break;
        }
    }
    control(&mut ws, serde_json::json!({"type": "signal", "signal": "SIGTERM"})).await;
    assert_eq!(exit_code(&mut ws).await, 128 + 15);
    assert_eq!(agent.delete("/pty/nope").status, 404);
    let r = agent.get("/pty/nope/ws");
    assert_eq!(r.status, 404);
}
