//! One PTY session: its shell process (started by the first WebSocket client,
//! and again by the next one after it exits, as execd does), the output ring
//! every client replays from, and the one-client-at-a-time attachment.
use super::ring::{Ring, Stream, CAPACITY};
use crate::commands::spawn::{self, Plan};
use crate::server::App;
use ember_sys::process::{self as sys, ExitKind};
use parking_lot::{Mutex, MutexGuard};
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::unix::pipe;
use tokio::sync::{oneshot, watch, Notify};

/// After the shell exits, output still buffered in the terminal or pipes is
/// read until it has been quiet this long (or hits EOF): a background job that
/// keeps the terminal open must not hold the exit frame back forever.
const DRAIN_IDLE: Duration = Duration::from_millis(100);

pub struct PtySession {
    pub id: String,
    cwd: Option<String>,
    command: Option<String>,
    /// A std Mutex: short sections, never held across an await.
    state: Mutex<State>,
    /// Bumped on every output chunk and on exit: wakes the attached client.
    changed: watch::Sender<u64>,
    /// The attached client: its generation and its eviction signal.
    holder: Mutex<Option<(u64, Arc<Notify>)>>,
    gens: AtomicU64,
}

struct State {
    ring: Ring,
    launch_attempted: bool,
    launch_failed: bool,
    closing: bool,
    /// The current or last process.
    run: Option<Run>,
    runs: u64,
}

struct Run {
    seq: u64,
    pid: i32,
    /// The terminal (a dup of the master), for resizes; `None` in pipe mode.
    term: Option<Arc<OwnedFd>>,
    /// `None` once a pipe-mode client sent end of input.
    stdin: Arc<tokio::sync::Mutex<Option<pipe::Sender>>>,
    /// Set once the process has exited and its output is drained.
    exit: Option<i32>,
}

/// What `GET /pty/{id}` reports.
pub struct Status {
    pub running: bool,
    pub output_offset: u64,
    pub launch_attempted: bool,
    pub launch_failed: bool,
}

/// A client's hold on the session; dropping it frees the session for the next.
pub struct Attachment {
    pub session: Arc<PtySession>,
    gen: u64,
    pub evicted: Arc<Notify>,
}

impl Drop for Attachment {
    fn drop(&mut self) {
        let mut h = self.session.holder();
        if h.as_ref().is_some_and(|(g, _)| *g == self.gen) {
            *h = None;
        }
    }
}

/// The output from an offset on, and the exit code once the run has ended.
pub struct Poll {
    pub chunks: Vec<(Stream, bytes::Bytes)>,
    pub from: u64,
    pub next: u64,
    pub exit: Option<i32>,
}

