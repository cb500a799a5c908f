//! OCI images end to end, against a real registry: Debian's `docker-registry`
//! on loopback, images built here (a busybox-static base, a second image on the
//! same base with whiteouts and an opaque dir, an image with no shell), pushed
//! with `skopeo`, pulled by a real `ember serve`, and sandboxes created from
//! them. Root tests.
mod common;
#[path = "../src/bench/registry.rs"]
mod registry;

use common::Daemon;
use ember_types::api::{CreateSandboxRequest, ImageSpec};
use ember_types::execd::RunCommandRequest;
use ember_types::image::{PullRequest, TemplateRequest};
use registry::{layer_tar, push, write_layout, Config, Entry, Registry};

fn busybox() -> Vec<u8> {
    std::fs::read("/bin/busybox").expect("/bin/busybox (apt-get install busybox-static)")
}

/// The shared base: busybox, a few applets, /etc/passwd with an `app` user,
/// and files the upper layer deletes.
fn base_layer() -> Vec<u8> {
    let bb = busybox();
    let mut e = vec![
        Entry::Dir("bin"),
        Entry::File("bin/busybox", &bb, 0o755),
        Entry::Dir("etc"),
        Entry::File("etc/passwd", b"root:x:0:0:root:/root:/bin/sh\napp:x:1234:1234:app:/home/app:/bin/sh\n", 0o644),
        Entry::File("etc/group", b"root:x:0:\napp:x:1234:\n", 0o644),
        Entry::File("etc/motd", b"from the base layer\n", 0o644),
        Entry::Dir("opt"),
        Entry::File("opt/gone.txt", b"deleted above\n", 0o644),
        Entry::Dir("opt/dir"),
        Entry::File("opt/dir/old", b"hidden by an opaque dir above\n", 0o644),
        Entry::Dir("home"),
        Entry::Dir("home/app"),
    ];
    for a in ["sh", "ls", "cat", "echo", "id", "pwd", "test", "env"] {
        e.push(Entry::Symlink(Box::leak(format!("bin/{a}").into_boxed_str()), "busybox"));
    }
    layer_tar(&e)
}

fn upper_layer() -> Vec<u8> {
    layer_tar(&[
        Entry::Dir("opt"),
        Entry::File("opt/.wh.gone.txt", b"", 0o644),
        Entry::Dir("opt/dir"),
        Entry::File("opt/dir/.wh..wh..opq", b"", 0o644),
        Entry::File("opt/dir/new", b"added above\n", 0o644),
        Entry::Dir("app"),
        Entry::File("app/hello.txt", b"hello from the upper layer\n", 0o644),
    ])
}

async fn out(d: &Daemon, id: &str, argv: &[&str]) -> (Option<i32>, String, String) {
    let req = RunCommandRequest { argv: Some(argv.iter().map(|s| s.to_string()).collect()), ..Default::default() };
    d.run(id, &req).await
}

async fn create(d: &Daemon, image: &str) -> String {
    let req = CreateSandboxRequest { image: Some(ImageSpec { uri: image.into(), auth: None }), ..Default::default() };
    d.client.create_sandbox(&req).await.unwrap_or_else(|e| panic!("create from {image}: {e}")).0.id
}

