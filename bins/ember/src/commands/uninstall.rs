//! `ember uninstall`: removes what `ember serve` left on the host, once no
//! daemon runs on the data dir (its lock is taken first, so a live daemon is
//! refused). Sandboxes keep running after their daemon ends by design
//! (docs/operations.md); this ends them: OCI containers deleted through their
//! runtime, every process of the daemon's cgroups killed and the groups
//! removed, every mount under the data dir (writable layers, OCI rootfs
//! overlays, workspace images, runsc slots) detached, the egress network's nft
//! table, network namespaces and resolver address on `lo` removed, and the data
//! dir deleted unless `--keep-data`. IPv4 forwarding is left on: ember cannot
//! know whether something else needs it. Then it looks again and lists what
//! is left (exit 1 if anything is).
use anyhow::Context;
use ember_runtime::oci::OciClass;
use std::path::{Path, PathBuf};
use std::process::Command;

#[derive(clap::Args)]
pub struct UninstallArgs {
    /// The daemon's data dir, as given to `ember serve`.
    #[arg(long, env = "EMBER_DATA_DIR", default_value = "/var/lib/ember")]
    pub data_dir: PathBuf,
    /// The daemon's cgroup parent, as given to `ember serve` (the OCI classes
    /// use `<parent>-crun`, `-runc`, `-runsc`).
    #[arg(long, default_value = "ember")]
    pub cgroup_parent: String,
    /// The egress network's tag, as given to `ember serve`: nft table
    /// `inet <tag>`, namespaces `/run/netns/<tag>-<N>`.
    #[arg(long, default_value = "ember")]
    pub network_tag: String,
    /// The egress network's range, as given to `ember serve`: its resolver
    /// address is removed from `lo`.
    #[arg(long, default_value = "10.203.0.0/16")]
    pub network_range: String,
    /// Keep the data dir's files (images, workspaces, snapshots, records);
    /// only what runs or is mounted is removed.
    #[arg(long)]
    pub keep_data: bool,
}

pub fn run(a: UninstallArgs) -> anyhow::Result<i32> {
    let _lock = if a.data_dir.exists() {
        Some(crate::datadir::lock(&a.data_dir).context("ember uninstall needs the daemon stopped")?)
    } else {
        None
    };
    for class in OciClass::ALL {
        delete_containers(&a.data_dir, class.name());
    }
    for group in groups(&a.cgroup_parent) {
        remove_cgroups(&group);
    }
    for m in mounts_under(&a.data_dir) {
        // Lazily: a mount a dying process still holds goes once it lets go.
        match Command::new("umount").arg("-l").arg(&m).output() {
            Ok(o) if o.status.success() => println!("unmounted {}", m.display()),
            Ok(o) => {
                eprintln!("ember uninstall: umount {}: {}", m.display(), String::from_utf8_lossy(&o.stderr).trim())
            }
            Err(e) => eprintln!("ember uninstall: umount {}: {e}", m.display()),
        }
    }
    remove_network(&a.network_tag, &a.network_range);
    if !a.keep_data && a.data_dir.exists() {
        std::fs::remove_dir_all(&a.data_dir).with_context(|| format!("removing {}", a.data_dir.display()))?;
        println!("removed {}", a.data_dir.display());
    }
    let left = leftovers(&a);
    for l in &left {
        eprintln!("ember uninstall: still there: {l}");
    }
    Ok(if left.is_empty() { 0 } else { 1 })
}

/// `<parent>` and each OCI class's `<parent>-<class>`.
fn groups(parent: &str) -> Vec<String> {
    let mut g = vec![parent.to_string()];
    g.extend(OciClass::ALL.iter().map(|c| format!("{parent}-{}", c.name())));
    g
}

/// Deletes every container of one OCI class through its runtime (its
/// processes, and for runsc its sandbox and gofer, which live outside the
/// class's cgroups until they join them).
fn delete_containers(data_dir: &Path, class: &str) {
    let base = data_dir.join("oci").join(class);
    for e in std::fs::read_dir(base.join("sandboxes")).into_iter().flatten().flatten() {
        let id = e.file_name();
        let out =
            Command::new(class).arg("--root").arg(base.join("state")).arg("delete").arg("--force").arg(&id).output();
        if out.is_ok_and(|o| o.status.success()) {
            println!("deleted {class} container {}", id.to_string_lossy());
        }
    }
}

