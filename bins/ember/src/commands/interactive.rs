//! `ember exec -i/-t`, `ember shell`, `ember attach`: a session on the
//! agent's PTY WebSocket through the API's proxy route. With `-t` the local
//! terminal is raw for the session, its size follows SIGWINCH, and the detach
//! sequence leaves the session running; the CLI exits with the command's code.
use crate::cli::{AttachArgs, ExecOpts, InteractiveOpts};
use crate::term::{self, DetachKeys, RawMode};
use anyhow::{bail, Context};
use ember_client::{Client, PtyConnection, PtyEvent};
use std::io::{Read, Write};
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::mpsc;

/// How the session ended.
enum End {
    Exited(i32),
    Detached,
    /// ctrl-c with the local terminal not raw (no -t, or -t without -i).
    Interrupted,
}

/// `ember exec -i/-t ID -- argv`. The command runs through the sandbox's
/// shell (`exec`'d, so it is the session's process); `--user` and
/// `--timeout` belong to plain exec.
pub async fn exec(
    client: &Client,
    id: &str,
    opts: &ExecOpts,
    io: &InteractiveOpts,
    argv: Vec<String>,
) -> anyhow::Result<i32> {
    if opts.user.is_some() || opts.timeout.is_some() {
        bail!("--user and --timeout work without -i/-t only (a terminal session runs as the sandbox's user)");
    }
    let env = super::parse_kv(&opts.exec_env, "--env")?;
    let mut words: Vec<String> = vec!["exec".into()];
    if !env.is_empty() {
        words.push("env".into());
        words.extend(env.iter().map(|(k, v)| format!("{k}={v}")));
    }
    words.extend(argv);
    let command = shlex::try_join(words.iter().map(String::as_str)).context("the command has a NUL byte")?;
    session(client, id, Some(&command), opts.cwd.as_deref(), io).await
}

/// `ember shell ID`: the sandbox user's interactive shell on a terminal (`exec -it`).
pub async fn shell(client: &Client, id: &str, detach_keys: &str) -> anyhow::Result<i32> {
    let io = InteractiveOpts { interactive: true, tty: true, detach_keys: detach_keys.to_string() };
    session(client, id, None, None, &io).await
}

/// SIGINT and SIGWINCH, taken before the remote process starts: a ctrl-c
/// in between would otherwise end the CLI and leave the command running.
struct Signals {
    intr: tokio::signal::unix::Signal,
    winch: tokio::signal::unix::Signal,
}

fn signals() -> anyhow::Result<Signals> {
    Ok(Signals {
        intr: signal(SignalKind::interrupt()).context("SIGINT handler")?,
        winch: signal(SignalKind::window_change()).context("SIGWINCH handler")?,
    })
}

/// A new PTY session for `command` (an interactive shell if `None`), attached.
async fn session(
    client: &Client,
    id: &str,
    command: Option<&str>,
    cwd: Option<&str>,
    io: &InteractiveOpts,
) -> anyhow::Result<i32> {
    if io.tty && !term::stdin_is_tty() {
        bail!("-t needs a terminal on stdin (drop -t to stream stdin through pipes)");
    }
    let detach = DetachKeys::parse(&io.detach_keys).map_err(anyhow::Error::msg)?;
    let sigs = signals()?;
    let sid = client.create_pty(id, command, cwd).await?;
    let conn = match client.connect_pty(id, &sid, io.tty, 0, false).await {
        Ok(c) => c,
        Err(e) => {
            // Nothing started (the process starts on connect): drop the record.
            let _ = client.delete_pty(id, &sid).await;
            return Err(e.into());
        }
    };
    let end = run(conn, io.interactive, io.tty, detach, sigs).await;
    finish(client, id, &sid, end).await
}

/// `ember attach ID`: the entrypoint's output, or with `--session` a
/// terminal session left by the detach sequence (stdin included).
pub async fn attach(client: &Client, a: &AttachArgs) -> anyhow::Result<i32> {
    let Some(sid) = &a.session else {
        return super::logs::follow_entrypoint(client, &a.id).await;
    };
    let tty = term::stdin_is_tty();
    let detach = DetachKeys::parse(&a.detach_keys).map_err(anyhow::Error::msg)?;
    let sigs = signals()?;
    // Only what comes from now on: the screen is redrawn by the program (or
    // by a key press), as with docker attach.
    let since = client.pty_offset(&a.id, sid).await?;
    let conn = client.connect_pty(&a.id, sid, true, since, a.takeover).await?;
    let end = run(conn, true, tty, detach, sigs).await;
    finish(client, &a.id, sid, end).await
}

