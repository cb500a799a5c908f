//! Turning a `RunCommandRequest` into a running process: identity,
//! environment, working directory, program, and the spawn itself.
use crate::config::AgentConfig;
use crate::error::{ApiError, ApiResult};
use crate::reaper::Reaper;
use crate::users::{User, UserDb};
use crate::{envfile, paths};
use ember_sys::process::{self as sys, Credentials, ExitKind};
use ember_sys::vspawn;
use ember_types::execd::RunCommandRequest;
use std::collections::BTreeMap;
use std::ffi::OsString;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use tokio::net::unix::pipe;
use tokio::sync::oneshot;

const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// Everything needed to start one command.
#[derive(Debug)]
pub struct Plan {
    pub program: PathBuf,
    pub args: Vec<String>,
    pub env: BTreeMap<OsString, OsString>,
    pub cwd: PathBuf,
    /// `None`: keep the agent's own identity.
    pub creds: Option<Credentials>,
}

impl Plan {
    /// The plan as a `Command`: program, arguments, exactly the plan's
    /// environment, then its identity and working directory. `setup` comes
    /// first (stdio, a controlling terminal): the hooks it adds run before
    /// the identity switch, as the agent.
    pub fn command(&self, setup: impl FnOnce(&mut Command)) -> Command {
        let mut cmd = Command::new(&self.program);
        cmd.args(&self.args).env_clear().envs(&self.env);
        setup(&mut cmd);
        match &self.creds {
            Some(creds) => sys::set_credentials(&mut cmd, creds.clone(), self.cwd.clone()),
            None => {
                cmd.current_dir(&self.cwd);
            }
        }
        cmd
    }

    /// The plan as [`vspawn::Exec`]: started without a copy of the agent.
    fn exec(&self) -> std::io::Result<vspawn::Exec> {
        let env = self.env.iter().map(|(k, v)| (k.as_os_str(), v.as_os_str()));
        vspawn::Exec::new(&self.program, &self.args, env, &self.cwd, self.creds.clone(), DEFAULT_PATH)
    }
}

/// A started command on pipes, leading its own process group.
pub struct Spawned {
    pub pid: i32,
    /// Only when asked for ([`spawn`]); else stdin is /dev/null.
    pub stdin: Option<pipe::Sender>,
    pub stdout: pipe::Receiver,
    pub stderr: pipe::Receiver,
    pub exit: oneshot::Receiver<ExitKind>,
}

/// Checks made before any stream starts; failures are JSON 400s.
pub fn validate(req: &RunCommandRequest) -> ApiResult<()> {
    match (&req.command, &req.argv) {
        (Some(_), Some(_)) => return Err(ApiError::bad_request("exactly one of command and argv is allowed")),
        (None, None) => return Err(ApiError::bad_request("one of command and argv is required")),
        (Some(c), None) if c.trim().is_empty() => return Err(ApiError::bad_request("command is empty")),
        (None, Some(a)) if a.first().is_none_or(|p| p.is_empty()) => {
            return Err(ApiError::bad_request("argv must start with a program"))
        }
        _ => {}
    }
    if req.gid.is_some() && req.uid.is_none() {
        return Err(ApiError::bad_request("gid requires uid"));
    }
    Ok(())
}

/// What the status endpoint shows as the command's `content`.
pub fn content(req: &RunCommandRequest) -> String {
    match (&req.command, &req.argv) {
        (Some(c), _) => c.clone(),
        (None, Some(argv)) => argv.join(" "),
        (None, None) => String::new(),
    }
}

/// Resolves a validated request into a plan. An `Err` is a start failure,
/// reported to the client inside the stream (`init` then `error`).
pub fn plan(config: &AgentConfig, req: &RunCommandRequest) -> Result<Plan, String> {
    let db = UserDb::load();
    let (uid, gid) = identity(config, req, &db);
    let user = db.user_by_uid(uid);
    let switch = (uid, gid) != (sys::getuid(), sys::getgid());
    let env = command_env(config, user, switch, req);
    let var = |k: &str| env.get(&OsString::from(k)).map(|v| v.to_string_lossy().into_owned());
    let home = PathBuf::from(var("HOME").unwrap_or_else(|| "/".to_string()));
    let cwd = match req.cwd.as_deref().filter(|c| !c.is_empty()) {
        Some(c) => {
            let cwd = paths::expand(c, var, &home).map_err(|e| format!("resolve cwd {c}: {e}"))?;
            if !cwd.is_dir() {
                return Err(format!("chdir {}: no such directory", cwd.display()));
            }
            cwd
        }
        None => match &config.workdir {
            Some(w) if w.is_dir() => w.clone(),
            _ if home.is_dir() => home,
            _ => PathBuf::from("/"),
        },
    };
    let (program, args) = match (&req.command, &req.argv) {
        (Some(command), _) => {
            let shell = find_shell(&var("PATH").unwrap_or_else(|| DEFAULT_PATH.to_string()))
                .ok_or_else(|| "no shell to run the command: neither bash nor sh is in PATH".to_string())?;
            (shell, vec!["-c".to_string(), command.clone()])
        }
        (None, Some(argv)) => (PathBuf::from(&argv[0]), argv[1..].to_vec()),
        (None, None) => return Err("nothing to run".to_string()),
    };
    let creds = switch.then(|| Credentials { uid, gid, groups: db.groups_of(user, gid) });
    Ok(Plan { program, args, env, cwd, creds })
}

