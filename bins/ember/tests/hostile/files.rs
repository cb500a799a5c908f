//! The file API and the exec stream under attack: `..` and symlink traversal,
//! a symlink planted where the daemon connects to the agent, an upload beyond
//! the disk quota, a command that closes its stdout, one that leaves a child
//! holding it.
use crate::harness::{Arena, Limits};
use crate::per_class;
use bytes::Bytes;
use ember_client::ClientError;
use std::time::Duration;

async fn traversal_through_the_file_api(class: &'static str) {
    let a = Arena::new(class).await;
    let s = a.attacker(Limits::default()).await;
    let marker = format!("ember-hostile-{}", std::process::id());
    // `..` past the root stays at the sandbox's root (the agent resolves paths
    // inside the sandbox, whose `/..` is itself).
    let up = format!("/tmp/../../../../../tmp/{marker}");
    a.d.client.upload(&s.id, &up, Bytes::from_static(b"dots\n"), 0o644).await.expect("upload with ..");
    assert!(!std::path::Path::new("/tmp").join(&marker).exists(), "{class}: `..` wrote to the host's /tmp");
    let (_, out, _) = a.d.sh(&s.id, &format!("cat /tmp/{marker}"), None).await;
    assert_eq!(out, "dots\n", "{class}: the upload landed elsewhere");
    // Symlinks made inside point inside: to the sandbox's own root and PID 1's root.
    let (code, _, _) =
        a.d.sh(&s.id, "ln -s / /tmp/root && ln -s /proc/1/root /tmp/p1 && ln -s ../../../../etc /tmp/etc", Some(0))
            .await;
    assert_eq!(code, Some(0));
    let hostname = format!("sbx-{}\n", &s.id[..12]);
    for p in ["/tmp/root/etc/hostname", "/tmp/etc/hostname", "/tmp/root/../../etc/hostname"] {
        match a.d.client.download(&s.id, p).await {
            Ok(got) => assert_eq!(got, hostname.as_bytes(), "{class}: {p} read a host file"),
            // gVisor (2022-12) resolves a symlink to "/" followed by more
            // components to a directory: confined, but not the file.
            Err(ClientError::Api { status: 400, .. }) if class == "runsc" && p.starts_with("/tmp/root/") => {}
            Err(e) => panic!("{class}: download through {p}: {e}"),
        }
    }
    // Through /proc/1/root (the agent's root): the same sandbox root, if readable at all.
    if let Ok(got) = a.d.client.download(&s.id, "/tmp/p1/etc/hostname").await {
        assert_eq!(got, hostname.as_bytes(), "{class}: /proc/1/root read a host file");
    }
    a.d.client.upload(&s.id, "/tmp/etc/planted", Bytes::from_static(b"x\n"), 0o644).await.expect("upload via link");
    assert!(!std::path::Path::new("/etc/planted").exists(), "{class}: a symlink wrote to the host's /etc");
    a.assert_unaffected().await;
    a.remove(&s.id).await;
}
per_class!(traversal_through_the_file_api);

/// OCI classes bind the agent's socket dir from the host (`/run/ember`): root
/// inside can replace the socket with a symlink to another socket on the host
/// (here the neighbour's agent). The daemon must not follow it.
async fn a_planted_agent_socket_symlink_is_not_followed(class: &'static str) {
    let a = Arena::new(class).await;
    let s = a.attacker(Limits::default()).await;
    let target = match class {
        "native" => a.d.data_dir.join("sandboxes").join(&a.neighbour.id).join("agent.sock"),
        c => a.d.data_dir.join("oci").join(c).join("sandboxes").join(&a.neighbour.id).join("sock/agent.sock"),
    };
    let plant = format!("ln -s {} /run/ember/evil && mv -f /run/ember/evil /run/ember/agent.sock", target.display());
    let (code, _, _) = a.d.sh(&s.id, &plant, Some(0)).await;
    match class {
        // The agent's socket is an inherited fd, not a path the sandbox sees.
        "native" => assert_ne!(code, Some(0), "native: planting a symlink in /run/ember"),
        // The gofer refuses symlinks in a host-backed socket dir; either way is fine.
        "runsc" => {}
        // Root inside owns the bound dir: the plant works, the daemon must not follow it.
        _ => assert_eq!(code, Some(0), "{class}: planting the symlink (so the check can fail)"),
    }
    let planted = code == Some(0);
    let neighbour_name = format!("sbx-{}", &a.neighbour.id[..12]);
    let req = ember_types::execd::RunCommandRequest { command: Some("hostname".into()), ..Default::default() };
    let mut out = String::new();
    let r = a.d.client.exec(&s.id, &req, |ev| out.push_str(ev.text.as_deref().unwrap_or(""))).await;
    assert!(!out.contains(&neighbour_name), "{class}: the daemon followed the symlink into the neighbour: {out}");
    match (planted, r) {
        (false, r) => assert!(r.is_ok_and(|r| r.exit_code == Some(0)), "{class}: exec after the attempt"),
        (true, Err(ClientError::Api { status, code, message })) => {
            assert!(status >= 500 && !code.is_empty(), "{class}: {status} {code} {message}")
        }
        (true, other) => panic!("{class}: exec through a planted symlink: {other:?} ({out})"),
    }
    a.assert_unaffected().await;
    a.remove(&s.id).await;
}
per_class!(a_planted_agent_socket_symlink_is_not_followed);

