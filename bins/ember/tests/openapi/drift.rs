//! The document against the router sources (every route documented, nothing
//! else) and its own consistency (headers, `$ref`s).
use super::*;

/// `.route("path", methods)` calls in `src`: (byte offset, path, methods).
fn routes_in(src: &str) -> Vec<(usize, String, BTreeSet<String>)> {
    let mut out = Vec::new();
    for (at, _) in src.match_indices(".route(") {
        let start = at + ".route(".len();
        let mut depth = 1;
        let mut end = start;
        for (i, c) in src[start..].char_indices() {
            match c {
                '(' => depth += 1,
                ')' => depth -= 1,
                _ => {}
            }
            if depth == 0 {
                end = start + i;
                break;
            }
        }
        let call = &src[start..end];
        let q1 = call.find('"').expect("a path literal");
        let q2 = call[q1 + 1..].find('"').expect("closing quote") + q1 + 1;
        let path = call[q1 + 1..q2].to_string();
        let rest = &call[q2 + 1..];
        let mut methods = BTreeSet::new();
        for m in ["get", "post", "put", "patch", "delete", "any"] {
            for (i, _) in rest.match_indices(&format!("{m}(")) {
                let before = rest[..i].chars().last().unwrap_or(' ');
                if !(before.is_alphanumeric() || before == '_') {
                    methods.insert(m.to_string());
                }
            }
        }
        if methods.remove("any") {
            methods.extend(["get", "post", "put", "patch", "delete"].map(String::from));
        }
        out.push((at, path, methods));
    }
    out
}

/// `{anything}` → `{}`, `{*rest}` included: names do not matter, shapes do.
fn shape(path: &str) -> String {
    let mut out = String::new();
    let mut skip = false;
    for c in path.chars() {
        match c {
            '{' => {
                skip = true;
                out.push_str("{}");
            }
            '}' => skip = false,
            _ if !skip => out.push(c),
            _ => {}
        }
    }
    out
}

#[test]
fn the_document_has_every_route_and_only_routes() {
    let lib = repo_file("crates/ember-api/src/lib.rs");
    assert!(
        lib.contains(".nest(\"/v1\", v1)") && lib.contains(".merge(lifecycle())"),
        "the document says lifecycle routes are served under /v1 and bare: the router changed"
    );
    let span = |from: &str, to: &str| {
        let a = lib.find(from).unwrap_or_else(|| panic!("{from:?} not in lib.rs"));
        (a, a + lib[a..].find(to).expect("end of span"))
    };
    let lifecycle = span("fn lifecycle()", "\n}\n");
    let v1 = span("let v1 =", ";");
    let mut router: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (at, path, methods) in routes_in(&lib) {
        let in_v1 = (lifecycle.0..lifecycle.1).contains(&at) || (v1.0..v1.1).contains(&at);
        let full = if in_v1 { format!("/v1{path}") } else { path };
        router.entry(shape(&full.replace("{*rest}", "{path}"))).or_default().extend(methods);
    }
    // The dashboard's routes (`ember serve --ui`), merged at their full paths.
    let ui = repo_file("crates/ember-api/src/ui/mod.rs");
    assert!(lib.contains("ui::routes()"), "the document says the /ui routes are merged at /ui: the router changed");
    for (_, path, methods) in routes_in(&ui) {
        router.entry(shape(&path.replace("{*rest}", "{path}"))).or_default().extend(methods);
    }
    let agent = repo_file("bins/ember-agent/src/server.rs");
    assert!(
        agent.contains(".nest(\"/v1/filesystem/{uid}/{gid}\", file_routes()"),
        "the document says the file routes are also served under /v1/filesystem/{{uid}}/{{gid}}: the agent changed"
    );
    let files_at = agent.find("fn file_routes()").expect("fn file_routes in the agent");
    for (at, path, methods) in routes_in(&agent) {
        // `/ember/...` are the daemon's private control routes; the proxy refuses them.
        if path.starts_with("/ember/") {
            continue;
        }
        if at > files_at {
            let scoped = shape(&format!("{EXECD}/v1/filesystem/{{uid}}/{{gid}}{path}"));
            router.entry(scoped).or_default().extend(methods.clone());
        }
        router.entry(shape(&format!("{EXECD}{path}"))).or_default().extend(methods);
    }

    let doc = load_doc();
    let mut documented: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (path, item) in doc["paths"].as_object().expect("paths") {
        let methods = item.as_object().expect("path item").keys();
        let ops = methods.filter(|m| ["get", "post", "put", "patch", "delete"].contains(&m.as_str()));
        documented.entry(shape(path)).or_default().extend(ops.cloned());
    }
    let only_router: Vec<_> = router.iter().filter(|(p, m)| documented.get(*p) != Some(m)).collect();
    let only_doc: Vec<_> = documented.iter().filter(|(p, m)| router.get(*p) != Some(m)).collect();
    assert!(
        only_router.is_empty() && only_doc.is_empty(),
        "router and document disagree\n in the router: {only_router:#?}\n in the document: {only_doc:#?}"
    );
    assert!(router.len() >= 30, "the route parser found too little: {router:#?}");
}

