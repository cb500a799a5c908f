//! A request's path and method as tenancy sees it: which object it names,
//! whether it creates one, whether only the admin may call it, and the
//! action the audit log names. Pure, so the table is tested on its own.
use axum::http::Method;
use ember_engine::tenants::Kind;

#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Scope {
    /// Any caller (lists filter their items themselves).
    Open,
    /// The daemon's own state: images, templates, the node's network, the
    /// snapshot store, the cluster route, tenants, the audit log, metrics.
    AdminOnly,
    /// Names one object: its owner alone (and the admin) may go on.
    Object(Kind, String),
    /// Creates an object of this kind in a collection.
    Create(Kind),
}

#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Route {
    pub method: Method,
    pub scope: Scope,
    /// Segments after the object's id (`["pause"]`, `["proxy", "44772", ...]`).
    pub tail: Vec<String>,
    /// The kind of the object(s) the answer creates, named by its `id`/`name`
    /// (or its `items`' ones).
    pub creates: Option<Kind>,
    /// What the audit log calls it (`sandbox.create`, `exec`, ...).
    pub action: String,
}

fn decode(seg: &str) -> String {
    percent_encoding::percent_decode_str(seg).decode_utf8_lossy().into_owned()
}

fn collection(seg: &str) -> Option<Kind> {
    Some(match seg {
        "sandboxes" => Kind::Sandbox,
        "snapshots" => Kind::SandboxSnapshot,
        "pools" => Kind::Pool,
        "workspaces" => Kind::Workspace,
        "tasks" => Kind::Task,
        "workspace-snapshots" => Kind::WorkspaceSnapshot,
        _ => return None,
    })
}

const ADMIN_ONLY: &[&str] = &["network", "snapshot-store", "cluster", "tenants", "audit"];

pub(crate) fn classify(method: &Method, path: &str) -> Route {
    let rest = path.strip_prefix("/v1").filter(|r| r.is_empty() || r.starts_with('/')).unwrap_or(path);
    let segs: Vec<String> = rest.split('/').filter(|s| !s.is_empty()).map(decode).collect();
    let head = segs.first().map(String::as_str).unwrap_or("");
    let reads = matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS);
    let mut r =
        Route { method: method.clone(), scope: Scope::Open, tail: vec![], creates: None, action: String::new() };
    let noun = match head {
        "sandboxes" => "sandbox",
        "snapshots" => "snapshot",
        "pools" => "pool",
        "workspaces" => "workspace",
        "tasks" => "task",
        "workspace-snapshots" => "workspace.snapshot",
        h => h,
    };
    match (collection(head), segs.len()) {
        _ if head == "workspace-snapshots" && segs.get(1).is_some_and(|s| s == "operations") => {
            r.scope = Scope::AdminOnly;
        }
        // The dashboard's sandbox routes (`/ui/sandboxes/{id}/pty...`) name
        // the sandbox as the API's do; its reports are the daemon's.
        _ if path.starts_with("/ui/") && segs.get(1).is_some_and(|s| s == "sandboxes") && segs.len() >= 3 => {
            r.tail = segs[3..].to_vec();
            r.scope = Scope::Object(Kind::Sandbox, segs[2].clone());
            r.action = object_action("sandbox", method, &r.tail);
        }
        _ if path.starts_with("/ui/reports") => r.scope = Scope::AdminOnly,
        (Some(kind), 1) if *method == Method::POST => {
            r.scope = Scope::Create(kind);
            r.creates = Some(kind);
            r.action = format!("{noun}.create");
        }
        (Some(kind), n) if n >= 2 => {
            r.tail = segs[2..].to_vec();
            r.scope = Scope::Object(kind, segs[1].clone());
            r.creates = match (kind, r.tail.first().map(String::as_str), method) {
                (Kind::Sandbox, Some("snapshots"), &Method::POST) => Some(Kind::SandboxSnapshot),
                (Kind::Workspace, Some("snapshots"), &Method::POST) => Some(Kind::WorkspaceSnapshot),
                (Kind::WorkspaceSnapshot, Some("restore" | "fork"), &Method::POST) => Some(Kind::Workspace),
                _ => None,
            };
            r.action = object_action(noun, method, &r.tail);
        }
        _ if (head == "images" || head == "templates") && !reads => r.scope = Scope::AdminOnly,
        _ if ADMIN_ONLY.contains(&head) || (head == "metrics" && segs.len() == 1) => r.scope = Scope::AdminOnly,
        _ => {}
    }
    if r.action.is_empty() {
        r.action = format!("{}.{}", if head.is_empty() { "root" } else { head }, method.as_str().to_ascii_lowercase());
    }
    r
}