async fn huge_upload_beyond_the_disk_quota(class: &'static str) {
    let a = Arena::new(class).await;
    let s = a.attacker(Limits { memory: "512Mi", disk: Some("32Mi"), ..Default::default() }).await;
    let big = Bytes::from(vec![0x5au8; 96 << 20]);
    match a.d.client.upload(&s.id, "/tmp/huge.bin", big, 0o644).await {
        Err(ClientError::Api { status, code, message }) => {
            assert!(status >= 400 && !code.is_empty() && !message.is_empty(), "{class}: {status} {code} {message}");
            assert!(message.to_lowercase().contains("space"), "{class}: unclear error: {code} {message}");
        }
        other => panic!("{class}: 96 MiB into a 32 MiB disk: {other:?}"),
    }
    // The partial file is gone or within the quota, and the sandbox still works.
    let (code, out, _) =
        a.d.sh(&s.id, "wc -c < /tmp/huge.bin 2>/dev/null || echo 0; echo ok > /tmp/a; cat /tmp/a", None).await;
    assert_eq!(code, Some(0), "{class}: {out}");
    let size: u64 = out.lines().next().and_then(|l| l.parse().ok()).unwrap_or(u64::MAX);
    assert!(size <= 32 << 20, "{class}: {size} bytes under a 32 MiB disk");
    a.assert_unaffected().await;
    a.remove(&s.id).await;
}
per_class!(huge_upload_beyond_the_disk_quota);

/// A hang detector, not a performance bound: a stream that does not end is the failure.
const HANG: Duration = Duration::from_secs(60);

async fn closed_stdout_and_a_child_holding_it(class: &'static str) {
    let a = Arena::new(class).await;
    let s = a.attacker(Limits::default()).await;
    // The command closes stdout and stderr and keeps running: its exit status
    // still arrives when it exits.
    let req = ember_types::execd::RunCommandRequest {
        command: Some("echo before; exec >&- 2>&-; sleep 1; exit 5".into()),
        ..Default::default()
    };
    let mut out = String::new();
    let r =
        tokio::time::timeout(HANG, a.d.client.exec(&s.id, &req, |ev| out.push_str(ev.text.as_deref().unwrap_or(""))))
            .await
            .unwrap_or_else(|_| panic!("{class}: the exec stream never ended"))
            .expect("exec");
    assert_eq!(r.exit_code, Some(5), "{class}: {out}");
    assert!(out.contains("before"), "{class}: {out}");
    // The command exits but leaves a child holding its stdout: the stream ends
    // with the command, not with the child.
    let req = ember_types::execd::RunCommandRequest {
        command: Some("sleep 600 & echo started; exit 3".into()),
        ..Default::default()
    };
    let r = tokio::time::timeout(HANG, a.d.client.exec(&s.id, &req, |_| {}))
        .await
        .unwrap_or_else(|_| panic!("{class}: the stream waited for the background child"))
        .expect("exec");
    assert_eq!(r.exit_code, Some(3), "{class}");
    let (_, ps, _) = a.d.sh(&s.id, "grep -l '^sleep' /proc/[0-9]*/comm | wc -l", None).await;
    assert_eq!(ps.trim(), "1", "{class}: the background child keeps running");
    a.assert_unaffected().await;
    a.remove(&s.id).await;
}
per_class!(closed_stdout_and_a_child_holding_it);
