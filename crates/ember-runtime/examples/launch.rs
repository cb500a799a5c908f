//! Launches one native sandbox with the agent at $EMBER_AGENT_BIN, prints its
//! timing and boundary report, then destroys it. A manual smoke check.
use ember_runtime::native::{NativeConfig, NativeRuntime};
use ember_runtime::Runtime;
use ember_types::*;
use std::sync::Arc;

fn main() {
    let agent = std::env::var("EMBER_AGENT_BIN").expect("set EMBER_AGENT_BIN");
    let cg: Arc<dyn ember_cgroups::Cgroups> =
        Arc::from(ember_cgroups::detect("/sys/fs/cgroup".as_ref(), "ember-smoke").unwrap());
    let rt = NativeRuntime::new(
        NativeConfig {
            data_dir: "/tmp/ember-smoke".into(),
            agent_path: agent.into(),
            uid_base: 1_000_000_000,
            id_ranges: 16,
            ready_timeout: ember_runtime::READY_TIMEOUT,
        },
        cg,
    )
    .unwrap();
    let spec = SandboxSpec {
        template: "host".into(),
        runtime_class: "native".into(),
        resources: Resources::default(),
        ttl_secs: None,
        env: Default::default(),
        metadata: Default::default(),
        entrypoint: vec![],
        user: UserSpec::SANDBOX,
        volumes: Vec::new(),
        network: NetworkMode::None,
        lower_dirs: vec![],
        workdir: None,
        egress: Default::default(),
        secret_names: vec![],
        auto_pause_secs: None,
        auto_pause_checkpoint: false,
    };
    for i in 0..5 {
        let id = SandboxId::from_random([i; 16]);
        match rt.launch(&id, &spec) {
            Ok(l) => {
                println!("{id}: {:?}", l.timing);
                println!("{:#?}", rt.boundary(&id, l.pid).unwrap());
                rt.destroy(&id, Some(&l.pidfd)).unwrap();
            }
            Err(e) => {
                let mut s: &dyn std::error::Error = &e;
                eprint!("error: {s}");
                while let Some(n) = s.source() {
                    eprint!(": {n}");
                    s = n;
                }
                eprintln!();
                let _ = rt.reap_leftover(id.as_str());
            }
        }
    }
}
