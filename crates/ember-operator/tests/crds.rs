//! The chart's CRDs are generated from the Rust types: this fails when the
//! checked-in file drifts from them. Regenerate with
//! `EMBER_UPDATE_CRDS=1 cargo test -p ember-operator --test crds`
//! (or `ember operator crds > deploy/helm/ember/crds/ember.run.yaml`).
use std::path::PathBuf;

fn chart_crds(file: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../deploy/helm/ember/crds").join(file)
}

#[test]
fn chart_crds_match_the_rust_types() {
    check(ember_operator::crd::yaml().expect("CRDs serialize"), "ember.run.yaml");
}

#[test]
fn chart_agent_sandbox_crds_match_the_rust_types() {
    check(ember_operator::agents::crd::yaml().expect("CRDs serialize"), "agents.x-k8s.io.yaml");
}

fn check(generated: String, file: &str) {
    let path = chart_crds(file);
    if std::env::var_os("EMBER_UPDATE_CRDS").is_some() {
        std::fs::write(&path, &generated).expect("write the chart's CRDs");
    }
    let checked_in = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        checked_in == generated,
        "{} differs from the CRDs derived from crates/ember-operator/src: regenerate it with \
         `EMBER_UPDATE_CRDS=1 cargo test -p ember-operator --test crds`",
        path.display()
    );
}

#[test]
fn every_kind_has_status_and_printer_columns_and_the_pool_scales() {
    for crd in ember_operator::crd::all() {
        let v = &crd.spec.versions[0];
        let sub = v.subresources.as_ref().unwrap_or_else(|| panic!("{} has no subresources", crd.spec.names.kind));
        assert!(sub.status.is_some(), "{} has no status subresource", crd.spec.names.kind);
        assert!(v.additional_printer_columns.as_ref().is_some_and(|c| !c.is_empty()), "{}", crd.spec.names.kind);
        assert_eq!(crd.spec.group, "ember.run");
        if crd.spec.names.kind == "SandboxPool" {
            let scale = sub.scale.as_ref().expect("SandboxPool has the scale subresource");
            assert_eq!(
                (scale.spec_replicas_path.as_str(), scale.status_replicas_path.as_str()),
                (".spec.replicas", ".status.replicas")
            );
            assert_eq!(scale.label_selector_path.as_deref(), Some(".status.selector"));
        }
    }
}