/// Kills and removes every cgroup under `group`, then the group itself (in
/// every v1 hierarchy it was made in, the ones the OCI runtimes add included).
fn remove_cgroups(group: &str) {
    if let Ok(cg) = ember_cgroups::detect("/sys/fs/cgroup".as_ref(), group) {
        for name in cg.list().unwrap_or_default() {
            match cg.destroy(&name) {
                Ok(()) => println!("killed and removed cgroup {group}/{name}"),
                Err(e) => eprintln!("ember uninstall: cgroup {group}/{name}: {e}"),
            }
        }
        let _ = cg.remove_group();
    }
    for dir in cgroup_dirs(group) {
        for sub in std::fs::read_dir(&dir).into_iter().flatten().flatten().filter(|e| e.path().is_dir()) {
            let _ = std::fs::remove_dir(sub.path());
        }
        let _ = std::fs::remove_dir(&dir);
    }
}

/// `group`'s directories under /sys/fs/cgroup (v2: one; v1: one per hierarchy).
fn cgroup_dirs(group: &str) -> Vec<PathBuf> {
    let root = Path::new("/sys/fs/cgroup");
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(root)
        .into_iter()
        .flatten()
        .flatten()
        .map(|h| h.path().join(group))
        .filter(|p| p.is_dir())
        .collect();
    if root.join(group).is_dir() {
        dirs.push(root.join(group));
    }
    dirs
}

/// Mount points at or below `dir`, deepest first (from /proc/self/mountinfo,
/// whose octal escapes are decoded).
fn mounts_under(dir: &Path) -> Vec<PathBuf> {
    let Ok(real) = dir.canonicalize() else { return Vec::new() };
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let mut out: Vec<PathBuf> = info
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(|p| PathBuf::from(unescape(p)))
        .filter(|p| p.starts_with(&real))
        .collect();
    out.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    out.dedup();
    out
}

fn unescape(s: &str) -> String {
    let (b, mut out, mut i) = (s.as_bytes(), Vec::new(), 0);
    while i < b.len() {
        let oct = b.get(i + 1..i + 4).and_then(|o| u8::from_str_radix(std::str::from_utf8(o).ok()?, 8).ok());
        match (b[i], oct) {
            (b'\\', Some(c)) => {
                out.push(c);
                i += 4;
            }
            (c, _) => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The egress network of `ember serve` (crates/ember-net): slots, table, and
/// the resolver's address on `lo`.
fn remove_network(tag: &str, range: &str) {
    for n in ember_net::slot::existing(tag) {
        ember_net::slot::destroy(tag, n);
        println!("removed network slot {}", ember_net::slot::name(tag, n));
    }
    if nft_table_exists(tag) && ember_net::nft::apply(&format!("delete table inet {tag}\n")).is_ok() {
        println!("removed nft table inet {tag}");
    }
    if let Some(res) = resolver(range) {
        let out = Command::new("ip").args(["addr", "del", &format!("{res}/32"), "dev", "lo"]).output();
        if out.is_ok_and(|o| o.status.success()) {
            println!("removed {res}/32 from lo");
        }
    }
}

fn resolver(range: &str) -> Option<std::net::Ipv4Addr> {
    (range != "none").then(|| ember_net::AddrPlan::parse(range).ok()).flatten().map(|p| p.resolver())
}

fn nft_table_exists(tag: &str) -> bool {
    ember_net::nft::query(&["list", "table", "inet", tag]).is_ok()
}

/// What a second look still finds.
fn leftovers(a: &UninstallArgs) -> Vec<String> {
    let mut left: Vec<String> = mounts_under(&a.data_dir).iter().map(|m| format!("mount {}", m.display())).collect();
    for g in groups(&a.cgroup_parent) {
        left.extend(cgroup_dirs(&g).iter().map(|d| format!("cgroup {}", d.display())));
    }
    let tag = &a.network_tag;
    left.extend(
        ember_net::slot::existing(tag).iter().map(|n| format!("network slot {}", ember_net::slot::name(tag, *n))),
    );
    if nft_table_exists(tag) {
        left.push(format!("nft table inet {tag}"));
    }
    if let Some(res) = resolver(&a.network_range) {
        let out = Command::new("ip").args(["-4", "-o", "addr", "show", "dev", "lo"]).output();
        if out.is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains(&format!(" {res}/32 "))) {
            left.push(format!("{res}/32 on lo"));
        }
    }
    if !a.keep_data && a.data_dir.exists() {
        left.push(format!("data dir {}", a.data_dir.display()));
    }
    left
}
