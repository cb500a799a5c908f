//! The crate stack is one-way. This test reads `cargo metadata` and fails on any
//! dependency edge between ember crates that ARCHITECTURE.md does not allow.
use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;

/// crate → the ember crates it may depend on (normal dependencies).
fn allowed() -> BTreeMap<&'static str, BTreeSet<&'static str>> {
    let m: &[(&str, &[&str])] = &[
        ("ember-types", &[]),
        ("ember-sys", &[]),
        ("ember-cgroups", &["ember-sys"]),
        ("ember-agent-client", &["ember-types"]),
        ("ember-runtime", &["ember-types", "ember-sys", "ember-cgroups", "ember-agent-client"]),
        ("ember-image", &["ember-sys"]),
        ("ember-workspace", &["ember-sys"]),
        ("ember-queue", &["ember-types"]),
        (
            "ember-cluster",
            &[
                "ember-types",
                "ember-queue",
                "ember-engine",
                "ember-image",
                "ember-snapshot",
                "ember-net",
                "ember-workspace",
            ],
        ),
        ("ember-net", &["ember-types", "ember-sys"]),
        (
            "ember-engine",
            &[
                "ember-types",
                // A record's save: `ember_sys::fs::exchange` (store.rs).
                "ember-sys",
                "ember-agent-client",
                "ember-runtime",
                "ember-image",
                "ember-workspace",
                "ember-snapshot",
                "ember-net",
                "ember-queue",
            ],
        ),
        ("ember-api", &["ember-types", "ember-engine", "ember-image", "ember-workspace", "ember-snapshot"]),
        ("ember-client", &["ember-types"]),
        ("ember-operator", &["ember-types", "ember-client"]),
        ("ember-snapshot", &["ember-sys"]),
        (
            "ember",
            &[
                "ember-types",
                "ember-client",
                "ember-api",
                "ember-engine",
                "ember-runtime",
                "ember-cgroups",
                "ember-image",
                "ember-snapshot",
                "ember-workspace",
                "ember-net",
                "ember-queue",
                "ember-cluster",
                "ember-operator",
            ],
        ),
        ("ember-agent", &["ember-types", "ember-sys"]),
    ];
    m.iter().map(|(k, v)| (*k, v.iter().copied().collect())).collect()
}

