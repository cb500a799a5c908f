//! Real processes: what a command started by [`Exec::spawn`] sees.
use super::*;
use std::ffi::OsString;
use std::io::Read;
use std::os::fd::AsRawFd;

const PATH: &str = "/usr/local/bin:/usr/bin:/bin";

/// A directory of this test's own, removed on drop.
struct TmpDir(std::path::PathBuf);

impl TmpDir {
    fn new(name: &str) -> TmpDir {
        let p = std::env::temp_dir().join(format!("ember-vspawn-{}-{name}", std::process::id()));
        std::fs::create_dir_all(&p).unwrap();
        TmpDir(p)
    }

    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TmpDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Runs `program args` with `env`, in `cwd`, as `creds`; its stdout, its
/// exit code.
fn run(
    program: &str,
    args: &[&str],
    env: &[(&str, &str)],
    cwd: &str,
    creds: Option<Credentials>,
) -> io::Result<(String, i32)> {
    let env: Vec<(OsString, OsString)> = env.iter().map(|(k, v)| (k.into(), v.into())).collect();
    let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    let exec = Exec::new(
        Path::new(program),
        &args,
        env.iter().map(|(k, v)| (k.as_os_str(), v.as_os_str())),
        Path::new(cwd),
        creds,
        PATH,
    )?;
    let (mut r, w) = io::pipe()?;
    let null = std::fs::File::open("/dev/null")?;
    let pid = exec.spawn(Stdio { stdin: null.as_raw_fd(), stdout: w.as_raw_fd(), stderr: w.as_raw_fd() })?;
    drop(w);
    let mut out = String::new();
    r.read_to_string(&mut out)?;
    let mut status = 0;
    // SAFETY: reaps the child just spawned.
    assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
    assert!(libc::WIFEXITED(status), "exited: {status:#x}");
    Ok((out, libc::WEXITSTATUS(status)))
}

#[test]
fn a_command_gets_its_argv_env_directory_and_a_process_group_of_its_own() {
    let script =
        r#"echo "$0 $1 [$FOO] [$HOME]"; pwd; [ "$(cut -d' ' -f5 /proc/$$/stat)" = $$ ] && echo leader; exit 3"#;
    let (out, code) = run("sh", &["-c", script, "one"], &[("FOO", "bar"), ("PATH", PATH)], "/tmp", None).unwrap();
    assert_eq!(out, "one  [bar] []\n/tmp\nleader\n");
    assert_eq!(code, 3);
}

#[test]
fn the_identity_switches_before_the_directory_is_entered() {
    let nobody = Credentials { uid: 65534, gid: 65534, groups: vec![65534, 100] };
    let (out, _) = run("/bin/sh", &["-c", "id -u; id -g; id -G"], &[], "/", Some(nobody.clone())).unwrap();
    assert_eq!(out, "65534\n65534\n65534 100\n");
    let dir = TmpDir::new("private");
    std::fs::set_permissions(dir.path(), std::os::unix::fs::PermissionsExt::from_mode(0o700)).unwrap();
    let e = run("/bin/true", &[], &[], dir.path().to_str().unwrap(), Some(nobody)).unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::PermissionDenied, "{e}");
    run("/bin/true", &[], &[], dir.path().to_str().unwrap(), None).expect("root may enter");
}

#[test]
fn the_program_is_found_on_the_commands_path_as_execvp_finds_it() {
    let env = [("PATH", "/nonexistent::/usr/bin:/bin")];
    assert_eq!(run("true", &[], &env, "/", None).unwrap().1, 0);
    let e = run("no-such-program-here", &[], &env, "/", None).unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::NotFound, "{e}");
    let e = run("/bin/true", &[], &[], "/no/such/dir", None).unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::NotFound, "{e}");

    let dir = TmpDir::new("path");
    let script = dir.path().join("plain");
    std::fs::write(&script, "echo run by sh \"$1\"\n").unwrap();
    let mode = |m| std::os::unix::fs::PermissionsExt::from_mode(m);
    std::fs::set_permissions(&script, mode(0o755)).unwrap();
    let p = script.to_str().unwrap();
    assert_eq!(run(p, &["x"], &[], "/", None).unwrap().0, "run by sh x\n", "a file without #! goes to /bin/sh");
    std::fs::set_permissions(&script, mode(0o644)).unwrap();
    let e = run(p, &[], &[], "/", None).unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::PermissionDenied, "{e}");
    let dir_env = [("PATH", dir.path().to_str().unwrap())];
    let e = run("plain", &[], &dir_env, "/", None).unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::PermissionDenied, "found but not executable: {e}");
}

/// Bit `sig` of a `Sig*:` mask in /proc/PID/status.
fn has(mask: &str, sig: i32) -> bool {
    u64::from_str_radix(mask, 16).unwrap() & (1 << (sig - 1)) != 0
}

#[test]
fn the_command_starts_with_no_signal_blocked_and_sigpipe_at_its_default() {
    // What a Rust program has: SIGPIPE ignored, and here a handler and a
    // blocked signal on the spawning thread.
    extern "C" fn on_usr1(_: libc::c_int) {}
    // SAFETY: process-wide dispositions for this test binary; the handler does nothing.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_IGN);
        libc::signal(libc::SIGUSR1, on_usr1 as *const () as libc::sighandler_t);
        libc::signal(libc::SIGHUP, libc::SIG_IGN);
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGUSR2);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
    }
    let (out, _) = run("/bin/grep", &["^Sig", "/proc/self/status"], &[], "/", None).unwrap();
    let field = |name: &str| {
        out.lines().find_map(|l| l.strip_prefix(name)).map(str::trim).unwrap_or_else(|| panic!("{name} in {out}"))
    };
    assert_eq!(field("SigBlk:"), "0000000000000000");
    assert!(!has(field("SigIgn:"), libc::SIGPIPE), "SIGPIPE back at its default: {out}");
    assert!(has(field("SigIgn:"), libc::SIGHUP), "an ignored signal stays ignored, as after a fork: {out}");
}
