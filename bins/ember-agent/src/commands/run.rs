//! Watching a running command: its output lines, its exit, its timeout, the
//! keep-alive pings and the client going away; then its final event.
use super::lines::{event_text, Line, LineSplitter};
use super::registry::Registry;
use super::spawn::Spawned;
use crate::reaper::Reaper;
use crate::stream::{error_event, event, frame};
use bytes::Bytes;
use ember_sys::process::{ExitKind, SIGKILL};
use std::future::pending;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::AsyncReadExt;
use tokio::net::unix::pipe;
use tokio::sync::mpsc;
use tokio::time::{sleep_until, Instant};

/// execd's keep-alive period while a command runs.
const PING_EVERY: Duration = Duration::from_secs(3);
/// After the command exits, how long its pipes may stay idle before we stop
/// waiting for EOF. Only a descendant that kept them open (`sleep 100 &`)
/// makes us wait this long.
pub const DRAIN: Duration = Duration::from_millis(100);
/// The most output read after the exit, however busy the pipes stay.
const DRAIN_CAP: Duration = Duration::from_secs(5);

/// A deadline that nothing reaches.
fn far() -> Instant {
    Instant::now() + Duration::from_secs(100 * 365 * 86_400)
}

/// When to stop reading output after the exit: once the pipes were idle
/// for the drain period, or at the cap.
struct Drain {
    idle: Option<Duration>,
    idle_until: Instant,
    cap: Instant,
}

impl Drain {
    fn inactive() -> Drain {
        Drain { idle: None, idle_until: far(), cap: far() }
    }

    /// `None`: read to EOF, however long it takes.
    fn start(idle: Option<Duration>) -> Drain {
        let now = Instant::now();
        match idle {
            Some(d) => Drain { idle, idle_until: now + d, cap: now + DRAIN_CAP },
            None => Drain::inactive(),
        }
    }

    fn active(&self) -> bool {
        self.idle.is_some()
    }

    fn on_data(&mut self) {
        if let Some(d) = self.idle {
            self.idle_until = Instant::now() + d;
        }
    }

    fn deadline(&self) -> Instant {
        self.idle_until.min(self.cap)
    }
}

/// One command being watched.
pub struct Run {
    pub registry: Arc<Registry>,
    pub reaper: Arc<Reaper>,
    pub id: String,
    pub started: Instant,
    pub timeout: Option<Duration>,
    /// `None`: read the output to EOF even after the exit (background
    /// commands, whose logs should be complete and that nobody waits for).
    pub drain: Option<Duration>,
    /// Pause between the final event and the end of the stream.
    pub grace: Duration,
}

/// Where events go: the client's stream, or nowhere (background). A
/// foreground command whose client went away is killed.
struct Sink {
    tx: Option<mpsc::Sender<Bytes>>,
}

impl Sink {
    async fn send(&mut self, bytes: Bytes) -> bool {
        if let Some(tx) = &self.tx {
            if tx.send(bytes).await.is_err() {
                self.tx = None;
                return false;
            }
        }
        true
    }

    async fn closed(&self) {
        match &self.tx {
            Some(tx) => tx.closed().await,
            None => pending().await,
        }
    }
}

/// One output pipe and its line splitter.
struct Pipe {
    rx: Option<pipe::Receiver>,
    split: LineSplitter,
    buf: Vec<u8>,
}

impl Pipe {
    fn new(rx: pipe::Receiver) -> Pipe {
        Pipe { rx: Some(rx), split: LineSplitter::default(), buf: vec![0; 16 * 1024] }
    }

    async fn read(&mut self) -> std::io::Result<usize> {
        match &mut self.rx {
            Some(rx) => rx.read(&mut self.buf).await,
            None => pending().await,
        }
    }

    /// Feeds a read result to the splitter; EOF or an error closes the pipe.
    /// Returns whether bytes arrived.
    fn take(&mut self, r: std::io::Result<usize>, lines: &mut Vec<Line>) -> bool {
        match r {
            Ok(n) if n > 0 => {
                self.split.push(&self.buf[..n], lines);
                true
            }
            _ => {
                self.close(lines);
                false
            }
        }
    }

    fn close(&mut self, lines: &mut Vec<Line>) {
        self.rx = None;
        self.split.finish(lines);
    }

    fn open(&self) -> bool {
        self.rx.is_some()
    }
}

impl Run {
    /// Watches the command to its end, streaming to `tx` if given, and
    /// returns how it ended.
    pub async fn watch(self, spawned: Spawned, tx: Option<mpsc::Sender<Bytes>>) -> ExitKind {
        let mut sink = Sink { tx };
        let exit = self.pump(spawned, &mut sink).await;
        self.finish(exit, &mut sink).await;
        exit
    }