#[test]
fn crate_dependencies_follow_the_stack() {
    let out = Command::new(env!("CARGO"))
        .args(["metadata", "--format-version", "1", "--no-deps", "--offline"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("cargo metadata runs");
    assert!(out.status.success(), "cargo metadata failed: {}", String::from_utf8_lossy(&out.stderr));
    let meta: serde_json::Value = serde_json::from_slice(&out.stdout).expect("metadata is JSON");
    let allowed = allowed();
    let mut seen = BTreeSet::new();
    let mut violations = Vec::new();
    for pkg in meta["packages"].as_array().expect("packages") {
        let name = pkg["name"].as_str().expect("name");
        seen.insert(name.to_string());
        let Some(ok) = allowed.get(name) else {
            violations
                .push(format!("{name} is not in the architecture table (add it to ARCHITECTURE.md and this test)"));
            continue;
        };
        for dep in pkg["dependencies"].as_array().expect("deps") {
            let dname = dep["name"].as_str().expect("dep name");
            let normal = dep["kind"].is_null();
            if dname.starts_with("ember") && normal && !ok.contains(dname) {
                violations.push(format!("{name} -> {dname} is a forbidden edge"));
            }
        }
    }
    for k in allowed.keys() {
        assert!(seen.contains(*k), "{k} is in the table but not in the workspace");
    }
    assert!(violations.is_empty(), "architecture violations:\n{}", violations.join("\n"));
}

#[test]
fn only_ember_sys_has_unsafe() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let mut offenders = Vec::new();
    for dir in ["crates", "bins"] {
        walk(&root.join(dir), &mut |p| {
            let s = p.to_string_lossy();
            if s.contains("/ember-sys/")
                || !s.ends_with(".rs")
                || s.contains("/target/")
                || s.ends_with("tests/architecture.rs")
            {
                return;
            }
            let text = std::fs::read_to_string(p).unwrap_or_default();
            if text
                .lines()
                .any(|l| l.contains("unsafe {") || l.trim_start().starts_with("unsafe fn") || l.contains("unsafe impl"))
            {
                offenders.push(s.into_owned());
            }
        });
    }
    assert!(offenders.is_empty(), "unsafe code outside ember-sys: {offenders:?}");
}

fn walk(dir: &std::path::Path, f: &mut dyn FnMut(&std::path::Path)) {
    let Ok(rd) = std::fs::read_dir(dir) else { return };
    for e in rd.flatten() {
        let p = e.path();
        if p.is_dir() {
            walk(&p, f);
        } else {
            f(&p);
        }
    }
}

/// The API reaches the engine only through the seam (`ember_engine::ControlPlane`):
/// the cluster puts another implementation behind the same routes, so any use
/// of the concrete `Engine` in ember-api (a type, a path, a doc link) would be
/// a call that implementation cannot route. `EngineError` and other plain data
/// types are fine: the word is matched whole.
#[test]
fn api_reaches_the_engine_only_through_the_seam() {
    let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../crates/ember-api/src");
    // A moved directory would make the check pass on nothing.
    assert!(src.join("lib.rs").is_file(), "{} holds no lib.rs", src.display());
    let mut offenders = Vec::new();
    walk(&src, &mut |p| {
        if p.extension().is_some_and(|e| e == "rs") {
            let text = std::fs::read_to_string(p).unwrap_or_default();
            for (n, line) in text.lines().enumerate() {
                if names_engine(line) {
                    offenders.push(format!("{}:{}: {}", p.display(), n + 1, line.trim()));
                }
            }
        }
    });
    assert!(offenders.is_empty(), "ember-api names the concrete Engine:\n{}", offenders.join("\n"));
}

/// Inside ember-engine the `Engine` is only the composition root: it wires
/// the services (sandboxes, pools, workspaces, snapshots, tasks, network,
/// catalog) and implements the seam. A service depends on the services it
/// is handed, never on the engine, so no file but `lib.rs` and the seam
/// (`seam.rs`, `seam/`) may name it: an `impl Engine` block elsewhere, or a
/// function taking the engine, would be the one type sliced over the crate
/// again.
#[test]
fn only_the_composition_root_and_the_seam_name_the_engine() {
    let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../crates/ember-engine/src");
    assert!(src.join("lib.rs").is_file(), "{} holds no lib.rs", src.display());
    let allowed = |p: &std::path::Path| {
        let rel = p.strip_prefix(&src).unwrap_or(p);
        rel == std::path::Path::new("lib.rs") || rel == std::path::Path::new("seam.rs") || rel.starts_with("seam")
    };
    let (mut offenders, mut files) = (Vec::new(), 0);
    walk(&src, &mut |p| {
        if p.extension().is_some_and(|e| e == "rs") {
            files += 1;
            if allowed(p) {
                return;
            }
            let text = std::fs::read_to_string(p).unwrap_or_default();
            for (n, line) in text.lines().enumerate() {
                if names_engine(line) {
                    offenders.push(format!("{}:{}: {}", p.display(), n + 1, line.trim()));
                }
            }
        }
    });
    // A moved tree would make the check pass on nothing.
    assert!(files > 20, "only {files} source files under {}", src.display());
    assert!(
        offenders.is_empty(),
        "ember-engine files other than lib.rs and seam/ name the Engine:\n{}",
        offenders.join("\n")
    );
}

/// Whether `line` holds the identifier `Engine` (not a longer one such as `EngineError`).
fn names_engine(line: &str) -> bool {
    let ident = |c: char| c.is_ascii_alphanumeric() || c == '_';
    line.match_indices("Engine").any(|(i, w)| {
        !line[..i].chars().next_back().is_some_and(ident) && !line[i + w.len()..].chars().next().is_some_and(ident)
    })
}

#[test]
fn names_engine_matches_the_whole_word_only() {
    assert!(names_engine("use ember_engine::Engine;"));
    assert!(names_engine("pub engine: Arc<Engine>,"));
    assert!(names_engine("Engine::get(&e, id)"));
    assert!(!names_engine("use ember_engine::EngineError;"));
    assert!(!names_engine("let engine = MyEngine::new();"));
    assert!(!names_engine("ember_engine::connect_agent(&s)"));
}