/// A shell for an interactive session (`/pty`): `shell -c command`, or the
/// shell alone (interactive on a terminal) without a command. Identity,
/// environment and working directory are resolved as for any command.
pub fn shell_plan(config: &AgentConfig, cwd: Option<&str>, command: Option<&str>) -> Result<Plan, String> {
    let req = RunCommandRequest {
        command: Some(command.unwrap_or(":").to_string()),
        cwd: cwd.map(str::to_string),
        ..Default::default()
    };
    let mut plan = plan(config, &req)?;
    if command.is_none() {
        plan.args.clear();
    }
    Ok(plan)
}

/// The uid/gid to run as: the request's, else the agent's default, else the
/// agent's own. A missing gid is the user's primary group, else the uid.
fn identity(config: &AgentConfig, req: &RunCommandRequest, db: &UserDb) -> (u32, u32) {
    let bound = config.binding.bound().identity;
    let (uid, gid) = match (req.uid, bound.or(config.default_identity)) {
        (Some(uid), _) => (uid, req.gid),
        (None, Some(d)) => (d.uid, d.gid),
        (None, None) => return (sys::getuid(), sys::getgid()),
    };
    (uid, gid.or_else(|| db.user_by_uid(uid).map(|u| u.gid)).unwrap_or(uid))
}

/// The sandbox env, then the user's identity vars, a default PATH, the
/// `EXECD_ENVS` file and the request's envs, each overriding the previous.
fn command_env(
    config: &AgentConfig,
    user: Option<&User>,
    switched: bool,
    req: &RunCommandRequest,
) -> BTreeMap<OsString, OsString> {
    let mut env: BTreeMap<OsString, OsString> = config.base_env.iter().cloned().collect();
    // Claim-time env overrides the sandbox's boot env.
    for (k, v) in config.binding.bound().env {
        env.insert(k.into(), v.into());
    }
    let mut set = |k: &str, v: OsString| env.insert(OsString::from(k), v);
    match user {
        Some(u) => {
            set("HOME", u.home.clone().into_os_string());
            set("USER", u.name.clone().into());
            set("LOGNAME", u.name.clone().into());
        }
        None if switched => {
            set("HOME", "/".into());
            env.remove(&OsString::from("USER"));
            env.remove(&OsString::from("LOGNAME"));
        }
        None => {}
    }
    env.entry("PATH".into()).or_insert_with(|| DEFAULT_PATH.into());
    if let Some(file) = &config.execd_envs {
        for (k, v) in envfile::read(file, |n| config.env_var(n)) {
            env.insert(k.into(), v.into());
        }
    }
    for (k, v) in req.envs.iter().flatten() {
        env.insert(k.into(), v.into());
    }
    env
}

fn find_shell(path: &str) -> Option<PathBuf> {
    ["bash", "sh"].iter().find_map(|name| {
        path.split(':')
            .filter(|d| !d.is_empty())
            .map(|d| Path::new(d).join(name))
            .find(|p| p.metadata().is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0))
    })
}

/// Starts the plan in a new process group, stdout and stderr on pipes, stdin
/// on a pipe if `stdin` (else /dev/null). The group is killed if its pipes
/// cannot be watched. `clone(CLONE_VM | CLONE_VFORK)` ([`vspawn`]), not
/// `fork`: a fork copied the agent's page tables for every command.
pub fn spawn(reaper: &Reaper, plan: &Plan, stdin: bool) -> Result<Spawned, String> {
    let failed = |e: std::io::Error| format!("fork/exec {}: {e}", plan.program.display());
    let exec = plan.exec().map_err(failed)?;
    let pipe = || std::io::pipe().map(|(r, w)| (OwnedFd::from(r), OwnedFd::from(w))).map_err(|e| format!("pipe: {e}"));
    let (input, input_w) = match stdin {
        true => pipe().map(|(r, w)| (r, Some(w)))?,
        false => (std::fs::File::open("/dev/null").map_err(|e| format!("open /dev/null: {e}"))?.into(), None),
    };
    let (out_r, out_w) = pipe()?;
    let (err_r, err_w) = pipe()?;
    let stdio = vspawn::Stdio { stdin: input.as_raw_fd(), stdout: out_w.as_raw_fd(), stderr: err_w.as_raw_fd() };
    let (pid, exit) = reaper.spawn_with(|| exec.spawn(stdio)).map_err(failed)?;
    // The child's ends close here: reading stdout ends when the command's do.
    drop((input, out_w, err_w));
    let ends = (|| {
        let input = input_w.map(pipe::Sender::from_owned_fd).transpose()?;
        Ok::<_, std::io::Error>((input, pipe::Receiver::from_owned_fd(out_r)?, pipe::Receiver::from_owned_fd(err_r)?))
    })();
    match ends {
        Ok((stdin, stdout, stderr)) => Ok(Spawned { pid, stdin, stdout, stderr, exit }),
        Err(e) => {
            reaper.signal_group(pid, sys::SIGKILL);
            Err(format!("cannot watch the command's pipes: {e}"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(json: &str) -> RunCommandRequest {
        serde_json::from_str(json).unwrap()
    }

    #[test]
    fn validation() {
        assert!(validate(&req(r#"{"command":"true"}"#)).is_ok());
        assert!(validate(&req(r#"{"argv":["true"]}"#)).is_ok());
        assert!(validate(&req(r#"{"command":"true","argv":["x"]}"#)).is_err());
        assert!(validate(&req(r#"{}"#)).is_err());
        assert!(validate(&req(r#"{"argv":[]}"#)).is_err());
        assert!(validate(&req(r#"{"command":"true","gid":5}"#)).is_err());
    }

    #[test]
    fn shells_are_found_on_path() {
        let sh = find_shell("/nonexistent:/bin:/usr/bin").unwrap();
        assert!(sh.ends_with("bash") || sh.ends_with("sh"));
        assert_eq!(find_shell("/nonexistent"), None);
    }
}
