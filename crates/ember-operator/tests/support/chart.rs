//! deploy/helm/ember as helm sees it once `helm dependency build` has run:
//! a copy in a temp dir with a stand-in for its `nats` dependency under
//! `charts/`. NATS's chart repository cannot be reached from these machines
//! and nothing of it is vendored; the stand-in is a minimal chart of that
//! name and a version the dependency accepts, rendering only the client
//! Service NATS's chart would (its name as that chart computes it), so the
//! nodes' `--cluster` URL can be checked against it. Shared by
//! crates/ember-operator/tests/chart.rs and bins/ember/tests/k8s.rs.
use std::path::{Path, PathBuf};

const STUB_CHART: &str = "apiVersion: v2\nname: nats\nversion: 1.3.0\n\
    description: A stand-in for NATS's chart (tests only; the real one is fetched by helm dependency build)\n";

const STUB_SERVICE: &str = r#"{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- $full := printf "%s-%s" .Release.Name $name -}}
{{- if .Values.fullnameOverride }}{{ $full = .Values.fullnameOverride }}{{ else if contains $name .Release.Name }}{{ $full = .Release.Name }}{{ end -}}
apiVersion: v1
kind: Service
metadata:
  name: {{ $full | trunc 63 | trimSuffix "-" }}
  namespace: {{ .Release.Namespace }}
spec:
  selector: {app.kubernetes.io/name: nats}
  ports:
    - {name: nats, port: 4222}
"#;

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap_or_else(|e| panic!("mkdir {}: {e}", to.display()));
    for entry in std::fs::read_dir(from).unwrap_or_else(|e| panic!("read {}: {e}", from.display())) {
        let entry = entry.expect("a directory entry");
        let (src, dst) = (entry.path(), to.join(entry.file_name()));
        if entry.file_type().expect("file type").is_dir() {
            copy_dir(&src, &dst);
        } else {
            std::fs::copy(&src, &dst).unwrap_or_else(|e| panic!("copy {}: {e}", src.display()));
        }
    }
}

/// The chart with the stand-in dependency; the path is `<dir>/ember`.
pub fn with_nats_stub(repo_root: &Path) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::Builder::new().prefix("ember-chart-").tempdir().expect("temp dir");
    let chart = dir.path().join("ember");
    copy_dir(&repo_root.join("deploy/helm/ember"), &chart);
    let stub = chart.join("charts/nats");
    std::fs::create_dir_all(stub.join("templates")).expect("stub chart dir");
    std::fs::write(stub.join("Chart.yaml"), STUB_CHART).expect("stub Chart.yaml");
    std::fs::write(stub.join("templates/service.yaml"), STUB_SERVICE).expect("stub service");
    (dir, chart)
}
