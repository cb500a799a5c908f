//! Lab 6, hard isolation: the same hostile probe against a native sandbox
//! (ember's namespaces + seccomp on the shared host kernel) and a gVisor one
//! (`runsc`: a user-space kernel, the Sentry, between the workload and the
//! host), then the price of each: create, exec, syscall-heavy and file-heavy
//! work, side by side, all through the API.
//!
//! The probe (`PROBE`, python3 from the host template's `/usr`) prints one
//! JSON object: the kernel release and `/proc/version` it sees, what it can
//! read of the kernel's own surface (`/proc/kallsyms` addresses, `/proc/modules`,
//! `dmesg`, `/sys/kernel`), the errno of each privileged syscall it tries
//! (called with zeroed arguments), and its timings.
use super::report::{ms, LabReport, Table};
use super::{svg, Scale};
use crate::bench::stats::Series;
use anyhow::Context;
use ember_client::Client;
use ember_types::api::CreateSandboxRequest;
use ember_types::execd::RunCommandRequest;
use serde::{Deserialize, Serialize};
use std::path::Path;
use std::time::Instant;

const CLASSES: [&str; 2] = ["native", "runsc"];
/// The probe's JSON, read at most this large.
const MAX_PROBE: usize = 64 << 10;

const PROBE: &str = r#"
import ctypes, errno, json, os, time
libc = ctypes.CDLL(None, use_errno=True)
def rd(p, n=4096):
    try:
        with open(p, 'rb') as f: return f.read(n).decode('utf-8', 'replace')
    except OSError as e: return None
calls = {'bpf': 321, 'perf_event_open': 298, 'userfaultfd': 323, 'keyctl': 250, 'add_key': 248,
         'io_uring_setup': 425, 'ptrace': 101, 'mount': 165, 'unshare': 272, 'init_module': 175,
         'kexec_load': 246, 'open_by_handle_at': 304, 'process_vm_readv': 310, 'swapon': 167}
errs = {}
for name, nr in calls.items():
    ctypes.set_errno(0)
    r = libc.syscall(nr, 0, 0, 0, 0, 0, 0)
    errs[name] = 'ok' if r >= 0 else errno.errorcode.get(ctypes.get_errno(), str(ctypes.get_errno()))
def per_call(f, n):
    t = time.perf_counter()
    for _ in range(n): f()
    return (time.perf_counter() - t) / n * 1e6
N = int(os.environ.get('N', '20000'))
fd = os.open('/dev/zero', os.O_RDONLY)
t = time.perf_counter()
for i in range(500):
    p = '/tmp/lab6-%d' % i
    with open(p, 'w') as f: f.write('x')
    os.unlink(p)
files_ms = (time.perf_counter() - t) * 1000
ks = rd('/proc/kallsyms', 1 << 16)
print(json.dumps({
    'release': os.uname().release, 'procVersion': (rd('/proc/version') or '').strip(),
    'kallsymsAddresses': bool(ks) and any(l.split(' ')[0].strip('0') for l in ks.splitlines()[:200]),
    'modules': len((rd('/proc/modules', 1 << 20) or '').splitlines()),
    'dmesg': bool(rd('/dev/kmsg', 256)) if os.path.exists('/dev/kmsg') else False,
    'sysKernel': len(os.listdir('/sys/kernel')) if os.path.isdir('/sys/kernel') else 0,
    'syscalls': errs,
    'getpidUs': per_call(os.getpid, N),
    'deniedUs': per_call(lambda: libc.syscall(250, 0, 0, 0, 0, 0, 0), N),
    'readUs': per_call(lambda: os.read(fd, 1), N),
    'filesMs': files_ms,
}))
"#;

/// What the probe saw in one class.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Probe {
    pub release: String,
    pub proc_version: String,
    pub kallsyms_addresses: bool,
    pub modules: usize,
    pub dmesg: bool,
    pub sys_kernel: usize,
    pub syscalls: std::collections::BTreeMap<String, String>,
    pub getpid_us: f64,
    pub denied_us: f64,
    pub read_us: f64,
    pub files_ms: f64,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ClassRun {
    class: String,
    probe: Probe,
    create: crate::bench::stats::Summary,
    exec: crate::bench::stats::Summary,
}

pub async fn run(client: &Client, scale: Scale, dir: &Path) -> anyhow::Result<LabReport> {
    let (runs, n) = match scale {
        Scale::Small => (3, 5_000),
        Scale::Full => (10, 50_000),
    };
    let host_release = std::fs::read_to_string("/proc/sys/kernel/osrelease").context("the host's kernel release")?;
    let mut results = Vec::new();
    for class in CLASSES {
        eprintln!("  {class}: probe, {runs} creates, {runs} execs");
        results.push(class_run(client, class, runs, n).await.with_context(|| format!("runtime class {class}"))?);
    }
    build(host_release.trim(), &results, scale, dir)
}

async fn class_run(client: &Client, class: &str, runs: usize, n: u32) -> anyhow::Result<ClassRun> {
    let req = CreateSandboxRequest {
        template: Some("host".into()),
        runtime_class: (class != "native").then(|| class.to_string()),
        ..Default::default()
    };
    let (mut create, mut exec) = (Series::default(), Series::default());
    let mut probe = None;
    for i in 0..runs {
        let t = Instant::now();
        let (s, _) = client.create_sandbox(&req).await.context("creating a sandbox")?;
        create.push(t.elapsed());
        let r = async {
            let t = Instant::now();
            sh(client, &s.id, "echo x", "").await?;
            exec.push(t.elapsed());
            if i == 0 {
                let out = sh(client, &s.id, &format!("N={n} python3 -"), PROBE).await?;
                probe =
                    Some(serde_json::from_str::<Probe>(out.trim()).with_context(|| format!("the probe said {out:?}"))?);
            }
            Ok::<_, anyhow::Error>(())
        };
        let r = r.await;
        let _ = client.delete_sandbox(&s.id).await;
        r?;
    }
    Ok(ClassRun {
        class: class.into(),
        probe: probe.unwrap_or_default(),
        create: create.summary(),
        exec: exec.summary(),
    })
}

