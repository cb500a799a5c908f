//! The agent's configuration: parsed once at start from the command line and
//! the environment, validated, then frozen and shared read-only.
use std::ffi::OsString;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

/// Where the HTTP server listens.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ListenAddr {
    /// An already-bound, listening unix socket inherited from the runtime.
    Fd(i32),
    Unix(PathBuf),
    Tcp(SocketAddr),
}

/// The uid/gid commands run as unless a request overrides it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Identity {
    pub uid: u32,
    /// `None`: the user's primary group from /etc/passwd, else the uid.
    pub gid: Option<u32>,
}

#[derive(Clone, Debug)]
pub struct AgentConfig {
    pub listen: ListenAddr,
    /// PID 1 of a pid namespace: reaps everything and may signal everyone.
    pub is_pid1: bool,
    /// `None`: run commands as the agent's own identity, without switching.
    pub default_identity: Option<Identity>,
    /// argv started at boot; its exit ends the agent.
    pub entrypoint: Option<Vec<String>>,
    /// `EMBER_AGENT_AWAIT_SECRETS=1`: the boot entrypoint starts once the
    /// daemon has delivered the sandbox's secrets (`POST /ember/v1/secrets`).
    pub await_secrets: bool,
    pub memory_limit_bytes: Option<u64>,
    pub cpu_millis: Option<u64>,
    /// Pause between a command's final event and the end of its stream.
    pub grace: Duration,
    /// The sandbox's environment: the agent's own minus `EMBER_AGENT_*`.
    pub base_env: Vec<(OsString, OsString)>,
    /// `EXECD_ENVS`: a KEY=VALUE file merged into every command's env.
    pub execd_envs: Option<PathBuf>,
    /// `EMBER_AGENT_WORKDIR`: default cwd of commands (an image's WorkingDir).
    pub workdir: Option<PathBuf>,
    /// What a warm-pool claim bound (env, user, entrypoint); shared and mutable.
    pub binding: std::sync::Arc<crate::claim::Binding>,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ConfigError {
    #[error("usage: ember-agent [--listen unix:/path | --listen tcp:ADDR:PORT] (or EMBER_AGENT_LISTEN_FD)")]
    Usage,
    #[error("bad --listen value {0:?}: expected unix:/path or tcp:ADDR:PORT")]
    Listen(String),
    #[error("bad value of {name}: {value:?}")]
    Var { name: &'static str, value: String },
}

const CONTROL_PREFIX: &str = "EMBER_AGENT_";

impl AgentConfig {
    /// Builds the configuration from arguments (without argv\[0\]) and the
    /// environment. `pid` is this process's pid (PID 1 duties depend on it).
    pub fn from_parts(
        args: impl IntoIterator<Item = String>,
        env: impl IntoIterator<Item = (OsString, OsString)>,
        pid: u32,
    ) -> Result<AgentConfig, ConfigError> {
        let env: Vec<(OsString, OsString)> = env.into_iter().collect();
        let var = |name: &str| -> Option<String> {
            env.iter().find(|(k, _)| k == name).map(|(_, v)| v.to_string_lossy().into_owned())
        };
        let is_pid1 = pid == 1;
        let listen = match var("EMBER_AGENT_LISTEN_FD") {
            Some(fd) => ListenAddr::Fd(parse_var("EMBER_AGENT_LISTEN_FD", &fd)?),
            None => parse_listen_arg(args)?,
        };
        let uid = var("EMBER_AGENT_UID").map(|v| parse_var("EMBER_AGENT_UID", &v)).transpose()?;
        let gid = var("EMBER_AGENT_GID").map(|v| parse_var("EMBER_AGENT_GID", &v)).transpose()?;
        let default_identity = match (uid, gid) {
            (Some(uid), gid) => Some(Identity { uid, gid }),
            (None, Some(_)) => {
                return Err(ConfigError::Var { name: "EMBER_AGENT_GID", value: "set without EMBER_AGENT_UID".into() })
            }
            // A sandbox never runs commands as its (namespaced) root by default.
            (None, None) if is_pid1 => Some(Identity { uid: 1000, gid: Some(1000) }),
            (None, None) => None,
        };
        let entrypoint = match var("EMBER_AGENT_ENTRYPOINT") {
            Some(v) => Some(parse_entrypoint(&v)?),
            None => None,
        };
        let await_secrets = var("EMBER_AGENT_AWAIT_SECRETS").is_some_and(|v| v == "1");
        let opt_u64 = |name: &'static str| var(name).map(|v| parse_var::<u64>(name, &v)).transpose();
        let memory_limit_bytes = opt_u64("EMBER_AGENT_MEMORY_LIMIT_BYTES")?.filter(|b| *b > 0);
        let cpu_millis = opt_u64("EMBER_AGENT_CPU_MILLIS")?.filter(|m| *m > 0);
        let grace = Duration::from_millis(opt_u64("EMBER_AGENT_GRACE_MS")?.unwrap_or(0));
        let execd_envs = var("EXECD_ENVS").filter(|p| !p.is_empty()).map(PathBuf::from);
        let workdir = var("EMBER_AGENT_WORKDIR").filter(|w| !w.is_empty()).map(PathBuf::from);
        let base_env = env.into_iter().filter(|(k, _)| !k.to_string_lossy().starts_with(CONTROL_PREFIX)).collect();
        Ok(AgentConfig {
            listen,
            is_pid1,
            default_identity,
            entrypoint,
            await_secrets,
            memory_limit_bytes,
            cpu_millis,
            grace,
            base_env,
            execd_envs,
            workdir,
            binding: Default::default(),
        })
    }

    /// A value of the sandbox environment.
    pub fn env_var(&self, name: &str) -> Option<String> {
        self.base_env.iter().find(|(k, _)| k == name).map(|(_, v)| v.to_string_lossy().into_owned())
    }
}

fn parse_var<T: std::str::FromStr>(name: &'static str, value: &str) -> Result<T, ConfigError> {
    value.trim().parse().map_err(|_| ConfigError::Var { name, value: value.to_string() })
}

fn parse_entrypoint(value: &str) -> Result<Vec<String>, ConfigError> {
    let bad = || ConfigError::Var { name: "EMBER_AGENT_ENTRYPOINT", value: value.to_string() };
    let argv: Vec<String> = serde_json::from_str(value).map_err(|_| bad())?;
    if argv.is_empty() || argv[0].is_empty() {
        return Err(bad());
    }
    Ok(argv)
}

fn parse_listen_arg(args: impl IntoIterator<Item = String>) -> Result<ListenAddr, ConfigError> {
    let mut args = args.into_iter();
    let mut listen = None;
    while let Some(arg) = args.next() {
        let value = match arg.strip_prefix("--listen=") {
            Some(v) => v.to_string(),
            None if arg == "--listen" => args.next().ok_or(ConfigError::Usage)?,
            None => return Err(ConfigError::Usage),
        };
        listen = Some(parse_listen(&value)?);
    }
    listen.ok_or(ConfigError::Usage)
}

fn parse_listen(value: &str) -> Result<ListenAddr, ConfigError> {
    if let Some(path) = value.strip_prefix("unix:") {
        if !path.is_empty() {
            return Ok(ListenAddr::Unix(PathBuf::from(path)));
        }
    } else if let Some(addr) = value.strip_prefix("tcp:") {
        // Parsed, never resolved: the static binary must not touch NSS.
        if let Ok(addr) = addr.parse() {
            return Ok(ListenAddr::Tcp(addr));
        }
    }
    Err(ConfigError::Listen(value.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> Vec<(OsString, OsString)> {
        pairs.iter().map(|(k, v)| (OsString::from(k), OsString::from(v))).collect()
    }

    fn args(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn listen_fd_wins_and_control_vars_are_stripped() {
        let c = AgentConfig::from_parts(
            args(&[]),
            env(&[("EMBER_AGENT_LISTEN_FD", "3"), ("EMBER_AGENT_UID", "7"), ("FOO", "bar")]),
            1,
        )
        .unwrap();
        assert_eq!(c.listen, ListenAddr::Fd(3));
        assert_eq!(c.default_identity, Some(Identity { uid: 7, gid: None }));
        assert_eq!(c.base_env, env(&[("FOO", "bar")]));
    }

    #[test]
    fn pid1_defaults_to_1000_and_host_to_own_identity() {
        let a = args(&["--listen", "tcp:127.0.0.1:0"]);
        let c = AgentConfig::from_parts(a.clone(), env(&[]), 1).unwrap();
        assert_eq!(c.default_identity, Some(Identity { uid: 1000, gid: Some(1000) }));
        assert!(c.is_pid1);
        let c = AgentConfig::from_parts(a, env(&[]), 42).unwrap();
        assert_eq!(c.default_identity, None);
        assert_eq!(c.grace, Duration::ZERO);
    }

    #[test]
    fn listen_forms() {
        let p = |s: &str| parse_listen_arg(args(&["--listen", s]));
        assert_eq!(p("unix:/run/a.sock"), Ok(ListenAddr::Unix("/run/a.sock".into())));
        assert_eq!(p("tcp:127.0.0.1:80"), Ok(ListenAddr::Tcp("127.0.0.1:80".parse().unwrap())));
        assert!(p("tcp:localhost:80").is_err());
        assert!(p("udp:x").is_err());
        assert_eq!(parse_listen_arg(args(&[])), Err(ConfigError::Usage));
        assert_eq!(parse_listen_arg(args(&["--bogus"])), Err(ConfigError::Usage));
    }

    #[test]
    fn bad_values_are_reported() {
        let a = args(&["--listen=tcp:127.0.0.1:0"]);
        let bad = |k: &str, v: &str| AgentConfig::from_parts(a.clone(), env(&[(k, v)]), 5).is_err();
        assert!(bad("EMBER_AGENT_UID", "x"));
        assert!(bad("EMBER_AGENT_GID", "5"));
        assert!(bad("EMBER_AGENT_ENTRYPOINT", "[]"));
        assert!(bad("EMBER_AGENT_ENTRYPOINT", "sleep 1"));
        let c = AgentConfig::from_parts(a, env(&[("EMBER_AGENT_ENTRYPOINT", r#"["sleep","1"]"#)]), 5).unwrap();
        assert_eq!(c.entrypoint, Some(vec!["sleep".to_string(), "1".to_string()]));
    }
}