impl PtySession {
    pub fn new(id: String, cwd: Option<String>, command: Option<String>) -> PtySession {
        let state = State {
            ring: Ring::new(CAPACITY),
            launch_attempted: false,
            launch_failed: false,
            closing: false,
            run: None,
            runs: 0,
        };
        PtySession {
            id,
            cwd,
            command,
            state: Mutex::new(state),
            changed: watch::channel(0).0,
            holder: Mutex::new(None),
            gens: AtomicU64::new(0),
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // No poisoning (parking_lot): every section leaves the state consistent.
        self.state.lock()
    }

    fn holder(&self) -> MutexGuard<'_, Option<(u64, Arc<Notify>)>> {
        self.holder.lock()
    }

    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.changed.subscribe()
    }

    pub fn status(&self) -> Status {
        let s = self.state();
        Status {
            running: s.run.as_ref().is_some_and(|r| r.exit.is_none()),
            output_offset: s.ring.total(),
            launch_attempted: s.launch_attempted,
            launch_failed: s.launch_failed,
        }
    }

    /// Attaches a client if none is attached.
    pub fn try_attach(self: &Arc<Self>) -> Option<Attachment> {
        let mut h = self.holder();
        if h.is_some() {
            return None;
        }
        Some(self.install(&mut h))
    }

    /// Attaches a client, evicting the one attached (which closes with 4001).
    pub fn take_over(self: &Arc<Self>) -> Attachment {
        let mut h = self.holder();
        if let Some((_, old)) = h.take() {
            // notify_one keeps a permit, so the old client sees it even if it
            // is not waiting at this moment.
            old.notify_one();
        }
        self.install(&mut h)
    }

    fn install(self: &Arc<Self>, h: &mut Option<(u64, Arc<Notify>)>) -> Attachment {
        let gen = self.gens.fetch_add(1, Ordering::Relaxed) + 1;
        let evicted = Arc::new(Notify::new());
        *h = Some((gen, evicted.clone()));
        Attachment { session: self.clone(), gen, evicted }
    }

    /// Evicts the attached client, if any (the session is being deleted).
    pub fn evict(&self) {
        if let Some((_, n)) = self.holder().take() {
            n.notify_one();
        }
    }

    /// The run a new client attaches to: the live one, or a new process
    /// (`pipe`: plain pipes instead of a terminal). `Err`: the launch failed.
    pub fn ensure_running(self: &Arc<Self>, app: &App, pipe_mode: bool) -> Result<(u64, bool), String> {
        let mut s = self.state();
        if s.closing {
            return Err("pty session is closing".into());
        }
        if let Some(r) = s.run.as_ref().filter(|r| r.exit.is_none()) {
            return Ok((r.seq, r.term.is_some()));
        }
        s.launch_attempted = true;
        let started = self.plan(app, pipe_mode).and_then(|plan| match pipe_mode {
            false => spawn_pty(app, plan),
            true => spawn_pipe(app, plan),
        });
        s.launch_failed = started.is_err();
        let Started { pid, term, stdin, output, exit } = started?;
        s.runs += 1;
        let seq = s.runs;
        let stdin = Arc::new(tokio::sync::Mutex::new(Some(stdin)));
        s.run = Some(Run { seq, pid, term: term.map(Arc::new), stdin, exit: None });
        drop(s);
        tokio::spawn(self.clone().pump(seq, output, exit));
        Ok((seq, !pipe_mode))
    }

    fn plan(&self, app: &App, pipe_mode: bool) -> Result<Plan, String> {
        let mut plan = spawn::shell_plan(&app.config, self.cwd.as_deref(), self.command.as_deref())?;
        if !pipe_mode {
            // Full-screen programs need a terminal type; the sandbox env has none.
            plan.env.entry("TERM".into()).or_insert_with(|| "xterm-256color".into());
        }
        Ok(plan)
    }

    /// Output from `offset` on (clamped to what the ring still holds), and the
    /// exit code if run `seq` has ended and its output is all in the ring.
    pub fn poll(&self, offset: u64, seq: u64) -> Poll {
        let s = self.state();
        let (chunks, from) = s.ring.read_from(offset);
        let exit = s.run.as_ref().filter(|r| r.seq == seq).map_or(Some(-1), |r| r.exit);
        Poll { next: s.ring.total(), chunks, from, exit }
    }

    pub async fn write_stdin(&self, data: &[u8]) -> io::Result<()> {
        let stdin = self.state().run.as_ref().filter(|r| r.exit.is_none()).map(|r| r.stdin.clone());
        let Some(stdin) = stdin else {
            return Err(io::Error::new(io::ErrorKind::BrokenPipe, "the session's process is not running"));
        };
        // One writer at a time, so concurrent frames are not interleaved.
        let mut stdin = stdin.lock().await;
        match stdin.as_mut() {
            Some(w) => w.write_all(data).await,
            None => Err(io::Error::new(io::ErrorKind::BrokenPipe, "the session's input was closed (eof)")),
        }
    }

    /// End of input: on pipes the process's stdin is closed; on a terminal
    /// the line discipline's EOF character (^D) is typed, which is what a
    /// user's end of input is there.
    pub async fn close_stdin(&self) -> io::Result<()> {
        let run = self.state().run.as_ref().filter(|r| r.exit.is_none()).map(|r| (r.stdin.clone(), r.term.is_some()));
        let Some((stdin, is_term)) = run else { return Ok(()) };
        let mut stdin = stdin.lock().await;
        match (is_term, stdin.as_mut()) {
            (true, Some(w)) => w.write_all(b"\x04").await,
            (_, _) => {
                stdin.take();
                Ok(())
            }
        }
    }

    /// Signals the process group of the live run. Unknown names are ignored.
    pub fn signal(&self, app: &App, name: &str) {
        let sig = match name {
            "SIGINT" => sys::SIGINT,
            "SIGTERM" => sys::SIGTERM,
            "SIGKILL" => sys::SIGKILL,
            "SIGQUIT" => sys::SIGQUIT,
            "SIGHUP" => sys::SIGHUP,
            _ => return,
        };
        if let Some(pid) = self.state().run.as_ref().filter(|r| r.exit.is_none()).map(|r| r.pid) {
            app.reaper.signal_group(pid, sig);
        }
    }

    /// Resizes the terminal of the live run (pipe mode: nothing to do).
    pub fn resize(&self, cols: u16, rows: u16) -> io::Result<()> {
        let term = self.state().run.as_ref().filter(|r| r.exit.is_none()).and_then(|r| r.term.clone());
        match term {
            Some(t) => ember_sys::pty::set_window_size(t.as_fd(), cols, rows),
            None => Ok(()),
        }
    }

    /// Kills the process group and frees the attached client (DELETE).
    pub fn close(&self, app: &App) {
        let pid = {
            let mut s = self.state();
            s.closing = true;
            s.run.as_ref().filter(|r| r.exit.is_none()).map(|r| r.pid)
        };
        if let Some(pid) = pid {
            app.reaper.signal_group(pid, sys::SIGKILL);
        }
        self.evict();
    }

    fn append(&self, stream: Stream, data: &[u8]) {
        let total = {
            let mut s = self.state();
            s.ring.push(stream, data);
            s.ring.total()
        };
        self.changed.send_replace(total);
    }

    fn finish(&self, seq: u64, code: i32) {
        if let Some(r) = self.state().run.as_mut().filter(|r| r.seq == seq) {
            r.exit = Some(code);
        }
        self.changed.send_modify(|v| *v = v.wrapping_add(1));
    }

    /// Copies the process's output into the ring until it has exited and its
    /// output is drained, then records the exit.
    async fn pump(self: Arc<Self>, seq: u64, output: Output, exit: oneshot::Receiver<ExitKind>) {
        let mut exit = exit;
        let mut code: Option<i32> = None;
        let (mut out_buf, mut err_buf) = (vec![0u8; 32 * 1024], vec![0u8; 32 * 1024]);
        let Output { mut stdout, mut stderr } = output;
        let (mut out_open, mut err_open) = (true, stderr.is_some());
        while out_open || err_open {
            tokio::select! {
                r = stdout.read(&mut out_buf), if out_open => {
                    match r {
                        Ok(n) if n > 0 => self.append(Stream::Stdout, &out_buf[..n]),
                        // EOF, or EIO: every holder of the terminal has closed it.
                        _ => out_open = false,
                    }
                }
                r = read_opt(stderr.as_mut(), &mut err_buf), if err_open => {
                    match r {
                        Ok(n) if n > 0 => self.append(Stream::Stderr, &err_buf[..n]),
                        _ => err_open = false,
                    }
                }
                e = &mut exit, if code.is_none() => code = Some(e.map_or(-1, ExitKind::code)),
                _ = tokio::time::sleep(DRAIN_IDLE), if code.is_some() => break,
            }
        }
        let code = match code {
            Some(c) => c,
            None => exit.await.map_or(-1, ExitKind::code),
        };
        self.finish(seq, code);
    }
}

