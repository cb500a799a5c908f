//! A typed wrapper around an OCI runtime's command line (`crun`, `runc`,
//! `runsc`), in the spirit of containerd's `runc` crate: one method per verb,
//! a `--root` per class so classes never see each other's containers, and
//! errors that carry the command line and the runtime's stderr.
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

#[derive(Debug, thiserror::Error)]
pub enum OciCliError {
    #[error("running `{command}`")]
    Spawn {
        command: String,
        #[source]
        source: std::io::Error,
    },
    #[error("`{command}` failed ({status}): {stderr}")]
    Failed { command: String, status: String, stderr: String },
    #[error("`{command}` printed unparsable state: {message}")]
    BadState { command: String, message: String },
}

/// What `<runtime> state <id>` reports.
#[derive(Clone, Debug, PartialEq, Eq, serde::Deserialize)]
pub struct ContainerState {
    pub id: String,
    /// "created", "running", "stopped", "paused".
    pub status: String,
    /// The host pid of the container's init (for runsc: of the sandbox process).
    #[serde(default)]
    pub pid: i32,
}

/// One OCI runtime binary with its global flags.
#[derive(Clone, Debug)]
pub struct OciCli {
    binary: PathBuf,
    root: PathBuf,
    global: Vec<String>,
    /// `RLIMIT_NOFILE` every run of the runtime starts with (its containers'
    /// inits inherit it), if set.
    open_files: Option<u64>,
}

impl OciCli {
    /// `global` goes before every verb (runsc: `--platform=ptrace --network=none`).
    pub fn new(binary: impl Into<PathBuf>, root: impl Into<PathBuf>, global: Vec<String>) -> OciCli {
        OciCli { binary: binary.into(), root: root.into(), global, open_files: None }
    }

    /// Runs the runtime with `RLIMIT_NOFILE` lowered to `n`, for a bundle
    /// whose init inherits it ([`super::bundle::BundleInputs::inherit_rlimits`]).
    pub fn with_open_files(self, n: u64) -> OciCli {
        OciCli { open_files: Some(n), ..self }
    }

    pub fn binary(&self) -> &Path {
        &self.binary
    }

    fn command(&self, verb: &[&str]) -> Result<Command, OciCliError> {
        let mut c = Command::new(&self.binary);
        c.arg("--root").arg(&self.root).args(&self.global).args(verb);
        c.stdin(Stdio::null());
        if let Some(n) = self.open_files {
            ember_sys::process::limit_open_files(&mut c, n)
                .map_err(|source| OciCliError::Spawn { command: self.line(verb), source })?;
        }
        Ok(c)
    }

    fn line(&self, verb: &[&str]) -> String {
        let mut s = format!("{} --root {}", self.binary.display(), self.root.display());
        for a in self.global.iter().map(String::as_str).chain(verb.iter().copied()) {
            s.push(' ');
            s.push_str(a);
        }
        s
    }

    fn run(&self, verb: &[&str]) -> Result<Vec<u8>, OciCliError> {
        let command = self.line(verb);
        let out =
            self.command(verb)?.output().map_err(|source| OciCliError::Spawn { command: command.clone(), source })?;
        if !out.status.success() {
            return Err(OciCliError::Failed {
                command,
                status: out.status.to_string(),
                stderr: tail(&String::from_utf8_lossy(&out.stderr)),
            });
        }
        Ok(out.stdout)
    }

    /// `run --detach --bundle <dir> --pid-file <file> <id>` (create and start
    /// in one run of the runtime), and the init's host pid (for runsc the
    /// sandbox process's) from that file: the pid `state` reports, without
    /// another run (one of runsc costs ~15 ms of the launch). The container's
    /// init inherits the runtime's stdio, so stdout and stderr go to `log` (a
    /// pipe would stay open for the container's life); on failure the error
    /// carries the log's tail.
    pub fn run_detached(&self, id: &str, bundle: &Path, log: &Path, pid_file: &Path) -> Result<i32, OciCliError> {
        let (b, p) = (bundle.display().to_string(), pid_file.display().to_string());
        let verb = ["run", "--detach", "--bundle", &b, "--pid-file", &p, id];
        self.run_logged(&verb, log, None)?;
        self.read_pid_file(&verb, pid_file)
    }