#[test]
fn every_response_declares_x_request_id_and_every_ref_resolves() {
    let doc = load_doc();
    let v = Validator::new(&doc);
    fn refs<'a>(x: &'a Value, out: &mut Vec<&'a str>) {
        match x {
            Value::Object(m) => m.iter().for_each(|(k, v)| match (k.as_str(), v) {
                ("$ref", Value::String(r)) => out.push(r),
                _ => refs(v, out),
            }),
            Value::Array(a) => a.iter().for_each(|v| refs(v, out)),
            _ => {}
        }
    }
    let mut all = Vec::new();
    refs(&doc, &mut all);
    for r in all {
        v.resolve(r).unwrap_or_else(|e| panic!("{e}"));
    }
    let mut checked = 0;
    for (path, item) in doc["paths"].as_object().expect("paths") {
        for (method, op) in item.as_object().expect("item").iter().filter(|(_, op)| op.get("responses").is_some()) {
            for (status, r) in op["responses"].as_object().expect("responses") {
                let r = r.get("$ref").and_then(Value::as_str).map_or(r, |x| v.resolve(x).expect("ref"));
                assert!(r["headers"]["X-Request-ID"].is_object(), "{method} {path} {status} lacks X-Request-ID");
                checked += 1;
            }
        }
    }
    assert!(checked > 100);
}

/// Every operation whose answer can come from the engine or a sandbox's
/// agent (it documents a 500, or the 502 of an unreachable agent; a
/// registry's 502 is not one) documents the 503 a cluster node
/// answers when the node holding the object is dead or the sandbox is being
/// re-created elsewhere (`CLUSTER::NODE_UNAVAILABLE`), which the documented
/// client policy retries. The document had none.
#[test]
fn every_operation_that_can_fail_server_side_documents_the_retryable_503() {
    let doc = load_doc();
    let mut missing = Vec::new();
    for (path, item) in doc["paths"].as_object().expect("paths") {
        for (method, op) in item.as_object().expect("path item") {
            let Some(responses) = op.get("responses").and_then(Value::as_object) else { continue };
            let agent = responses.get("502").is_some_and(|r| r["$ref"] == "#/components/responses/AgentUnreachable");
            let server_side = responses.contains_key("500") || agent;
            if server_side && !responses.contains_key("503") {
                missing.push(format!("{method} {path}"));
            }
        }
    }
    assert!(missing.is_empty(), "no 503 documented: {missing:#?}");
    let unavailable = &doc["components"]["responses"]["Unavailable"]["description"];
    let says = unavailable.as_str().unwrap_or_default();
    assert!(says.contains("CLUSTER::NODE_UNAVAILABLE") && says.contains("TASK::QUEUE_UNAVAILABLE"), "{unavailable}");
}