/// `sandbox.pause`, `sandbox.delete`, `exec`, `file.write`, `policy.update`...
fn object_action(noun: &str, method: &Method, tail: &[String]) -> String {
    let t: Vec<&str> = tail.iter().map(String::as_str).collect();
    match (method, t.as_slice()) {
        (_, ["proxy", port, rest @ ..]) => match (method, rest.first().copied()) {
            (&Method::POST, Some("command")) => "exec".into(),
            (&Method::DELETE, Some("files" | "directories")) => "file.delete".into(),
            (_, Some("files" | "directories")) => "file.write".into(),
            (_, Some("policy")) if *port == "18080" => "policy.update".into(),
            _ => "proxy".into(),
        },
        (_, ["network"]) => "policy.update".into(),
        (&Method::DELETE, []) => format!("{noun}.delete"),
        (&Method::PUT | &Method::PATCH, []) => format!("{noun}.update"),
        (_, [one, ..]) => format!("{noun}.{one}"),
        _ => format!("{noun}.{}", method.as_str().to_ascii_lowercase()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes_name_their_object_and_action() {
        let r = classify(&Method::POST, "/v1/sandboxes/abc/proxy/44772/command");
        assert_eq!((r.scope, r.action.as_str()), (Scope::Object(Kind::Sandbox, "abc".into()), "exec"));
        let r = classify(&Method::POST, "/sandboxes");
        assert_eq!((r.scope, r.action.as_str()), (Scope::Create(Kind::Sandbox), "sandbox.create"));
        let r = classify(&Method::DELETE, "/v1/workspace-snapshots/s%31");
        assert_eq!(
            (r.scope, r.action.as_str()),
            (Scope::Object(Kind::WorkspaceSnapshot, "s1".into()), "workspace.snapshot.delete")
        );
        assert_eq!(classify(&Method::POST, "/v1/workspace-snapshots/s/fork").creates, Some(Kind::Workspace));
        assert_eq!(classify(&Method::POST, "/v1/sandboxes/a/snapshots").creates, Some(Kind::SandboxSnapshot));
        assert_eq!(classify(&Method::PUT, "/v1/sandboxes/a/network").action, "policy.update");
        assert_eq!(classify(&Method::PATCH, "/v1/sandboxes/a/proxy/18080/policy").action, "policy.update");
        for (m, p) in [
            (Method::POST, "/v1/images/pull"),
            (Method::DELETE, "/v1/templates/x"),
            (Method::GET, "/v1/tenants"),
            (Method::GET, "/v1/audit"),
            (Method::GET, "/metrics"),
            (Method::GET, "/v1/workspace-snapshots/operations/x"),
            (Method::POST, "/v1/cluster/call"),
        ] {
            assert_eq!(classify(&m, p).scope, Scope::AdminOnly, "{m} {p}");
        }
        let r = classify(&Method::POST, "/ui/sandboxes/abc/pty");
        assert_eq!((r.scope, r.action.as_str()), (Scope::Object(Kind::Sandbox, "abc".into()), "sandbox.pty"));
        assert_eq!(classify(&Method::GET, "/ui/reports/x.txt").scope, Scope::AdminOnly);
        for (m, p) in [(Method::GET, "/v1/images"), (Method::GET, "/v1/sandboxes"), (Method::GET, "/health")] {
            assert_eq!(classify(&m, p).scope, Scope::Open, "{m} {p}");
        }
    }
}
