//! Lab 1, single shared process: three agent tasks (research, coder, hog).
//! Before: threads of one worker process (`shared_baseline.rs`); the hog's
//! OOM ends the process and both neighbours, and the coder's payload reads the
//! secrets the worker holds (its environment, a mounted key file). After: the
//! same three in ember sandboxes (`shared_ember.rs`); the OOM ends the hog's
//! sandbox only, with the reason, and the payload finds neither secret.
use super::report::{LabReport, Table};
use super::{shared_baseline, shared_ember, svg, Scale};
use anyhow::Context;
use std::path::{Path, PathBuf};

/// The environment variable the worker's credential is planted in.
pub const ENV_NAME: &str = "LAB_API_KEY";
/// The payload's output read back, at most.
pub const PAYLOAD_CAP: u64 = 64 << 10;

/// Two different random values, so a leak says where it came from: one in the
/// worker's environment, one in a key file beside it.
pub struct Secrets {
    pub env: String,
    pub file_value: String,
    pub file: PathBuf,
}

impl Secrets {
    fn plant(dir: &Path) -> anyhow::Result<Secrets> {
        let mut rng = fastrand::Rng::new();
        let mut hex = || format!("{:016x}{:016x}", rng.u64(..), rng.u64(..));
        let s = Secrets {
            env: format!("sk-env-{}", hex()),
            file_value: format!("sk-file-{}", hex()),
            file: dir.join("secrets/api-key"),
        };
        let parent = dir.join("secrets");
        std::fs::create_dir_all(&parent).with_context(|| format!("creating {}", parent.display()))?;
        std::fs::write(&s.file, &s.file_value).with_context(|| format!("writing {}", s.file.display()))?;
        std::fs::set_permissions(&s.file, std::os::unix::fs::PermissionsExt::from_mode(0o600))
            .with_context(|| format!("chmod {}", s.file.display()))?;
        Ok(s)
    }

    /// What model-written code hunting for credentials runs, on both sides:
    /// every visible process's environment, and the key file's path.
    pub fn payload(&self) -> String {
        let path = self.file.display().to_string().replace('\'', "");
        format!(
            "for f in /proc/[0-9]*/environ; do tr '\\0' '\\n' < \"$f\"; done 2>/dev/null \
             | grep -E '^[A-Z_]*(KEY|TOKEN|SECRET)[A-Z_]*=' | sort -u; cat '{path}' 2>/dev/null; echo; echo payload-end"
        )
    }

    /// (environment secret seen, file secret seen) in a payload's output.
    pub fn leaked(&self, out: &[u8]) -> (bool, bool) {
        let s = String::from_utf8_lossy(out);
        (s.contains(&self.env), s.contains(&self.file_value))
    }
}

/// One well-behaved task's progress.
#[derive(Debug, Clone, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TaskOutcome {
    pub name: String,
    pub steps: u32,
    pub steps_done: u32,
    pub finished: bool,
}

impl TaskOutcome {
    pub fn new(name: &str, steps: u32) -> TaskOutcome {
        TaskOutcome { name: name.into(), steps, steps_done: 0, finished: false }
    }
}

pub async fn run(client: &ember_client::Client, scale: Scale, dir: &Path) -> anyhow::Result<LabReport> {
    let (steps, limit_mib) = match scale {
        Scale::Small => (30, 64),
        Scale::Full => (100, 256),
    };
    let secrets = Secrets::plant(dir)?;
    eprintln!("  before: three tasks in one worker process (cgroup memory limit {limit_mib} MiB)");
    let d = dir.to_path_buf();
    let base = tokio::task::spawn_blocking(move || {
        let r = shared_baseline::run(&d, &secrets, steps, limit_mib);
        (r, secrets)
    });
    let (base, secrets) = base.await.context("the baseline's thread")?;
    let base = base?;
    eprintln!("  after: the same three in ember sandboxes ({limit_mib} MiB each)");
    let after = shared_ember::run(client, &secrets, steps, limit_mib, dir).await?;
    let _ = std::fs::remove_dir_all(dir.join("secrets"));
    build(&base, &after, &secrets, scale, dir, limit_mib)
}

fn yes(b: bool) -> String {
    (if b { "yes" } else { "no" }).into()
}

