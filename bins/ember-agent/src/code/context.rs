//! One code context: a persistent `python3` process running `driver.py`, and
//! the execution of one cell in it, translated into execd stream events.
//!
//! Protocol with the driver: the agent writes `{"code": ...}` lines to its
//! stdin; the driver answers with JSON lines on its stdout (`ready` once, then
//! per cell `execution_count`, `stdout`/`stderr`/`result`*, `error`?, `done`);
//! raw output of child processes arrives on its stderr and is forwarded as
//! `stderr` events of the running cell.
use crate::commands::spawn;
use crate::error::{ApiError, ApiResult};
use crate::server::App;
use crate::stream::{error_event, event, frame};
use bytes::Bytes;
use ember_sys::process::{SIGINT, SIGKILL};
use ember_types::execd::RunCommandRequest;
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::net::unix::pipe;
use tokio::sync::mpsc;
use tokio::time::Instant;

const DRIVER: &str = include_str!("driver.py");
/// How long a new interpreter gets to import and say `ready`.
const START_TIMEOUT: Duration = Duration::from_secs(15);

struct Io {
    stdin: pipe::Sender,
    events: Lines<BufReader<pipe::Receiver>>,
    stderr: Lines<BufReader<pipe::Receiver>>,
}

pub struct Context {
    pub id: String,
    pub language: String,
    pid: i32,
    /// A tokio Mutex, held for a whole cell: one cell runs at a time per
    /// context, and the lock is held across the awaits of its execution.
    io: tokio::sync::Mutex<Option<Io>>,
}

impl Context {
    /// Starts the interpreter as the sandbox's default user and waits for it.
    pub async fn start(app: &App, id: String, language: String) -> ApiResult<Context> {
        let argv = ["python3", "-u", "-c", DRIVER].map(String::from).to_vec();
        let req = RunCommandRequest { argv: Some(argv), ..Default::default() };
        let plan = spawn::plan(&app.config, &req).map_err(ApiError::runtime)?;
        let started = spawn::spawn(&app.reaper, &plan, true)
            .map_err(|e| ApiError::runtime(format!("start python3 for a code context: {e}")))?;
        let pid = started.pid;
        let fail = |m: String| {
            app.reaper.signal_group(pid, SIGKILL);
            ApiError::runtime(m)
        };
        let spawn::Spawned { stdin: Some(stdin), stdout: out, stderr: err, .. } = started else {
            return Err(fail("the interpreter has no stdin pipe".into()));
        };
        let mut io = Io { stdin, events: BufReader::new(out).lines(), stderr: BufReader::new(err).lines() };
        let mut early = Vec::new();
        let ready = tokio::time::timeout(START_TIMEOUT, async {
            loop {
                tokio::select! {
                    l = io.events.next_line() => return matches!(l, Ok(Some(ref s)) if s.contains("\"ready\"")),
                    l = io.stderr.next_line() => match l {
                        Ok(Some(s)) => early.push(s),
                        _ => return false,
                    },
                }
            }
        })
        .await;
        if ready != Ok(true) {
            return Err(fail(format!("python3 did not start: {}", early.join("\n"))));
        }
        Ok(Context { id, language, pid, io: tokio::sync::Mutex::new(Some(io)) })
    }

    /// Interrupts the running cell (KeyboardInterrupt in it).
    pub fn interrupt(&self, app: &App) {
        app.reaper.signal_group(self.pid, SIGINT);
    }

    pub fn kill(&self, app: &App) {
        app.reaper.signal_group(self.pid, SIGKILL);
    }

    /// Runs one cell, sending its events to `tx`: `execution_count`, output,
    /// `result`, then `error` or `execution_complete`. A client that goes
    /// away interrupts the cell; the rest of its events are read and dropped
    /// so the next cell starts in step.
    pub async fn execute(&self, app: &App, code: String, tx: mpsc::Sender<Bytes>) {
        let started = Instant::now();
        let mut guard = self.io.lock().await;
        let Some(io) = guard.as_mut() else {
            let _ = tx.send(frame(&dead())).await;
            return;
        };
        let mut line = serde_json::json!({ "code": code }).to_string();
        line.push('\n');
        if io.stdin.write_all(line.as_bytes()).await.is_err() {
            *guard = None;
            let _ = tx.send(frame(&dead())).await;
            return;
        }
        let mut open = true;
        let mut failed = false;
        let mut died = false;
        let mut err_open = true;
        loop {
            let ev = tokio::select! {
                l = io.events.next_line() => match l {
                    Ok(Some(l)) => match translate(&l) {
                        Step::Event(e) => { failed |= e.kind == "error"; e }
                        Step::Done => break,
                        Step::Skip => continue,
                    },
                    _ => {
                        died = true;
                        failed = true;
                        dead()
                    }
                },
                l = io.stderr.next_line(), if err_open => match l {
                    Ok(Some(l)) => event("stderr", Some(format!("{l}\n"))),
                    _ => { err_open = false; continue }
                },
                _ = tx.closed(), if open => {
                    open = false;
                    self.interrupt(app);
                    continue;
                }
            };
            if open && tx.send(frame(&ev)).await.is_err() {
                open = false;
                self.interrupt(app);
            }
            if died {
                break;
            }
        }
        if died {
            *guard = None;
        }
        if !failed {
            let mut done = event("execution_complete", None);
            done.execution_time = Some(started.elapsed().as_millis() as i64);
            let _ = tx.send(frame(&done)).await;
        }
    }
}

fn dead() -> ember_types::execd::StreamEvent {
    let msg = "the interpreter of this context exited; create a new context".to_string();
    error_event("ContextDied", msg.clone(), vec![msg])
}

#[allow(clippy::large_enum_variant, reason = "one short-lived value per line the driver prints; boxing buys nothing")]
enum Step {
    Event(ember_types::execd::StreamEvent),
    Done,
    Skip,
}

/// One driver line → one execd event.
fn translate(line: &str) -> Step {
    let Ok(v) = serde_json::from_str::<serde_json::Value>(line) else {
        return Step::Skip;
    };
    let text = v["text"].as_str().map(str::to_string);
    match v["type"].as_str().unwrap_or("") {
        "done" => Step::Done,
        "stdout" | "stderr" => Step::Event(event(v["type"].as_str().unwrap_or("stdout"), text)),
        "execution_count" => {
            let mut e = event("execution_count", None);
            e.execution_count = v["execution_count"].as_i64();
            Step::Event(e)
        }
        "result" => {
            let mut e = event("result", None);
            e.results = v["results"].as_object().cloned();
            Step::Event(e)
        }
        "error" => {
            let s = |k: &str| v[k].as_str().unwrap_or("").to_string();
            let tb = v["traceback"].as_array().into_iter().flatten().filter_map(|t| t.as_str().map(String::from));
            Step::Event(error_event(&s("ename"), s("evalue"), tb.collect()))
        }
        _ => Step::Skip,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn driver_lines_become_events() {
        let Step::Event(e) = translate(r#"{"type":"result","results":{"text":"2"}}"#) else { panic!() };
        assert_eq!(e.results.unwrap()["text"], "2");
        let Step::Event(e) =
            translate(r#"{"type":"error","ename":"ZeroDivisionError","evalue":"x","traceback":["a"]}"#)
        else {
            panic!()
        };
        assert_eq!(e.error.unwrap().ename, "ZeroDivisionError");
        assert!(matches!(translate(r#"{"type":"done"}"#), Step::Done));
        assert!(matches!(translate("not json"), Step::Skip));
    }
}
