//! Against the host's real cgroup hierarchy (v1 on this project's machines, v2
//! elsewhere). Runs as root, as CI does.
use ember_cgroups::{detect, Limits};
use std::process::Command;

#[test]
fn create_attach_freeze_destroy_on_the_real_hierarchy() {
    let group = format!("ember-cgtest-{}", std::process::id());
    let cg = detect("/sys/fs/cgroup".as_ref(), &group).expect("a usable cgroup hierarchy");
    let l = Limits { memory_bytes: 96 << 20, cpu_millis: 250, pids: 16 };
    cg.create("c1", &l).expect("create");
    assert_eq!(cg.read_limits("c1").expect("read back"), l);
    let mut child = Command::new("sleep").arg("60").spawn().expect("sleep");
    cg.attach("c1", child.id() as i32).expect("attach");
    assert_eq!(cg.procs("c1").expect("procs"), vec![child.id() as i32]);
    assert!(cg.usage("c1").expect("usage").pids >= 1);
    cg.freeze("c1", true).expect("freeze");
    let state = std::fs::read_to_string(format!("/proc/{}/stat", child.id())).expect("stat");
    let after = &state[state.rfind(')').expect(")") + 2..];
    assert!(after.starts_with('D') || after.starts_with('S') || after.starts_with('T'), "{after}");
    cg.freeze("c1", false).expect("thaw");
    assert_eq!(cg.list().expect("list"), vec!["c1".to_string()]);
    cg.destroy("c1").expect("destroy");
    assert!(!cg.exists("c1"));
    assert!(!child.wait().expect("reaped").success(), "destroy killed the process");
    cg.destroy("c1").expect("destroy is idempotent");
    cg.remove_group().expect("remove group");
}
