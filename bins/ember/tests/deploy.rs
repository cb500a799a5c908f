//! deploy/systemd/ember.service: systemd itself checks the unit
//! (`systemd-analyze verify`, every warning an error), and the two settings
//! the daemon's design depends on are there: `KillMode=process` (stopping the
//! daemon must not take the sandboxes down: they are re-adopted on start,
//! bins/ember/tests/restart.rs) and `Delegate=yes` (ember manages cgroups).
use std::process::Command;

#[test]
fn the_systemd_unit_verifies_and_keeps_sandboxes_across_a_stop() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let unit = std::fs::read_to_string(root.join("deploy/systemd/ember.service")).expect("the unit");
    for line in ["KillMode=process", "Delegate=yes", "ExecStart=/usr/local/bin/ember serve "] {
        assert!(unit.lines().any(|l| l.starts_with(line)), "the unit lacks {line:?}");
    }
    // verify wants the ExecStart binaries to exist: point them at this build.
    let ember = env!("CARGO_BIN_EXE_ember");
    let agent = root.join("target/debug/ember-agent");
    let here = unit
        .replace("/usr/local/bin/ember-agent", &agent.display().to_string())
        .replace("/usr/local/bin/ember ", &format!("{ember} "));
    let dir = std::env::temp_dir().join(format!("ember-unit-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    std::fs::write(dir.join("ember.service"), here).expect("write the unit");
    let out = Command::new("systemd-analyze").arg("verify").arg(dir.join("ember.service")).output();
    let _ = std::fs::remove_dir_all(&dir);
    let out = out.expect("systemd-analyze runs (Debian: apt-get install systemd)");
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() && said.trim().is_empty(), "systemd-analyze verify: {said}");
}
