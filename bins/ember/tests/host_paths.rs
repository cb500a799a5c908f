//! Host root never follows a path a sandbox (or a snapshot store) can write
//! (docs/threat-model.md, "Paths the sandbox controls"). Each test is an
//! escape that worked before the fix, run as root inside a real sandbox:
//! - native, crun, runc: `/etc` replaced by a symlink to a host dir, then a snapshot
//!   and a restore (the host-side rootfs preparation wrote `hosts` and
//!   `hostname` into that dir and chowned it);
//! - a layer snapshot whose manifest says `tmp -> /` (the bundle binds
//!   `<rootfs>/tmp`: the host's `/` would be bound into the sandbox), forged
//!   without the node's manifest key (refused as tampered) and with it (refused
//!   by the rootfs checks);
//! - runsc: a symlink planted at the `resume` file before checkpoint → resume
//!   (host root created the file it named).
mod common;

use common::Daemon;
use ember_snapshot::manifest::{EntryKind, Manifest};
use ember_snapshot::ManifestKey;
use ember_types::api::CreateSandboxRequest;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// The daemon's default `--uid-base`: host uid of root inside every sandbox.
const UID_BASE: u32 = 1_000_000_000;

/// A host dir (or path) the sandbox must never reach, unique to this test.
fn victim(tag: &str) -> PathBuf {
    let p = std::env::temp_dir().join(format!("ember-victim-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&p);
    let _ = std::fs::remove_file(&p);
    p
}

fn restore_req(snapshot: &str) -> CreateSandboxRequest {
    CreateSandboxRequest { snapshot_id: Some(snapshot.into()), ..Default::default() }
}

async fn etc_symlink_through_snapshot_and_restore(class: &str) {
    let d = Daemon::start();
    let host_dir = victim(&format!("etc-{class}"));
    std::fs::create_dir(&host_dir).expect("victim dir");
    // Owned by the sandboxes' id range, as another sandbox's files are: the
    // native class's mount plan runs as the sandbox's root, before `pivot_root`.
    std::os::unix::fs::chown(&host_dir, Some(UID_BASE), Some(UID_BASE)).expect("chown victim");
    let src = d.create(|r| r.runtime_class = Some(class.into())).await;
    let plant = format!("rm -rf /etc && ln -s {} /etc", host_dir.display());
    let (code, _, err) = d.sh(&src.id, &plant, Some(0)).await;
    assert_eq!(code, Some(0), "{class}: {err}");
    let snap = d.client.snapshot_sandbox(&src.id, None).await.expect("snapshot");
    let restored = d.client.create_sandbox(&restore_req(&snap.id)).await;

    let left: Vec<_> = std::fs::read_dir(&host_dir).expect("victim").flatten().map(|e| e.file_name()).collect();
    let owner = std::fs::metadata(&host_dir).expect("victim").uid();
    assert!(left.is_empty(), "{class}: the host dir the sandbox's /etc named was written: {left:?}");
    assert_eq!(owner, UID_BASE, "{class}: the host dir the sandbox's /etc named was chowned");
    // The restore is refused with a structured 4xx naming the layer's etc (a 500 before).
    let e = restored.map(|(s, _)| s.id).expect_err("a layer whose /etc is a symlink is refused").to_string();
    assert!(e.contains("must not be symlinks") && e.contains("upper/etc"), "{class}: {e}");
    assert!(e.starts_with("SANDBOX::UNSAFE_LAYER:") && e.ends_with("(HTTP 422)"), "{class}: {e}");
    let _ = std::fs::remove_dir_all(&host_dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn native_a_restored_etc_symlink_is_never_followed_on_the_host() {
    etc_symlink_through_snapshot_and_restore("native").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crun_a_restored_etc_symlink_is_never_followed_on_the_host() {
    etc_symlink_through_snapshot_and_restore("crun").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runc_a_restored_etc_symlink_is_never_followed_on_the_host() {
    etc_symlink_through_snapshot_and_restore("runc").await;
}

/// How the forger got at the manifest.
#[derive(Clone, Copy, PartialEq)]
enum Forger {
    /// Write access to the store only: the checksum is recomputed, the MAC cannot be.
    StoreOnly,
    /// The node's key as well: the manifest verifies, the rootfs checks must hold.
    WithKey,
}

/// Rewrites the layer manifest of sandbox snapshot `snap` in the node's local
/// store so that its `tmp` is a symlink to `/` (a forged store).
fn forge_tmp_to_root(data_dir: &Path, snap: &str, forger: Forger) {
    let path = data_dir.join(format!("snapshots/manifests/sbx-{snap}-layer.json"));
    let (id, key) = (format!("sbx-{snap}-layer"), format!("manifests/sbx-{snap}-layer.json"));
    let node_key = ManifestKey::load(&data_dir.join("snapshot.key")).expect("the node's key");
    let bytes = std::fs::read(&path).expect("layer manifest");
    let mut m = Manifest::decode(&key, &id, &bytes, &node_key).expect("decode");
    m.entries.retain(|e| e.path != "tmp" && !e.path.starts_with("tmp/"));
    let at = m.entries.iter().position(|e| e.path.as_str() > "tmp").unwrap_or(m.entries.len());
    let mut link = m.entries[0].clone();
    (link.path, link.kind) = ("tmp".into(), EntryKind::Symlink { target: "/".into() });
    m.entries.insert(at, link);
    let signer = match forger {
        Forger::WithKey => node_key,
        Forger::StoreOnly => ManifestKey::ephemeral(),
    };
    std::fs::write(&path, m.encode(&signer).expect("encode")).expect("write forged manifest");
}

/// Without the node's key a forged manifest is refused before anything is
/// restored from it (before the MAC, this one restored as far as the runtime).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crun_a_forged_layer_manifest_without_the_key_is_refused_as_tampered() {
    let d = Daemon::start();
    let src = d.create(|r| r.runtime_class = Some("crun".into())).await;
    let snap = d.client.snapshot_sandbox(&src.id, None).await.expect("snapshot");
    forge_tmp_to_root(&d.data_dir, &snap.id, Forger::StoreOnly);
    let e = d.client.create_sandbox(&restore_req(&snap.id)).await.map(|(s, _)| s.id).expect_err("refused");
    let e = e.to_string();
    assert!(e.starts_with("SNAPSHOT::TAMPERED:") && e.ends_with("(HTTP 422)"), "{e}");
    assert!(e.contains(&format!("sbx-{}-layer", snap.id)), "names the manifest's snapshot: {e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crun_a_forged_tmp_to_root_layer_never_binds_the_host_root() {
    let d = Daemon::start();
    let marker = d.data_dir.join("host-only-marker");
    std::fs::write(&marker, b"host\n").expect("marker");
    let src = d.create(|r| r.runtime_class = Some("crun".into())).await;
    let snap = d.client.snapshot_sandbox(&src.id, None).await.expect("snapshot");
    forge_tmp_to_root(&d.data_dir, &snap.id, Forger::WithKey);
    match d.client.create_sandbox(&restore_req(&snap.id)).await {
        Ok((s, _)) => {
            let probe = format!("cat /tmp{} 2>/dev/null; ls /tmp", marker.display());
            let (_, out, _) = d.sh(&s.id, &probe, Some(0)).await;
            panic!("a forged layer was restored; its /tmp shows: {out}");
        }
        // Refused before the runtime sees the bundle (before the fix crun was
        // handed the bind and failed further on: "failed open()ing /dev/null").
        Err(e) => {
            let e = e.to_string();
            assert!(
                e.contains("must not be symlinks") && e.contains("upper/tmp"),
                "refused, naming the layer's tmp: {e}"
            );
            assert!(e.starts_with("SANDBOX::UNSAFE_LAYER:") && e.ends_with("(HTTP 422)"), "{e}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runsc_a_symlink_planted_at_the_resume_file_is_never_followed() {
    let d = Daemon::start();
    let target = victim("resume");
    let req = CreateSandboxRequest { runtime_class: Some("runsc".into()), ..Default::default() };
    let (s, _) = d.client.create_sandbox(&req).await.expect("a runsc sandbox (is runsc installed?)");
    // Re-planted in a loop, so the daemon's delete before the checkpoint does not clear it.
    let plant = format!(
        "(while :; do ln -s {} /run/ember/resume 2>/dev/null; sleep 0.01; done) >/dev/null 2>&1 & \
         while [ ! -L /run/ember/resume ]; do sleep 0.01; done",
        target.display()
    );
    let (code, _, err) = d.sh(&s.id, &plant, Some(0)).await;
    assert_eq!(code, Some(0), "{err}");
    d.client.checkpoint_sandbox(&s.id).await.expect("checkpoint");
    let resumed = d.client.resume_sandbox(&s.id).await;
    assert!(!target.exists() && target.symlink_metadata().is_err(), "host root created {}", target.display());
    resumed.expect("the daemon replaces the planted link and the sandbox resumes");
    assert_eq!(d.sh(&s.id, "echo up", None).await.1, "up\n");
}

/// Files that hold a sandbox's env (its record, its OCI bundle, the task
/// journal) are the daemon's alone: 0600, in 0711 dirs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn state_files_holding_a_sandboxs_env_are_private() {
    let d = Daemon::start();
    let s = d.create(|r| r.runtime_class = Some("crun".into())).await;
    let mode = |p: PathBuf| std::fs::metadata(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display())).mode() & 0o7777;
    let sb = d.data_dir.join(format!("oci/crun/sandboxes/{}", s.id));
    let got = [
        ("state", mode(d.data_dir.join("state"))),
        ("state/sandboxes", mode(d.data_dir.join("state/sandboxes"))),
        ("record", mode(d.data_dir.join(format!("state/sandboxes/{}.json", s.id)))),
        ("state/tasks", mode(d.data_dir.join("state/tasks"))),
        ("journal", mode(d.data_dir.join("state/tasks/tasks.journal"))),
        ("sandbox dir", mode(sb.clone())),
        ("bundle", mode(sb.join("bundle"))),
        ("config.json", mode(sb.join("bundle/config.json"))),
    ];
    let want = [0o711, 0o711, 0o600, 0o711, 0o600, 0o711, 0o711, 0o600];
    let want: Vec<_> = got.iter().zip(want).map(|((n, _), m)| (*n, m)).collect();
    assert_eq!(got.to_vec(), want, "modes (decimal)");
}