async fn read_opt(pipe: Option<&mut pipe::Receiver>, buf: &mut [u8]) -> io::Result<usize> {
    match pipe {
        Some(p) => p.read(buf).await,
        None => Ok(0),
    }
}

/// The agent's reading ends of a started process's output. A terminal
/// master is read through tokio's pipe type: it is only a non-blocking fd.
struct Output {
    stdout: pipe::Receiver,
    stderr: Option<pipe::Receiver>,
}

struct Started {
    pid: i32,
    term: Option<OwnedFd>,
    stdin: pipe::Sender,
    output: Output,
    exit: oneshot::Receiver<ExitKind>,
}

/// Starts the plan on a new terminal, as session leader with it as the
/// controlling terminal.
fn spawn_pty(app: &App, plan: Plan) -> Result<Started, String> {
    let pair = ember_sys::pty::open_pty(80, 24).map_err(|e| format!("openpty: {e}"))?;
    let slave = || pair.slave.try_clone().map(Stdio::from).map_err(|e| format!("dup pty: {e}"));
    let (stdin, stdout, stderr) = (slave()?, slave()?, slave()?);
    let mut cmd = plan.command(|cmd| {
        cmd.stdin(stdin).stdout(stdout).stderr(stderr);
        ember_sys::pty::set_controlling_terminal(cmd);
    });
    let (child, exit) = app.reaper.spawn(&mut cmd).map_err(|e| format!("fork/exec {}: {e}", plan.program.display()))?;
    // Our copies of the slave must close, or reading the master never ends.
    drop(cmd);
    drop(pair.slave);
    let pid = child.id() as i32;
    let ends = (|| {
        let dup = || pair.master.try_clone().map_err(|e| format!("dup pty: {e}"));
        let stdin = pipe::Sender::from_owned_fd_unchecked(dup()?).map_err(|e| format!("watch pty: {e}"))?;
        let stdout = pipe::Receiver::from_owned_fd_unchecked(dup()?).map_err(|e| format!("watch pty: {e}"))?;
        Ok::<_, String>((stdin, stdout))
    })();
    match ends {
        Ok((stdin, stdout)) => {
            let output = Output { stdout, stderr: None };
            Ok(Started { pid, term: Some(pair.master), stdin, output, exit })
        }
        Err(e) => {
            app.reaper.signal_group(pid, sys::SIGKILL);
            Err(e)
        }
    }
}

/// Starts the plan with plain pipes, leading its own process group.
fn spawn_pipe(app: &App, plan: Plan) -> Result<Started, String> {
    let sp = spawn::spawn(&app.reaper, &plan, true)?;
    let spawn::Spawned { pid, stdin: Some(stdin), stdout, stderr, exit } = sp else {
        app.reaper.signal_group(sp.pid, sys::SIGKILL);
        return Err("the process has no stdin pipe".to_string());
    };
    Ok(Started { pid, term: None, stdin, output: Output { stdout, stderr: Some(stderr) }, exit })
}
