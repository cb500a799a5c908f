//! The interactive CLI for real: `ember exec -it`, `ember attach --session`
//! and the detach sequence in a tmux pane (a real terminal: keys sent with
//! `send-keys`, the screen read with `capture-pane`), `exec -i` through
//! pipes, `ember logs` (following, and across a daemon restart) and `ember
//! stats`, each the built binary against a real daemon and real sandboxes.
mod common;

use common::Daemon;
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

/// A guard against a hang, not a performance threshold.
const HANG: Duration = Duration::from_secs(60);
const PROMPT: &str = "sbx-prompt$";

static PANES: AtomicU32 = AtomicU32::new(0);

fn ember(d: &Daemon, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_ember")).args(args).env("EMBER_URL", &d.url).output().expect("ember runs")
}

/// One tmux server of its own (`-L`), one session, one pane running `cmd`
/// through `sh`, then printing `ember-exit=<code>` and staying open.
struct Tmux {
    sock: String,
}

impl Tmux {
    fn start(d: &Daemon, ember_args: &str, cols: u16, rows: u16) -> Tmux {
        let n = PANES.fetch_add(1, Ordering::SeqCst);
        let t = Tmux { sock: format!("ember-test-{}-{n}", std::process::id()) };
        let cmd =
            format!("EMBER_URL={} {} {ember_args}; echo ember-exit=$?; sleep 3600", d.url, env!("CARGO_BIN_EXE_ember"));
        let (c, r) = (cols.to_string(), rows.to_string());
        t.tmux(&["-f", "/dev/null", "new-session", "-d", "-s", "t", "-x", &c, "-y", &r, &cmd]);
        t
    }

    fn tmux(&self, args: &[&str]) -> String {
        let o = Command::new("tmux")
            .args(["-L", &self.sock])
            .args(args)
            .output()
            .expect("tmux runs (apt-get install tmux)");
        assert!(o.status.success(), "tmux {args:?}: {}", String::from_utf8_lossy(&o.stderr));
        String::from_utf8_lossy(&o.stdout).into_owned()
    }

    /// Types `text` and Enter.
    fn line(&self, text: &str) {
        self.tmux(&["send-keys", "-t", "t", "-l", text]);
        self.tmux(&["send-keys", "-t", "t", "Enter"]);
    }

    fn screen(&self) -> String {
        self.tmux(&["capture-pane", "-p", "-J", "-t", "t"])
    }