async fn finish(client: &Client, id: &str, sid: &str, end: anyhow::Result<End>) -> anyhow::Result<i32> {
    match end? {
        End::Exited(code) => {
            // The session is done; free it in the agent (best effort).
            let _ = client.delete_pty(id, sid).await;
            Ok(code)
        }
        End::Detached => {
            eprint!("\r\nember: detached; the session keeps running: ember attach {id} --session {sid}\r\n");
            Ok(0)
        }
        End::Interrupted => {
            // The command goes with the CLI, as a local one would.
            client.delete_pty(id, sid).await.with_context(|| format!("ending session {sid}"))?;
            Ok(130)
        }
    }
}

/// Reads our stdin on a thread of its own (reads of a terminal or pipe
/// block) into a channel; the channel closes at end of input. The thread
/// may stay blocked in a read after the session: the process exits then.
fn stdin_reader() -> mpsc::Receiver<Vec<u8>> {
    let (tx, rx) = mpsc::channel(16);
    std::thread::spawn(move || {
        let mut stdin = std::io::stdin().lock();
        let mut buf = vec![0u8; 8192];
        while let Ok(n) = stdin.read(&mut buf) {
            if n == 0 || tx.blocking_send(buf[..n].to_vec()).is_err() {
                break;
            }
        }
    });
    rx
}

/// Pumps one attached session until the process exits or the user detaches.
async fn run(
    mut conn: PtyConnection,
    interactive: bool,
    tty: bool,
    mut detach: DetachKeys,
    mut sigs: Signals,
) -> anyhow::Result<End> {
    // Raw only when typed keys go to the session: there ctrl-c is a byte for
    // the remote terminal; otherwise it is our SIGINT and ends the command.
    let raw = tty && interactive;
    let _raw = if raw { Some(RawMode::enter().context("raw mode on the terminal")?) } else { None };
    if let Some((cols, rows)) = term::window_size().filter(|_| tty) {
        conn.resize(cols, rows).await?;
    }
    let mut input = interactive.then(stdin_reader);
    loop {
        tokio::select! {
            ev = conn.next() => match ev? {
                PtyEvent::Stdout(b) => write_all(&mut std::io::stdout().lock(), &b),
                PtyEvent::Stderr(b) => write_all(&mut std::io::stderr().lock(), &b),
                PtyEvent::Exit(code) => return Ok(End::Exited(code)),
                PtyEvent::Closed { code: 4001, .. } => bail!("another client took the session over"),
                PtyEvent::Closed { code, reason } => bail!("the session's connection closed ({code} {reason}) before the command exited"),
            },
            data = recv(&mut input) => match data {
                Some(data) => {
                    let (send, detached) = if raw { detach.feed(&data) } else { (data, false) };
                    if !send.is_empty() {
                        conn.stdin(&send).await?;
                    }
                    if detached {
                        conn.detach().await;
                        return Ok(End::Detached);
                    }
                }
                None => {
                    // End of our input: the command's stdin ends too.
                    input = None;
                    conn.eof().await?;
                }
            },
            _ = sigs.intr.recv(), if !raw => return Ok(End::Interrupted),
            _ = sigs.winch.recv(), if tty => {
                if let Some((cols, rows)) = term::window_size() {
                    conn.resize(cols, rows).await?;
                }
            }
        }
    }
}

/// The next chunk of input; pending forever once there is no more.
async fn recv(input: &mut Option<mpsc::Receiver<Vec<u8>>>) -> Option<Vec<u8>> {
    match input {
        Some(rx) => rx.recv().await,
        None => std::future::pending().await,
    }
}

fn write_all(out: &mut impl Write, b: &[u8]) {
    // A closed local stdout (a pipe whose reader left) must not end the
    // session's bookkeeping; the exit code still comes back.
    let _ = out.write_all(b).and_then(|()| out.flush());
}
