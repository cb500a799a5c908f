//! A daemon killed while it makes an idmap user namespace leaves no process
//! behind: the child that holds the namespace while its maps are written
//! dies with it (a SIGKILLed cluster node once left one pausing forever,
//! reparented to init). Needs root.
use std::process::Command;
use std::time::Duration;

const LOOP_ENV: &str = "EMBER_SYS_TEST_USERNS_LOOP";

/// Processes still carrying `LOOP_ENV` in their environment.
fn stragglers() -> Vec<String> {
    let needle = format!("{LOOP_ENV}=1");
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str().filter(|n| n.parse::<u32>().is_ok()).map(str::to_string))
        .filter(|pid| {
            let env = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
            env.split(|b| *b == 0).any(|v| v == needle.as_bytes())
        })
        .collect()
}

#[test]
fn a_process_killed_while_making_user_namespaces_leaves_no_holder_behind() {
    if std::env::var_os(LOOP_ENV).is_some() {
        loop {
            let _ = ember_sys::idmap::userns_fd("0 1000000000 65536");
        }
    }
    let me = std::env::current_exe().expect("test binary");
    let name = "a_process_killed_while_making_user_namespaces_leaves_no_holder_behind";
    let mut left = Vec::new();
    for _ in 0..10 {
        let mut child = Command::new(&me)
            .args(["--exact", name, "--test-threads", "1"])
            .env(LOOP_ENV, "1")
            .stdout(std::process::Stdio::null())
            .spawn()
            .expect("spawn");
        // Most of each round is spent writing the maps, with the holder alive.
        std::thread::sleep(Duration::from_millis(200));
        child.kill().expect("SIGKILL");
        child.wait().expect("reaped");
        std::thread::sleep(Duration::from_millis(100));
        let now = stragglers();
        if !now.is_empty() {
            let _ = Command::new("kill").arg("-9").args(&now).status();
        }
        left.extend(now);
    }
    assert!(left.is_empty(), "holders left by a killed process: {left:?}");
}