#[tokio::test(flavor = "multi_thread")]
async fn images_from_a_real_registry_share_layers_and_honour_config() {
    let reg = Registry::start(0).expect("a local docker-registry");
    let tmp = std::env::temp_dir().join(format!("ember-images-e2e-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    let base = base_layer();
    let cfg_a = Config {
        env: &["PATH=/bin", "FOO=from-image"],
        workdir: Some("/opt"),
        user: Some("app"),
        cmd: &["sh"],
        ..Default::default()
    };
    write_layout(&tmp.join("a"), std::slice::from_ref(&base), &cfg_a, "1").unwrap();
    write_layout(
        &tmp.join("b"),
        &[base.clone(), upper_layer()],
        &Config { env: &["PATH=/bin"], ..Default::default() },
        "1",
    )
    .unwrap();
    let nosh = layer_tar(&[Entry::Dir("bin"), Entry::File("bin/busybox", &busybox(), 0o755)]);
    write_layout(&tmp.join("nosh"), &[nosh], &Config::default(), "1").unwrap();
    for n in ["a", "b", "nosh"] {
        push(&tmp.join(n), "1", &format!("{}/ember-test/{n}:1", reg.addr)).expect("skopeo push");
    }
    let d = Daemon::start_with(&["--insecure-registry", &reg.addr]);
    let name = |n: &str| format!("{}/ember-test/{n}:1", reg.addr);

    // Two concurrent pulls of one image share one download and agree.
    let pr = PullRequest { image: name("a"), auth: None };
    let (x, y) = tokio::join!(d.client.pull_image(&pr), d.client.pull_image(&pr));
    let (x, y) = (x.expect("pull a"), y.expect("concurrent pull a"));
    assert_eq!(x, y);
    let b = d.client.pull_image(&PullRequest { image: name("b"), auth: None }).await.expect("pull b");
    assert_eq!(b.layers.len(), 2);
    assert_eq!(b.layers[0].digest, x.layers[0].digest, "b's base layer is a's layer");
    let list = d.client.list_images().await.unwrap();
    assert_eq!(list.layers.len(), 2, "the shared base is stored once: {:?}", list.layers);
    let shared = list.layers.iter().find(|l| l.digest == x.layers[0].digest).unwrap();
    assert_eq!(shared.images, 2);
    let on_disk = std::fs::read_dir(d.data_dir.join("images/layers")).unwrap().count();
    assert_eq!(on_disk, 2, "one directory per distinct layer");

    // Image a: User, WorkingDir and Env from its config; Cmd (a shell) does not
    // run as the entrypoint, so the sandbox stays up.
    let a = create(&d, &name("a")).await;
    let (code, o, e) = out(&d, &a, &["sh", "-c", "id -u; id -g; pwd; echo $FOO; cat /etc/motd"]).await;
    assert_eq!(code, Some(0), "{e}");
    assert_eq!(o, "1234\n1234\n/opt\nfrom-image\nfrom the base layer\n");
    let (_, o, _) = out(&d, &a, &["ls", "/opt", "/opt/dir"]).await;
    assert!(o.contains("gone.txt") && o.contains("old"), "a has the base's files: {o}");
    // Writes land in the sandbox's upper layer, never in the shared layer.
    let (code, o, e) = d.sh(&a, "echo mine > /opt/gone.txt && cat /opt/gone.txt", Some(0)).await;
    assert_eq!((code, o.as_str()), (Some(0), "mine\n"), "{e}");
    let layer = d.data_dir.join("images/layers").join(x.layers[0].digest.replace(':', "-"));
    assert_eq!(std::fs::read_to_string(layer.join("rootfs/opt/gone.txt")).unwrap(), "deleted above\n");

    // Image b: the whiteout deleted gone.txt, the opaque dir hides old.
    let bid = create(&d, &name("b")).await;
    let (_, o, _) = out(
        &d,
        &bid,
        &["sh", "-c", "test -e /opt/gone.txt || echo gone; ls /opt/dir; cat /app/hello.txt /opt/gone.txt"],
    )
    .await;
    assert_eq!(o, "gone\nnew\nhello from the upper layer\n", "whiteouts as specified");
    let (_, o, _) = out(&d, &bid, &["id", "-u"]).await;
    assert_eq!(o, "0\n", "no User in b's config: root (of the user namespace)");

    // The OCI classes mount the same layers (overlay with `userxattr`, so the
    // opaque marker counts) and honour the same config.
    for class in ["crun", "runc", "runsc"] {
        let on = |image: &str| CreateSandboxRequest {
            image: Some(ImageSpec { uri: name(image), auth: None }),
            runtime_class: Some(class.into()),
            ..Default::default()
        };
        let ob = d.client.create_sandbox(&on("b")).await.unwrap_or_else(|e| panic!("{class}: image b: {e}")).0.id;
        let (_, o, e) = out(
            &d,
            &ob,
            &["sh", "-c", "test -e /opt/gone.txt || echo gone; ls /opt/dir; cat /app/hello.txt /opt/gone.txt"],
        )
        .await;
        assert_eq!(o, "gone\nnew\nhello from the upper layer\n", "{class}: whiteouts and opaque dir: {e}");
        let oa = d.client.create_sandbox(&on("a")).await.unwrap_or_else(|e| panic!("{class}: image a: {e}")).0.id;
        let (code, o, e) =
            out(&d, &oa, &["sh", "-c", "id -u; pwd; echo $FOO; test -e /usr/bin/perl && echo host-usr"]).await;
        assert_eq!(code, Some(1), "{class}: the host's /usr is bound into an image sandbox: {o}");
        assert_eq!(o, "1234\n/opt\nfrom-image\n", "{class}: image config: {e}");
        for id in [ob, oa] {
            d.client.delete_sandbox(&id).await.expect("delete");
        }
    }

    // An image with no /bin/sh still runs argv commands (pulled on create).
    let n = create(&d, &name("nosh")).await;
    let (code, o, _) = out(&d, &n, &["/bin/busybox", "echo", "no shell needed"]).await;
    assert_eq!((code, o.as_str()), (Some(0), "no shell needed\n"));
    let (code, _, _) = d.sh(&n, "echo hi", None).await;
    assert_ne!(code, Some(0), "a shell command cannot run without a shell");

    // A template pre-pulls, overrides the image's user, env and workdir.
    let t = TemplateRequest {
        name: "busy".into(),
        image: Some(name("b")),
        user: Some("app".into()),
        workdir: Some("/app".into()),
        env: Some([("FOO".to_string(), "from-template".to_string())].into()),
        resources: Some(ember_types::ResourcesSpec { memory: Some("64Mi".into()), ..Default::default() }),
        ..Default::default()
    };
    let ti = d.client.create_template(&t).await.expect("create template");
    assert_eq!(ti.image_digest.as_deref(), Some(b.digest.as_str()));
    let req = CreateSandboxRequest { template: Some("busy".into()), ..Default::default() };
    let (info, _) = d.client.create_sandbox(&req).await.expect("create from template");
    assert_eq!(info.resources.memory_bytes, 64 << 20);
    let (_, o, _) = out(&d, &info.id, &["sh", "-c", "id -u; pwd; echo $FOO"]).await;
    assert_eq!(o, "1234\n/app\nfrom-template\n");

    // An image a template uses cannot be removed; prune keeps live layers.
    let err = d.client.remove_image(&name("b")).await.unwrap_err().to_string();
    assert!(err.contains("IMAGE::IN_USE"), "{err}");
    for id in [&a, &bid, &n, &info.id] {
        d.client.delete_sandbox(id).await.unwrap();
    }
    d.client.delete_template("busy").await.unwrap();
    for i in ["a", "b", "nosh"] {
        d.client.remove_image(&name(i)).await.unwrap();
    }
    let pruned = d.client.prune_images().await.unwrap();
    assert_eq!(pruned.removed_layers.len(), 3, "{pruned:?}");
    assert_eq!(std::fs::read_dir(d.data_dir.join("images/layers")).unwrap().count(), 0);
    let _ = std::fs::remove_dir_all(&tmp);
}

#[tokio::test(flavor = "multi_thread")]
async fn import_a_directory_and_an_oci_layout() {
    let d = Daemon::start();
    let tmp = std::env::temp_dir().join(format!("ember-images-import-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    write_layout(&tmp.join("layout"), &[base_layer()], &Config { env: &["PATH=/bin"], ..Default::default() }, "v2")
        .unwrap();
    // The CLI packs the layout dir and uploads it.
    let st = std::process::Command::new(env!("CARGO_BIN_EXE_ember"))
        .args(["--url", &d.url, "image", "import"])
        .arg(tmp.join("layout"))
        .args(["--name", "local/layout:v2", "--json"])
        .output()
        .unwrap();
    assert!(st.status.success(), "{}", String::from_utf8_lossy(&st.stderr));
    let info: ember_types::image::ImageInfo = serde_json::from_slice(&st.stdout).unwrap();
    assert_eq!(info.layers.len(), 1);
    // A plain root filesystem dir becomes a one-layer image.
    std::fs::create_dir_all(tmp.join("rootfs/bin")).unwrap();
    std::fs::copy("/bin/busybox", tmp.join("rootfs/bin/busybox")).unwrap();
    let st = std::process::Command::new(env!("CARGO_BIN_EXE_ember"))
        .args(["--url", &d.url, "run", "--image", "local/layout:v2", "--", "cat", "/etc/motd"])
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&st.stdout), "from the base layer\n", "{}", String::from_utf8_lossy(&st.stderr));
    let st = std::process::Command::new(env!("CARGO_BIN_EXE_ember"))
        .args(["--url", &d.url, "image", "import"])
        .arg(tmp.join("rootfs"))
        .args(["--name", "local/dir:1"])
        .output()
        .unwrap();
    assert!(st.status.success(), "{}", String::from_utf8_lossy(&st.stderr));
    let id = create(&d, "local/dir:1").await;
    let (code, o, _) = out(&d, &id, &["/bin/busybox", "echo", "imported"]).await;
    assert_eq!((code, o.as_str()), (Some(0), "imported\n"));
    d.client.delete_sandbox(&id).await.unwrap();
    let _ = std::fs::remove_dir_all(&tmp);
}

/// `ember image import PATH --name NAME [--json]` against `d`.
fn import(d: &Daemon, path: &std::path::Path, name: &str, json: bool) -> std::process::Output {
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_ember"));
    cmd.args(["--url", &d.url, "image", "import"]).arg(path).args(["--name", name]);
    if json {
        cmd.arg("--json");
    }
    cmd.output().unwrap()
}

/// The answer of a `--json` import that must succeed.
fn imported(st: std::process::Output) -> ember_types::image::ImageInfo {
    assert!(st.status.success(), "{}", String::from_utf8_lossy(&st.stderr));
    serde_json::from_slice(&st.stdout).unwrap()
}

/// `ember image import DIR` of a debootstrap-like rootfs: a real character
/// device (made with mknod) under `/dev` is skipped with a warning, counted
/// in the answer, and everything else is imported and runs; so is it in the
/// same tree as a tarball (`docker export`'s form).
#[tokio::test(flavor = "multi_thread")]
async fn import_of_a_rootfs_with_device_nodes_skips_them() {
    let d = Daemon::start();
    let tmp = std::env::temp_dir().join(format!("ember-images-devnodes-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    let root = tmp.join("rootfs");
    std::fs::create_dir_all(root.join("bin")).unwrap();
    std::fs::create_dir_all(root.join("dev")).unwrap();
    std::fs::copy("/bin/busybox", root.join("bin/busybox")).unwrap();
    std::fs::write(root.join("motd"), "beside a device\n").unwrap();
    let st = std::process::Command::new("mknod").arg(root.join("dev/null")).args(["c", "1", "3"]).status().unwrap();
    assert!(st.success(), "mknod (the tests run as root)");
    let info = imported(import(&d, &root, "local/devnodes:1", true));
    assert_eq!(info.skipped_device_nodes, 1, "{info:?}");
    assert!(info.warnings.iter().any(|w| w.contains("1 device nodes skipped")), "{info:?}");
    // Without --json the warning goes to stderr.
    let st = import(&d, &root, "local/devnodes:2", false);
    assert!(String::from_utf8_lossy(&st.stderr).contains("warning: 1 device nodes skipped"), "{st:?}");
    // The same tree as a tarball (what `docker export` writes).
    let tar = tmp.join("rootfs.tar");
    let st = std::process::Command::new("tar").arg("-C").arg(&root).arg("-cf").arg(&tar).arg(".").status().unwrap();
    assert!(st.success(), "tar");
    let info = imported(import(&d, &tar, "local/devnodes:3", true));
    assert_eq!(info.skipped_device_nodes, 1, "a tarball's device node: {info:?}");
    let id = create(&d, "local/devnodes:1").await;
    let (code, o, _) = out(&d, &id, &["/bin/busybox", "cat", "/motd"]).await;
    assert_eq!((code, o.as_str()), (Some(0), "beside a device\n"));
    d.client.delete_sandbox(&id).await.unwrap();
    let _ = std::fs::remove_dir_all(&tmp);
}