    /// The pid a `--pid-file` holds (a few digits the runtime wrote, in a dir
    /// of the daemon's own; read up to 64 bytes).
    fn read_pid_file(&self, verb: &[&str], file: &Path) -> Result<i32, OciCliError> {
        use std::io::Read;
        use std::os::unix::fs::OpenOptionsExt;
        let bad = |message: String| OciCliError::BadState { command: self.line(verb), message };
        let mut text = String::new();
        // O_NOFOLLOW: the sandbox's dir is the daemon's own (0711, the
        // sandbox writes only below sock/, ws/ and mnt/), but a link there is
        // never followed.
        std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(super::exit::O_NOFOLLOW)
            .open(file)
            .and_then(|f| f.take(64).read_to_string(&mut text))
            .map_err(|e| bad(format!("reading {}: {e}", file.display())))?;
        match text.trim().parse::<i32>() {
            Ok(pid) if pid > 0 => Ok(pid),
            _ => Err(bad(format!("{} holds {:?}, not a pid", file.display(), text.trim()))),
        }
    }

    /// [`OciCli::create`] with `listener` as the init's fd 3
    /// (`--preserve-fds 1`): the agent serves on it from its first instruction
    /// and a client can connect before it runs, as with the native class.
    pub fn create_with_listener(
        &self,
        id: &str,
        bundle: &Path,
        log: &Path,
        listener: std::os::fd::OwnedFd,
    ) -> Result<(), OciCliError> {
        let b = bundle.display().to_string();
        self.run_logged(&["create", "--preserve-fds", "1", "--bundle", &b, id], log, Some(listener))
    }

    /// Runs `verb` with stdout and stderr appended to `log` (and `fd3` passed on).
    fn run_logged(&self, verb: &[&str], log: &Path, fd3: Option<std::os::fd::OwnedFd>) -> Result<(), OciCliError> {
        let command = self.line(verb);
        let spawn = |source| OciCliError::Spawn { command: command.clone(), source };
        let f = std::fs::OpenOptions::new().create(true).append(true).open(log).map_err(spawn)?;
        let f2 = f.try_clone().map_err(spawn)?;
        let mut cmd = self.command(verb)?;
        if let Some(fd) = fd3 {
            ember_sys::process::pass_fd(&mut cmd, fd, 3).map_err(spawn)?;
        }
        let status = cmd.stdout(f).stderr(f2).status().map_err(spawn)?;
        if !status.success() {
            let stderr = std::fs::read_to_string(log).unwrap_or_default();
            return Err(OciCliError::Failed { command, status: status.to_string(), stderr: tail(&stderr) });
        }
        Ok(())
    }

    /// `checkpoint --image-path <dir> <id>` (runsc): saves the container and stops it.
    pub fn checkpoint(&self, id: &str, image: &Path) -> Result<(), OciCliError> {
        let i = image.display().to_string();
        self.run(&["checkpoint", "--image-path", &i, id]).map(drop)
    }

    /// `restore --image-path <dir> --bundle <dir> --pid-file <file> --detach
    /// <id>` (runsc), and the restored sandbox process's pid from that file.
    /// Like [`OciCli::run_detached`], the restored init's stdio goes to `log`.
    pub fn restore(
        &self,
        id: &str,
        image: &Path,
        bundle: &Path,
        log: &Path,
        pid_file: &Path,
    ) -> Result<i32, OciCliError> {
        let (i, b, p) = (image.display().to_string(), bundle.display().to_string(), pid_file.display().to_string());
        let verb = ["restore", "--image-path", &i, "--bundle", &b, "--pid-file", &p, "--detach", id];
        self.run_logged(&verb, log, None)?;
        self.read_pid_file(&verb, pid_file)
    }

    pub fn start(&self, id: &str) -> Result<(), OciCliError> {
        self.run(&["start", id]).map(drop)
    }

    pub fn state(&self, id: &str) -> Result<ContainerState, OciCliError> {
        let out = self.run(&["state", id])?;
        serde_json::from_slice(&out)
            .map_err(|e| OciCliError::BadState { command: self.line(&["state", id]), message: e.to_string() })
    }

    /// `kill [--all] <id> <signal>`.
    pub fn kill(&self, id: &str, signal: &str, all: bool) -> Result<(), OciCliError> {
        if all {
            self.run(&["kill", "--all", id, signal]).map(drop)
        } else {
            self.run(&["kill", id, signal]).map(drop)
        }
    }

    /// `delete --force <id>`.
    pub fn delete(&self, id: &str) -> Result<(), OciCliError> {
        self.run(&["delete", "--force", id]).map(drop)
    }