    async fn pump(&self, sp: Spawned, sink: &mut Sink) -> ExitKind {
        let Spawned { pid, stdout, stderr, exit: mut exit_rx, .. } = sp;
        let (mut out, mut err) = (Pipe::new(stdout), Pipe::new(stderr));
        // A foreground command is killed once when its client goes away.
        let mut abandon = sink.tx.is_some();
        let mut exit = None;
        let mut kill_at = self.timeout.map(|t| self.started + t);
        let mut drain = Drain::inactive();
        let mut ping = tokio::time::interval_at(Instant::now() + PING_EVERY, PING_EVERY);
        let mut lines = Vec::new();
        while exit.is_none() || out.open() || err.open() {
            let mut kind = "stdout";
            let mut data = false;
            // Biased, rare events first so a flood of output cannot starve
            // the timeout or the exit; stdout before stderr for stable order;
            // the drain deadline last so pending output wins over it.
            tokio::select! {
                biased;
                e = &mut exit_rx, if exit.is_none() => {
                    // The reaper never drops a sender of a live child.
                    exit = Some(e.unwrap_or(ExitKind::Exited(255)));
                    drain = Drain::start(self.drain);
                }
                _ = sleep_until(kill_at.unwrap_or_else(far)), if kill_at.is_some() && exit.is_none() => {
                    kill_at = None;
                    self.reaper.signal_group(pid, SIGKILL);
                }
                _ = sink.closed(), if sink.tx.is_some() => sink.tx = None,
                _ = ping.tick(), if sink.tx.is_some() => {
                    sink.send(frame(&event("ping", Some("pong".into())))).await;
                }
                r = out.read(), if out.open() => data = out.take(r, &mut lines),
                r = err.read(), if err.open() => { kind = "stderr"; data = err.take(r, &mut lines) }
                _ = sleep_until(drain.deadline()), if drain.active() => break,
            }
            if data {
                drain.on_data();
            }
            self.emit(kind, &mut lines, sink).await;
            if abandon && sink.tx.is_none() && exit.is_none() {
                abandon = false;
                self.reaper.signal_group(pid, SIGKILL);
            }
        }
        out.close(&mut lines);
        self.emit("stdout", &mut lines, sink).await;
        err.close(&mut lines);
        self.emit("stderr", &mut lines, sink).await;
        exit.unwrap_or(ExitKind::Exited(255))
    }

    async fn emit(&self, kind: &str, lines: &mut Vec<Line>, sink: &mut Sink) {
        for line in lines.drain(..) {
            self.registry.append(&self.id, &line.text);
            let mut e = event(kind, Some(event_text(&line.text)));
            if let Some(raw) = &line.raw {
                e.set_raw(raw);
            }
            sink.send(frame(&e)).await;
        }
    }

    /// Records the exit and sends the final event: `execution_complete` on
    /// success, else `error` with the exit code as `evalue`.
    async fn finish(&self, exit: ExitKind, sink: &mut Sink) {
        let code = exit.code();
        let message = describe(exit);
        self.registry.finish(&self.id, code, message.clone());
        let last = match message {
            None => {
                let mut e = event("execution_complete", None);
                e.execution_time = Some(self.started.elapsed().as_millis() as i64);
                e
            }
            Some(m) => error_event("CommandExecError", code.to_string(), vec![m]),
        };
        if sink.send(frame(&last)).await && !self.grace.is_zero() {
            tokio::time::sleep(self.grace).await;
        }
    }
}

/// The error text of an exit, as Go's `exec.ExitError` prints it; `None`
/// for success.
pub fn describe(exit: ExitKind) -> Option<String> {
    match exit {
        ExitKind::Exited(0) => None,
        ExitKind::Exited(n) => Some(format!("exit status {n}")),
        ExitKind::Signaled(s) => Some(format!("signal: {}", signal_name(s))),
    }
}

fn signal_name(sig: i32) -> String {
    let name = match sig {
        1 => "hangup",
        2 => "interrupt",
        3 => "quit",
        4 => "illegal instruction",
        6 => "aborted",
        7 => "bus error",
        8 => "floating point exception",
        9 => "killed",
        11 => "segmentation fault",
        13 => "broken pipe",
        14 => "alarm clock",
        15 => "terminated",
        _ => return format!("signal {sig}"),
    };
    name.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exits_are_described_like_go() {
        assert_eq!(describe(ExitKind::Exited(0)), None);
        assert_eq!(describe(ExitKind::Exited(3)).as_deref(), Some("exit status 3"));
        assert_eq!(describe(ExitKind::Signaled(9)).as_deref(), Some("signal: killed"));
        assert_eq!(describe(ExitKind::Signaled(40)).as_deref(), Some("signal: signal 40"));
    }
}
