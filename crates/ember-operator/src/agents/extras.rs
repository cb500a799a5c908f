//! What an agent-sandbox SandboxClaim adds to its warm pool's sandbox, under
//! its SandboxTemplate's policies, as agent-sandbox's claim controller
//! applies them: environment variables (the template's first container's
//! `env` values, then the claim's `env` per `envVarsInjectionPolicy`) and
//! volumes (the template's `volumeClaimTemplates`, then the claim's per
//! `volumeClaimTemplatesPolicy`), each volume an ember workspace of its
//! storage request mounted where the template's container mounts that
//! volume. Pure; `controller.rs` makes the workspaces and the claim.
use super::crd::{SandboxClaimSpec, SandboxTemplate};
use std::collections::BTreeMap;

/// agent-sandbox's terminal claim reasons its client knows.
pub const ENV_REJECTED: &str = "EnvVarsInjectionRejected";
pub const VOLUMES_REJECTED: &str = "VolumeClaimTemplatesError";

/// A volume of the claim: the ember workspace behind it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Volume {
    /// `as-<namespace>-<claim>-<volume>`, fitted to ember's names.
    pub workspace: String,
    pub size: String,
    pub mount_path: String,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Extras {
    pub env: BTreeMap<String, String>,
    pub volumes: Vec<Volume>,
}

/// The ember workspace of volume `volume` of claim `ns/claim`.
pub fn workspace_name(ns: &str, claim: &str, volume: &str) -> String {
    crate::node_pool_name_prefixed("as", ns, &format!("{claim}-{volume}"))
}

/// The claim's extras, or the terminal reason and why it cannot be served.
pub fn extras(
    ns: &str,
    claim: &str,
    spec: &SandboxClaimSpec,
    template: &SandboxTemplate,
) -> Result<Extras, (&'static str, String)> {
    let pod = &template.spec.blueprint.pod_template.spec;
    let container = pod.pointer("/containers/0");
    let mut env = BTreeMap::new();
    for e in container.and_then(|c| c.get("env")).and_then(|e| e.as_array()).into_iter().flatten() {
        // A `valueFrom` (a Secret, a field) is the kubelet's to resolve: no kubelet here.
        if let (Some(k), Some(v)) = (e.get("name").and_then(|n| n.as_str()), e.get("value").and_then(|v| v.as_str())) {
            env.insert(k.to_string(), v.to_string());
        }
    }
    let env_policy = template.spec.env_vars_injection_policy.as_deref().unwrap_or("Disallowed");
    for e in &spec.env {
        match env_policy {
            "Overrides" => {}
            "Allowed" if !env.contains_key(&e.name) => {}
            "Allowed" => {
                return Err((
                    ENV_REJECTED,
                    format!("the template's policy Allowed does not let {} be overridden", e.name),
                ))
            }
            p => return Err((ENV_REJECTED, format!("the template's envVarsInjectionPolicy is {p}"))),
        }
        env.insert(e.name.clone(), e.value.clone());
    }
    let mut templates: Vec<serde_json::Value> = template.spec.blueprint.volume_claim_templates.clone();
    let vct_policy = template.spec.volume_claim_templates_policy.as_deref().unwrap_or("Disallowed");
    for v in &spec.volume_claim_templates {
        let name = vct_name(v)?;
        let existing = templates.iter().position(|t| vct_name(t).ok() == Some(name));
        match (vct_policy, existing) {
            ("Disallowed", _) => {
                return Err((VOLUMES_REJECTED, "the template's volumeClaimTemplatesPolicy is Disallowed".into()))
            }
            ("Allowed", Some(_)) => {
                return Err((
                    VOLUMES_REJECTED,
                    format!("the template's policy Allowed does not let {name} be overridden"),
                ))
            }
            (_, Some(i)) => templates[i] = v.clone(),
            (_, None) => templates.push(v.clone()),
        }
    }
    let mounts = container.and_then(|c| c.get("volumeMounts")).and_then(|m| m.as_array());
    let mut volumes = Vec::new();
    for t in &templates {
        let name = vct_name(t)?;
        let size = t.pointer("/spec/resources/requests/storage").and_then(|s| s.as_str());
        let size =
            size.ok_or_else(|| (VOLUMES_REJECTED, format!("volume {name}: no spec.resources.requests.storage")))?;
        let mount = mounts.into_iter().flatten().find(|m| m.get("name").and_then(|n| n.as_str()) == Some(name));
        let path = mount.and_then(|m| m.get("mountPath")).and_then(|p| p.as_str());
        let path = path
            .ok_or_else(|| (VOLUMES_REJECTED, format!("volume {name}: the template's container mounts it nowhere")))?;
        volumes.push(Volume { workspace: workspace_name(ns, claim, name), size: size.into(), mount_path: path.into() });
    }
    Ok(Extras { env, volumes })
}