    /// Polls the screen until `pred` holds on it; returns it.
    fn wait_for(&self, what: &str, pred: impl Fn(&str) -> bool) -> String {
        let start = Instant::now();
        loop {
            let s = self.screen();
            if pred(&s) {
                return s;
            }
            assert!(start.elapsed() < HANG, "waited for {what}; the screen:\n{s}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn wait_line(&self, line: &str) -> String {
        self.wait_for(line, |s| s.lines().any(|l| l.trim_end() == line))
    }

    /// Waits until the bottom line is `bottom` (the shell at its prompt, or
    /// a command echoed and still running): keys typed before the shell
    /// reads them again would meet the terminal in cooked mode.
    fn wait_bottom(&self, bottom: &str) -> String {
        self.wait_for(bottom, |s| s.lines().rev().find(|l| !l.trim().is_empty()).map(str::trim_end) == Some(bottom))
    }

    /// Types a command at the prompt; returns the screen once `line` is
    /// on it and the prompt is back.
    fn run(&self, cmd: &str, line: &str) -> String {
        self.line(cmd);
        self.wait_for(line, |s| {
            s.lines().any(|l| l.trim_end() == line)
                && s.lines().rev().find(|l| !l.trim().is_empty()).map(str::trim_end) == Some(PROMPT)
        })
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = Command::new("tmux").args(["-L", &self.sock, "kill-server"]).output();
    }
}

/// `ember exec -it` of bash with a known prompt in a 100x30 pane, at its prompt.
fn shell_in_tmux(d: &Daemon, id: &str) -> Tmux {
    let t = Tmux::start(d, &format!("exec -it {id} --exec-env 'PS1={PROMPT} ' -- bash --norc --noprofile -i"), 100, 30);
    t.wait_for("the prompt", |s| s.contains(PROMPT));
    t
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exec_it_on_a_real_terminal_echoes_resizes_and_passes_the_exit_code() {
    let d = Daemon::start();
    let sb = d.create(|_| {}).await;
    let t = shell_in_tmux(&d, &sb.id);
    t.line("echo in-$((6*7)) $(tty)");
    // The typed line comes back through the sandbox's terminal (its echo),
    // then the command's output, computed inside.
    let s = t.wait_for("the output", |s| s.lines().any(|l| l.starts_with("in-42 /dev/pts/")));
    assert!(s.contains("echo in-$((6*7)) $(tty)"), "the terminal echoed the typed line:\n{s}");
    t.wait_bottom(PROMPT);
    t.run("stty size", "30 100");
    // The pane shrinks: ember gets SIGWINCH and resizes the remote terminal.
    t.tmux(&["resize-window", "-t", "t", "-x", "90", "-y", "25"]);
    t.run("clear; stty size", "25 90");
    // Raw mode: ctrl-c reaches the sandbox's shell (the local CLI lives on).
    t.line("sleep 600");
    t.wait_bottom(&format!("{PROMPT} sleep 600"));
    // The echo comes back before bash has started the job: a ctrl-c in
    // between did not interrupt sleep (CI once waited for the prompt in
    // vain). Once sleep runs, it holds the terminal's foreground group.
    let start = Instant::now();
    while !d
        .procs(&sb.id)
        .iter()
        .any(|p| std::fs::read_to_string(format!("/proc/{p}/comm")).is_ok_and(|c| c.trim() == "sleep"))
    {
        assert!(start.elapsed() < HANG, "sleep never ran in the sandbox");
        std::thread::sleep(Duration::from_millis(20));
    }
    t.tmux(&["send-keys", "-t", "t", "C-c"]);
    t.wait_bottom(PROMPT);
    t.run("echo after-interrupt", "after-interrupt");
    t.line("exit 7");
    t.wait_line("ember-exit=7");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_detach_sequence_leaves_the_session_running_and_attach_resumes_it() {
    let d = Daemon::start();
    let sb = d.create(|_| {}).await;
    let t = shell_in_tmux(&d, &sb.id);
    t.run("X=kept-$((40+2)); echo set", "set");
    t.tmux(&["send-keys", "-t", "t", "C-p", "C-q"]);
    let s = t.wait_line("ember-exit=0");
    let sid = s
        .split_whitespace()
        .skip_while(|w| *w != "--session")
        .nth(1)
        .unwrap_or_else(|| panic!("the detach message names the session:\n{s}"))
        .to_string();
    assert!(sid.starts_with("pty-"), "{sid}");

    let t2 = Tmux::start(&d, &format!("attach {} --session {sid}", sb.id), 100, 30);
    t2.line("echo $X");
    t2.wait_line("kept-42");
    t2.line("exit 4");
    t2.wait_line("ember-exit=4");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shell_is_an_interactive_shell_on_a_terminal() {
    let d = Daemon::start();
    let sb = d.create(|_| {}).await;
    let t = Tmux::start(&d, &format!("shell {}", sb.id), 100, 30);
    t.line("echo shell-$((2+3)) $(tty)");
    t.wait_for("the output", |s| s.lines().any(|l| l.starts_with("shell-5 /dev/pts/")));
    t.line("exit 9");
    t.wait_line("ember-exit=9");
}

/// Without a raw terminal, ctrl-c (SIGINT to the CLI) ends the remote
/// command too and exits 130, as a local command would.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ctrl_c_of_exec_i_ends_the_remote_command() {
    let d = Daemon::start();
    let sb = d.create(|_| {}).await;
    let mut child = Command::new(env!("CARGO_BIN_EXE_ember"))
        .args(["exec", "-i", &sb.id, "--", "sleep", "3607"])
        .env("EMBER_URL", &d.url)
        .stdin(Stdio::piped())
        .spawn()
        .expect("ember runs");
    let running = "ps -eo args | grep -c '^sleep 3607$'";
    let start = Instant::now();
    while d.sh(&sb.id, running, None).await.1 != "1\n" {
        assert!(start.elapsed() < HANG, "the remote sleep never started");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let st = Command::new("kill").args(["-INT", &child.id().to_string()]).status().expect("kill runs");
    assert!(st.success());
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || tx.send(child.wait()));
    let status = rx.recv_timeout(HANG).expect("ember exits on SIGINT").expect("ember ran");
    assert_eq!(status.code(), Some(130));
    assert_eq!(d.sh(&sb.id, running, None).await.1, "0\n", "the remote command was ended");
}

#[test]
fn exec_i_streams_stdin_through_pipes_until_its_end() {
    let d = Daemon::start();
    let o = ember(&d, &["sandbox", "create"]);
    let id = String::from_utf8_lossy(&o.stdout).trim().to_string();
    let mut child = Command::new(env!("CARGO_BIN_EXE_ember"))
        .args(["exec", "-i", &id, "--", "sh", "-c", "cat; echo err >&2; exit 3"])
        .env("EMBER_URL", &d.url)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("ember runs");
    {
        use std::io::Write;
        let mut stdin = child.stdin.take().expect("stdin");
        stdin.write_all(b"hello\nno newline at the end").expect("write stdin");
        // Dropped here: end of input, which must reach `cat`.
    }
    // On a thread, so a lost end of input fails the test instead of hanging it.
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || tx.send(child.wait_with_output()));
    let o = rx.recv_timeout(HANG).expect("ember exits once cat has read everything").expect("ember ran");
    assert_eq!(o.status.code(), Some(3));
    assert_eq!(String::from_utf8_lossy(&o.stdout), "hello\nno newline at the end");
    assert_eq!(String::from_utf8_lossy(&o.stderr), "err\n");
}

/// The entrypoint prints three lines, waits for /tmp/go, prints one more.
const ENTRYPOINT: &str = "echo line-1; echo line-2; echo line-3; \
    while [ ! -e /tmp/go ]; do sleep 0.05; done; echo late; exec sleep 3600";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logs_follow_the_entrypoint_and_survive_a_daemon_restart() {
    let mut d = Daemon::start();
    let sb = d.create(|r| r.entrypoint = Some(vec!["sh".into(), "-c".into(), ENTRYPOINT.into()])).await;
    let start = Instant::now();
    let early = loop {
        let o = ember(&d, &["logs", &sb.id]);
        let out = String::from_utf8_lossy(&o.stdout).into_owned();
        if out.contains("line-3") {
            break out;
        }
        assert!(start.elapsed() < HANG, "no line-3 in {out:?} {}", String::from_utf8_lossy(&o.stderr));
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(early, "line-1\nline-2\nline-3\n");
    let o = ember(&d, &["logs", &sb.id, "--tail", "1"]);
    assert_eq!(String::from_utf8_lossy(&o.stdout), "line-3\n");

    // -f prints what is there, then the line written after it started.
    let mut follow = Command::new(env!("CARGO_BIN_EXE_ember"))
        .args(["logs", "-f", &sb.id])
        .env("EMBER_URL", &d.url)
        .stdout(Stdio::piped())
        .spawn()
        .expect("ember logs -f runs");
    let mut lines = std::io::BufRead::lines(std::io::BufReader::new(follow.stdout.take().expect("stdout")));
    for want in ["line-1", "line-2", "line-3"] {
        assert_eq!(lines.next().expect("a line").expect("utf8"), want);
    }
    // `attach` (no --session): the entrypoint's output from now on only.
    let mut attach = Command::new(env!("CARGO_BIN_EXE_ember"))
        .args(["attach", &sb.id])
        .env("EMBER_URL", &d.url)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("ember attach runs");
    let mut said = String::new();
    std::io::BufRead::read_line(&mut std::io::BufReader::new(attach.stderr.take().expect("stderr")), &mut said)
        .expect("attach says it is attached");
    assert!(said.contains("attached to the entrypoint") && said.contains("no stdin"), "{said}");
    let (code, _, _) = d.sh(&sb.id, "touch /tmp/go", None).await;
    assert_eq!(code, Some(0));
    assert_eq!(lines.next().expect("the late line").expect("utf8"), "late");
    let mut attached = std::io::BufRead::lines(std::io::BufReader::new(attach.stdout.take().expect("stdout")));
    assert_eq!(attached.next().expect("a line").expect("utf8"), "late", "attach starts at the end");
    for mut c in [follow, attach] {
        let _ = c.kill();
        let _ = c.wait();
    }

    // The agent keeps the output: a restarted daemon serves it all again.
    d.kill9();
    d.spawn();
    let o = ember(&d, &["logs", &sb.id]);
    assert_eq!(String::from_utf8_lossy(&o.stdout), "line-1\nline-2\nline-3\nlate\n", "{o:?}");
    let o = ember(&d, &["logs", &d.create(|_| {}).await.id]);
    assert!(String::from_utf8_lossy(&o.stderr).contains("has no entrypoint"), "{o:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stats_show_memory_growing_after_the_sandbox_allocates() {
    let d = Daemon::start();
    let sb = d.create_limited("512Mi", 128).await;
    let read = || {
        let o = ember(&d, &["stats", &sb.id, "--no-stream", "--json"]);
        assert!(o.status.success(), "{o:?}");
        serde_json::from_slice::<serde_json::Value>(&o.stdout).expect("one JSON reading")
    };
    let before = read();
    assert_eq!(before["memoryLimitBytes"], 512u64 << 20);
    assert_eq!(before["pidsLimit"], 128);
    assert!(before["pids"].as_u64().expect("pids") >= 1, "{before}");
    assert!(before["cpuUsageMicros"].as_u64().is_some(), "cpu accounting: {before}");
    // 64 MiB in the sandbox's tmpfs layer: memory charged to its cgroup.
    let (code, _, err) = d.sh(&sb.id, "head -c 67108864 /dev/zero > /tmp/blob", None).await;
    assert_eq!(code, Some(0), "{err}");
    let after = read();
    let grew = after["memoryBytes"].as_u64().unwrap().saturating_sub(before["memoryBytes"].as_u64().unwrap());
    assert!(grew >= 60 << 20, "memory grew by {grew} bytes: {before} → {after}");
    let o = ember(&d, &["stats", &sb.id, "--no-stream"]);
    let table = String::from_utf8_lossy(&o.stdout);
    assert!(table.starts_with("ID ") && table.contains("MEM USAGE / LIMIT") && table.contains("/ 512.0MiB"), "{table}");
    let o = ember(&d, &["stats", "no-such-sandbox", "--no-stream"]);
    assert!(String::from_utf8_lossy(&o.stderr).contains("SANDBOX::NOT_FOUND"), "{o:?}");
}

/// The entrypoint's exit ends the sandbox (and its agent, which held the
/// output): `logs -f` and `attach` then end, with exit code 0, not hang.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logs_follow_ends_when_the_entrypoint_exits() {
    let d = Daemon::start();
    let script = "echo first; while [ ! -e /tmp/go ]; do sleep 0.05; done; exit 3";
    let sb = d.create(|r| r.entrypoint = Some(vec!["sh".into(), "-c".into(), script.into()])).await;
    let mut follow = Command::new(env!("CARGO_BIN_EXE_ember"))
        .args(["logs", "-f", &sb.id])
        .env("EMBER_URL", &d.url)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("ember logs -f runs");
    let mut first = String::new();
    std::io::BufRead::read_line(&mut std::io::BufReader::new(follow.stdout.as_mut().expect("stdout")), &mut first)
        .expect("the first line");
    assert_eq!(first, "first\n");
    let (code, _, _) = d.sh(&sb.id, "touch /tmp/go", None).await;
    assert_eq!(code, Some(0));
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || tx.send(follow.wait_with_output()));
    let o = rx.recv_timeout(HANG).expect("logs -f ended with the sandbox").expect("ember ran");
    assert!(o.status.success(), "{o:?}");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.is_empty() || err.contains("ended: Failed Exited(3)"), "{err}");
}
