//! `helm lint` and `helm template` on deploy/helm/ember with the helm that
//! `scripts/kube-test-env.sh` builds (EMBER_HELM). Fails, never skips, when
//! it is missing.
use std::path::PathBuf;
use std::process::Command;

fn helm() -> PathBuf {
    let p = std::env::var_os("EMBER_HELM").map(PathBuf::from).unwrap_or_else(|| {
        panic!(
            "EMBER_HELM is not set: run `eval \"$(scripts/kube-test-env.sh)\"` first (it builds helm once per machine)"
        )
    });
    assert!(p.is_file(), "EMBER_HELM={} does not exist: run scripts/kube-test-env.sh", p.display());
    p
}

fn chart() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../deploy/helm/ember")
}

fn run(args: &[&str]) -> String {
    let out = Command::new(helm()).args(args).arg(chart()).output().expect("helm runs");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "helm {args:?} failed:\n{text}");
    text
}

#[test]
fn the_chart_lints_clean() {
    let out = run(&["lint", "--strict"]);
    assert!(out.contains("0 chart(s) failed"), "{out}");
}

#[test]
fn the_chart_renders_the_operator_with_and_without_an_api_key() {
    let plain = run(&["template", "ember", "--set", "apiKeySecret=", "--set", "node.enabled=false"]);
    assert!(plain.contains("kind: Deployment") && !plain.contains("api-key-file"), "{plain}");
    assert!(plain.contains("--leader-elect") && plain.contains("resources: [\"leases\"]"), "{plain}");
    let keyed = run(&["template", "ember", "--set", "apiKeySecret=", "--set", "operator.apiKeySecret=ember-key"]);
    assert!(
        keyed.contains("--api-key-file=/var/run/ember/apiKey") && keyed.contains("secretName: ember-key"),
        "{keyed}"
    );
}

#[test]
fn the_node_daemonset_runs_serve_cluster_privileged_with_the_key_and_nats() {
    let out = run(&["template", "ember", "--set", "nats.url=nats://n1:4222"]);
    for want in [
        "kind: DaemonSet",
        "privileged: true",
        "- --cluster=nats://n1:4222",
        "- --advertise=http://$(POD_IP):8080",
        "- --snapshot-key-file=/var/run/ember-snapshot/key",
        "name: EMBER_API_KEY",
        "kind: NetworkPolicy",
        "--ember-url=http://ember.default.svc:8080",
    ] {
        assert!(out.contains(want), "{want} missing:\n{out}");
    }
    // Without a key the nodes could not listen: the render says so.
    let keyless = Command::new(helm())
        .args(["template", "ember", "--set", "apiKeySecret="])
        .arg(chart())
        .output()
        .expect("helm runs");
    let err = String::from_utf8_lossy(&keyless.stderr);
    assert!(!keyless.status.success() && err.contains("apiKeySecret"), "{err}");
}
