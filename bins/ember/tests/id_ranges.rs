//! One host id range per sandbox: per-uid kernel limits (inotify instances,
//! here) are not shared between neighbours, and the boundary report names the
//! range a sandbox's ids map to.
mod common;

use common::Daemon;

/// Opens inotify instances until the kernel refuses one (or `n` are held),
/// writes how many it holds to /tmp/held, then keeps them open.
const HOLD: &str = r#"python3 -c '
import ctypes, os, time
libc = ctypes.CDLL(None, use_errno=True)
held = 0
while held < 128 and libc.inotify_init1(0) >= 0:
    held += 1
open("/tmp/held.tmp", "w").write(str(held))
os.rename("/tmp/held.tmp", "/tmp/held")
time.sleep(300)
' >/dev/null 2>&1 &
while [ ! -e /tmp/held ]; do sleep 0.05; done; cat /tmp/held"#;

/// Opens one inotify instance: "ok", or the errno's name (a python3 script).
const ONE_HOST: &str = r#"
import ctypes, errno
libc = ctypes.CDLL(None, use_errno=True)
print("ok" if libc.inotify_init1(0) >= 0 else errno.errorcode[ctypes.get_errno()])
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_neighbour_holding_every_inotify_instance_leaves_this_sandbox_its_own() {
    let d = Daemon::start();
    let hog = d.create(|_| {}).await;
    let other = d.create(|_| {}).await;
    let (code, held, err) = d.sh(&hog.id, HOLD, Some(0)).await;
    assert_eq!(code, Some(0), "{err}");
    let limit: usize = std::fs::read_to_string("/proc/sys/fs/inotify/max_user_instances")
        .expect("inotify limit")
        .trim()
        .parse()
        .expect("a number");
    // The hog reached the per-user limit: its neighbour would be refused if it shared the uid.
    assert_eq!(held.trim().parse::<usize>().ok(), Some(limit.min(128)), "held {held:?}");
    let (code, out, err) = d.sh(&other.id, &format!("python3 -c '{ONE_HOST}'"), Some(0)).await;
    assert_eq!((code, out.trim()), (Some(0), "ok"), "{err}");
    // Nor is host root's count charged: the hog's user namespace is owned by
    // its range, not by the daemon's uid (systemd, the daemon itself).
    let host = std::process::Command::new("python3").args(["-c", ONE_HOST]).output().expect("python3 on the host");
    assert_eq!(String::from_utf8_lossy(&host.stdout).trim(), "ok", "{}", String::from_utf8_lossy(&host.stderr));
    // The boundary report shows each sandbox's own range.
    let (a, b) =
        (d.client.boundary(&hog.id).await.expect("boundary"), d.client.boundary(&other.id).await.expect("boundary"));
    let range = |m: &str| m.split_whitespace().map(|x| x.parse::<u64>().expect("num")).collect::<Vec<_>>();
    let (ra, rb) = (range(&a.uid_map), range(&b.uid_map));
    assert_eq!((ra[0], ra[2], rb[0], rb[2]), (0, 65536, 0, 65536), "{ra:?} {rb:?}");
    assert!(ra[1].abs_diff(rb[1]) >= 65536, "overlapping ranges {ra:?} {rb:?}");
    assert_eq!(a.host_uid_of_root, Some(ra[1] as u32));
}