/// Runs `cmd` with `stdin` fed through a heredoc; its stdout, bounded.
async fn sh(client: &Client, id: &str, cmd: &str, stdin: &str) -> anyhow::Result<String> {
    let script = if stdin.is_empty() { cmd.to_string() } else { format!("{cmd} <<'LAB6_EOF'\n{stdin}\nLAB6_EOF") };
    let req = RunCommandRequest { command: Some(script), ..Default::default() };
    let mut out = String::new();
    let o = client
        .exec(id, &req, |ev| {
            if ev.kind == "stdout" && out.len() < MAX_PROBE {
                out.push_str(ev.text.as_deref().unwrap_or(""));
            }
        })
        .await
        .with_context(|| format!("running {cmd} in sandbox {id}"))?;
    anyhow::ensure!(o.exit_code == Some(0), "{cmd} in sandbox {id} exited {:?} ({:?})", o.exit_code, o.error);
    Ok(out)
}

fn build(host_release: &str, runs: &[ClassRun], scale: Scale, dir: &Path) -> anyhow::Result<LabReport> {
    let mut r = LabReport::new(super::lab(6), scale);
    let cols: Vec<&str> = std::iter::once("").chain(runs.iter().map(|c| c.class.as_str())).collect();
    let mut t = Table::new(&format!("What a hostile workload reaches (host kernel {host_release})"), &cols);
    let row = |name: &str, f: &dyn Fn(&Probe) -> String| {
        std::iter::once(name.to_string()).chain(runs.iter().map(|c| f(&c.probe))).collect::<Vec<_>>()
    };
    t.row(row("kernel release seen", &|p| p.release.clone()));
    t.row(row("/proc/kallsyms addresses", &|p| p.kallsyms_addresses.to_string()));
    t.row(row("/proc/modules entries", &|p| p.modules.to_string()));
    t.row(row("/dev/kmsg readable", &|p| p.dmesg.to_string()));
    t.row(row("/sys/kernel entries", &|p| p.sys_kernel.to_string()));
    t.row(row("privileged syscalls answered without a refusal", &|p| {
        let n = p.syscalls.values().filter(|e| !matches!(e.as_str(), "EPERM" | "ENOSYS")).count();
        format!("{n} of {}", p.syscalls.len())
    }));
    let names: Vec<String> = runs.first().map(|c| c.probe.syscalls.keys().cloned().collect()).unwrap_or_default();
    for name in &names {
        t.row(row(&format!("{name}()"), &|p| p.syscalls.get(name).cloned().unwrap_or_default()));
    }
    r.tables.push(t);
    let mut t = Table::new("The price", &cols);
    let mut push = |name: &str, f: &dyn Fn(&ClassRun) -> String| {
        t.row(std::iter::once(name.to_string()).chain(runs.iter().map(f)).collect());
    };
    push("create p50 ms (client)", &|c| ms(c.create.p50_ms));
    push("exec `echo x` p50 ms", &|c| ms(c.exec.p50_ms));
    push("getpid() µs", &|c| format!("{:.2}", c.probe.getpid_us));
    push("a denied syscall (keyctl) µs", &|c| format!("{:.2}", c.probe.denied_us));
    push("read(/dev/zero, 1 byte) µs", &|c| format!("{:.2}", c.probe.read_us));
    push("500 files written + unlinked ms", &|c| format!("{:.1}", c.probe.files_ms));
    r.tables.push(t);
    checks(&mut r, host_release, runs);
    let bars: Vec<(String, f64)> = runs.iter().map(|c| (c.class.clone(), c.probe.read_us)).collect();
    r.chart(dir, "syscall-cost.svg", svg::bars("read(1 byte) per call", "µs", &bars))?;
    let bars: Vec<(String, f64)> = runs.iter().map(|c| (c.class.clone(), c.create.p50_ms.unwrap_or(0.0))).collect();
    r.chart(dir, "create.svg", svg::bars("Create p50", "ms", &bars))?;
    r.data = serde_json::json!({ "hostRelease": host_release, "classes": runs });
    Ok(r)
}

fn checks(r: &mut LabReport, host_release: &str, runs: &[ClassRun]) {
    let by = |class: &str| runs.iter().find(|c| c.class == class);
    let (native, runsc) = (by("native"), by("runsc"));
    let native_rel = native.map(|c| c.probe.release.as_str()).unwrap_or("");
    r.check("a native sandbox shares the host's kernel", native_rel == host_release, format!("sees {native_rel:?}"));
    let g = runsc.map(|c| c.probe.release.as_str()).unwrap_or("");
    r.check(
        "a gVisor sandbox talks to gVisor's kernel, not the host's",
        !g.is_empty() && g != host_release && runsc.is_some_and(|c| !c.probe.proc_version.contains(host_release)),
        format!("sees {g:?}"),
    );
    let measured = runs.iter().all(|c| c.create.samples > 0 && c.exec.samples > 0 && c.probe.read_us > 0.0);
    r.check("both classes were measured", measured && runs.len() == 2, format!("{} classes", runs.len()));
}
