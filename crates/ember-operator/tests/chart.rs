//! `helm lint` and `helm template` on deploy/helm/ember with the helm that
//! `scripts/kube-test-env.sh` builds (EMBER_HELM). Fails, never skips, when
//! it is missing.
mod support;

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

/// The chart with a stand-in for its `nats` dependency (`support/chart.rs`):
/// helm wants a declared dependency under `charts/` even when disabled.
fn chart() -> (tempfile::TempDir, PathBuf) {
    support::chart::with_nats_stub(&PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../.."))
}

fn run(args: &[&str]) -> String {
    let (_dir, chart) = chart();
    let out = Command::new(helm()).args(args).arg(&chart).output().expect("helm runs");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "helm {args:?} failed:\n{text}");
    text
}

/// helm's error output for a command that must fail.
fn fails(args: &[&str]) -> String {
    let (_dir, chart) = chart();
    let out = Command::new(helm()).args(args).arg(&chart).output().expect("helm runs");
    assert!(!out.status.success(), "helm {args:?} succeeded");
    String::from_utf8_lossy(&out.stderr).into_owned()
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
    let out = run(&["template", "ember", "--set", "nats.enabled=false", "--set", "nats.url=nats://n1:4222"]);
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
    let err = fails(&["template", "ember", "--set", "apiKeySecret="]);
    assert!(err.contains("apiKeySecret"), "{err}");
}

/// NATS's chart is a dependency (`condition: nats.enabled`): enabled (the
/// default), the nodes reach the Service it renders, named as it names it;
/// disabled, nothing of it renders and the nodes use nats.url, which is then
/// required.
#[test]
fn nats_is_the_nats_charts_service_or_an_existing_url() {
    let chart_yaml =
        std::fs::read_to_string(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../deploy/helm/ember/Chart.yaml"))
            .expect("Chart.yaml");
    for want in ["name: nats", "repository: https://nats-io.github.io/k8s/helm/charts/", "condition: nats.enabled"] {
        assert!(chart_yaml.contains(want), "{want} missing from Chart.yaml:\n{chart_yaml}");
    }
    let bundled = run(&["template", "ember", "--namespace", "ember-system"]);
    assert!(bundled.contains("- --cluster=nats://ember-nats.ember-system.svc:4222"), "{bundled}");
    assert!(bundled.contains("name: ember-nats\n"), "the dependency's Service renders:\n{bundled}");
    let named = run(&["template", "ember", "--namespace", "ns", "--set", "nats.fullnameOverride=bus"]);
    assert!(named.contains("- --cluster=nats://bus.ns.svc:4222") && named.contains("name: bus\n"), "{named}");
    let existing = run(&["template", "ember", "--set", "nats.enabled=false", "--set", "nats.url=nats://infra:4222"]);
    assert!(existing.contains("- --cluster=nats://infra:4222") && !existing.contains("ember-nats"), "{existing}");
    let err = fails(&["template", "ember", "--set", "nats.enabled=false"]);
    assert!(err.contains("nats.url"), "{err}");
}

/// With agent-sandbox served (the default), the nodes are also behind the
/// Service name and port agent-sandbox's clients use for its router.
#[test]
fn agent_sandboxs_router_service_fronts_the_nodes_when_enabled() {
    let on = run(&["template", "ember"]);
    assert!(
        on.contains("name: sandbox-router-svc") && on.contains("{name: http, port: 8080, targetPort: api}"),
        "{on}"
    );
    let off = run(&["template", "ember", "--set", "agentSandbox.enabled=false"]);
    assert!(!off.contains("sandbox-router-svc") && off.contains("--no-agent-sandbox"), "{off}");
}