    /// `exec <id> <args...>` and its stdout (diagnostics; commands go through
    /// the agent).
    pub fn exec(&self, id: &str, args: &[&str]) -> Result<Vec<u8>, OciCliError> {
        let mut verb = vec!["exec", id];
        verb.extend_from_slice(args);
        self.run(&verb)
    }

    /// `exec <flags...> <id> <args...>`: flags of the verb itself (runsc:
    /// `--user`, `--cap`) go before the id.
    pub fn exec_with(&self, id: &str, flags: &[&str], args: &[&str]) -> Result<Vec<u8>, OciCliError> {
        let mut verb = vec!["exec"];
        verb.extend_from_slice(flags);
        verb.push(id);
        verb.extend_from_slice(args);
        self.run(&verb)
    }

    /// `--version`, first line: whether the binary runs at all.
    pub fn version(&self) -> Result<String, OciCliError> {
        let command = format!("{} --version", self.binary.display());
        let out = Command::new(&self.binary)
            .arg("--version")
            .stdin(Stdio::null())
            .output()
            .map_err(|source| OciCliError::Spawn { command: command.clone(), source })?;
        if !out.status.success() {
            let stderr = tail(&String::from_utf8_lossy(&out.stderr));
            return Err(OciCliError::Failed { command, status: out.status.to_string(), stderr });
        }
        Ok(String::from_utf8_lossy(&out.stdout).lines().next().unwrap_or_default().to_string())
    }
}

/// The last 2 KiB of a runtime's output: enough for its error, bounded.
fn tail(s: &str) -> String {
    let s = s.trim();
    let mut start = s.len().saturating_sub(2048);
    while !s.is_char_boundary(start) {
        start += 1;
    }
    s[start..].to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_binary_is_a_spawn_error_naming_the_command() {
        let cli = OciCli::new("/nonexistent/runc", "/tmp/x", vec!["--debug".into()]);
        let e = cli.state("abc").unwrap_err();
        let msg = e.to_string();
        assert!(msg.contains("/nonexistent/runc --root /tmp/x --debug state abc"), "{msg}");
        assert!(matches!(e, OciCliError::Spawn { .. }));
    }

    #[test]
    fn a_failing_command_carries_its_stderr() {
        // `false`-like: sh exits 3 after writing to stderr, ignoring the flags.
        let dir = std::env::temp_dir().join(format!("ember-oci-cli-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let fake = dir.join("fake-runtime");
        std::fs::write(&fake, "#!/bin/sh\necho \"container not found: $5\" >&2\nexit 3\n").unwrap();
        std::fs::set_permissions(&fake, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
        let e = OciCli::new(&fake, &dir, vec![]).delete("sbx1").unwrap_err();
        match e {
            OciCliError::Failed { stderr, status, .. } => {
                assert!(stderr.contains("container not found"), "{stderr}");
                assert!(status.contains('3'), "{status}");
            }
            other => panic!("expected Failed, got {other:?}"),
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_pid_file_is_read_as_one_positive_pid_or_an_error_naming_it() {
        let dir = std::env::temp_dir().join(format!("ember-oci-pid-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (cli, file) = (OciCli::new("/bin/true", &dir, vec![]), dir.join("init.pid"));
        std::fs::write(&file, "4242").unwrap();
        assert_eq!(cli.read_pid_file(&["run"], &file).unwrap(), 4242);
        for bad in ["", "0", "-1", "12x", &"9".repeat(100)] {
            std::fs::write(&file, bad).unwrap();
            let e = cli.read_pid_file(&["run"], &file).unwrap_err().to_string();
            assert!(e.contains("init.pid") && e.contains("not a pid"), "{bad:?}: {e}");
        }
        // A link in its place is not followed, even to a valid pid.
        let target = dir.join("elsewhere");
        std::fs::write(&target, "4242").unwrap();
        std::fs::write(&file, "").unwrap();
        std::fs::remove_file(&file).unwrap();
        std::os::unix::fs::symlink(&target, &file).unwrap();
        let e = cli.read_pid_file(&["run"], &file).unwrap_err().to_string();
        assert!(e.contains("reading") && e.contains("init.pid"), "{e}");
        std::fs::remove_file(&file).unwrap();
        let e = cli.read_pid_file(&["run"], &file).unwrap_err().to_string();
        assert!(e.contains("reading") && e.contains("init.pid"), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn tail_keeps_the_end_on_a_char_boundary() {
        let s = "é".repeat(2000);
        let t = tail(&s);
        assert!(t.len() <= 2048 && t.chars().all(|c| c == 'é'));
    }
}