fn vct_name(v: &serde_json::Value) -> Result<&str, (&'static str, String)> {
    v.pointer("/metadata/name")
        .and_then(|n| n.as_str())
        .filter(|n| !n.is_empty())
        .ok_or_else(|| (VOLUMES_REJECTED, "a volume claim template without metadata.name".into()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agents::crd::{EnvVar, NameRef, SandboxTemplateSpec};

    fn template(env_policy: Option<&str>, vct_policy: Option<&str>) -> SandboxTemplate {
        let pod = serde_json::json!({"containers": [{"image": "host",
            "env": [{"name": "A", "value": "template"}, {"name": "S", "valueFrom": {"secretKeyRef": {}}}],
            "volumeMounts": [{"name": "data", "mountPath": "/data"}, {"name": "scratch", "mountPath": "/scratch"}]}]});
        let mut spec = SandboxTemplateSpec::of_pod(pod);
        spec.blueprint.volume_claim_templates = vec![
            serde_json::json!({"metadata": {"name": "data"}, "spec": {"resources": {"requests": {"storage": "1Gi"}}}}),
        ];
        spec.env_vars_injection_policy = env_policy.map(str::to_string);
        spec.volume_claim_templates_policy = vct_policy.map(str::to_string);
        SandboxTemplate::new("t", spec)
    }

    fn claim(env: &[(&str, &str)], vcts: Vec<serde_json::Value>) -> SandboxClaimSpec {
        SandboxClaimSpec {
            warm_pool_ref: NameRef { name: "p".into() },
            lifecycle: None,
            additional_pod_metadata: None,
            env: env
                .iter()
                .map(|(n, v)| EnvVar { name: (*n).into(), value: (*v).into(), container_name: None })
                .collect(),
            volume_claim_templates: vcts,
        }
    }

    fn vct(name: &str, size: &str) -> serde_json::Value {
        serde_json::json!({"metadata": {"name": name}, "spec": {"resources": {"requests": {"storage": size}}}})
    }

    #[test]
    fn the_templates_env_and_volumes_come_with_every_claim() {
        let x = extras("ns", "c", &claim(&[], vec![]), &template(None, None)).expect("served");
        assert_eq!(x.env, BTreeMap::from([("A".to_string(), "template".to_string())]));
        let v = Volume { workspace: "as-ns-c-data".into(), size: "1Gi".into(), mount_path: "/data".into() };
        assert_eq!(x.volumes, [v]);
    }

    #[test]
    fn the_claims_env_follows_the_templates_policy() {
        let new = claim(&[("B", "claim")], vec![]);
        let over = claim(&[("A", "claim")], vec![]);
        assert_eq!(extras("ns", "c", &new, &template(None, None)).map_err(|e| e.0), Err(ENV_REJECTED));
        assert_eq!(extras("ns", "c", &new, &template(Some("Allowed"), None)).expect("allowed").env["B"], "claim");
        assert_eq!(extras("ns", "c", &over, &template(Some("Allowed"), None)).map_err(|e| e.0), Err(ENV_REJECTED));
        assert_eq!(extras("ns", "c", &over, &template(Some("Overrides"), None)).expect("overrides").env["A"], "claim");
    }

    #[test]
    fn the_claims_volumes_follow_the_templates_policy() {
        let new = claim(&[], vec![vct("scratch", "64Mi")]);
        let over = claim(&[], vec![vct("data", "2Gi")]);
        assert_eq!(extras("ns", "c", &new, &template(None, None)).map_err(|e| e.0), Err(VOLUMES_REJECTED));
        let x = extras("ns", "c", &new, &template(None, Some("Allowed"))).expect("allowed");
        assert_eq!(x.volumes.iter().map(|v| v.mount_path.as_str()).collect::<Vec<_>>(), ["/data", "/scratch"]);
        assert_eq!(extras("ns", "c", &over, &template(None, Some("Allowed"))).map_err(|e| e.0), Err(VOLUMES_REJECTED));
        let x = extras("ns", "c", &over, &template(None, Some("Overrides"))).expect("overrides");
        assert_eq!((x.volumes.len(), x.volumes[0].size.as_str()), (1, "2Gi"));
        let unmounted = claim(&[], vec![vct("nowhere", "64Mi")]);
        assert!(extras("ns", "c", &unmounted, &template(None, Some("Allowed"))).is_err_and(|e| e.1.contains("nowhere")));
    }
}