fn build(
    base: &shared_baseline::Baseline,
    after: &shared_ember::Sandboxed,
    secrets: &Secrets,
    scale: Scale,
    dir: &Path,
    limit_mib: u64,
) -> anyhow::Result<LabReport> {
    let mut r = LabReport::new(super::lab(1), scale);
    tables(&mut r, base, after, secrets);
    let (benv, bfile) = secrets.leaked(&base.payload);
    let (aenv, afile) = secrets.leaked(&after.payload);
    let shared_survivors = base.tasks.iter().filter(|t| t.finished).count();
    let ember_survivors = after.tasks.iter().filter(|t| t.finished).count();
    r.check(
        "the OOM took the shared process",
        base.signal == Some(9) && !base.hog_capped && base.oom_kills.is_none_or(|k| k > 0),
        format!(
            "worker {}, cgroup OOM kills {:?}, hog reached {} MiB of a {limit_mib} MiB limit",
            base.ended, base.oom_kills, base.hog_mib
        ),
    );
    r.check("the other two tasks died with it", shared_survivors == 0, format!("{shared_survivors} of 2 finished"));
    r.check(
        "in ember the OOM ended only its own sandbox, with the reason",
        after.hog_reason.as_deref() == Some("OOMKilled") && after.neighbours_running,
        format!("hog sandbox {}; neighbours running: {}", after.hog_state, after.neighbours_running),
    );
    r.check("in ember the other two finished", ember_survivors == 2, format!("{ember_survivors} of 2 finished"));
    r.check("the payload read both secrets in the shared process", benv && bfile, format!("env {benv}, file {bfile}"));
    r.check("the payload read no secret in the sandbox", !aenv && !afile, format!("env {aenv}, file {afile}"));
    let bars = vec![
        ("shared process".to_string(), shared_survivors as f64),
        ("ember sandboxes".to_string(), ember_survivors as f64),
    ];
    r.chart(dir, "survivors.svg", svg::bars("Neighbours that finished after the hog's OOM (of 2)", "tasks", &bars))?;
    let leaks = vec![
        ("shared process".to_string(), f64::from(u8::from(benv) + u8::from(bfile))),
        ("ember sandbox".to_string(), f64::from(u8::from(aenv) + u8::from(afile))),
    ];
    r.chart(dir, "secrets.svg", svg::bars("Secrets the payload read (of 2)", "secrets", &leaks))?;
    r.data = serde_json::json!({
        "limitMib": limit_mib,
        "shared": { "ended": base.ended, "signal": base.signal, "oomKills": base.oom_kills, "hogMib": base.hog_mib,
                    "hogCapped": base.hog_capped, "tasks": base.tasks, "leakedEnv": benv, "leakedFile": bfile },
        "ember": { "hogState": after.hog_state, "hogReason": after.hog_reason, "neighboursRunning": after.neighbours_running,
                   "tasks": after.tasks, "leakedEnv": aenv, "leakedFile": afile },
    });
    Ok(r)
}

/// The before/after tables: who survived the OOM, what the payload read.
fn tables(r: &mut LabReport, base: &shared_baseline::Baseline, after: &shared_ember::Sandboxed, secrets: &Secrets) {
    let mut t = Table::new("Who survives the hog's OOM", &["task", "shared process", "ember sandboxes"]);
    for (b, a) in base.tasks.iter().zip(&after.tasks) {
        let cell = |o: &TaskOutcome| {
            format!("{}/{} steps{}", o.steps_done, o.steps, if o.finished { ", finished" } else { ", killed" })
        };
        t.row(vec![b.name.clone(), cell(b), cell(a)]);
    }
    t.row(vec!["hog".into(), format!("{} ({} MiB allocated)", base.ended, base.hog_mib), after.hog_state.clone()]);
    r.tables.push(t);
    let (benv, bfile) = secrets.leaked(&base.payload);
    let (aenv, afile) = secrets.leaked(&after.payload);
    let mut t = Table::new("What the coder's payload read", &["secret", "shared process", "ember sandbox"]);
    t.row(vec![format!("${ENV_NAME} (the worker's environment)"), yes(benv), yes(aenv)]);
    t.row(vec![format!("{} (a key file)", secrets.file.display()), yes(bfile), yes(afile)]);
    r.tables.push(t);
}
