//! A registry that misbehaves: a real HTTP server on loopback (written here)
//! that serves a valid manifest and config and then a layer with the wrong
//! content, or answers 401 to everything, or dies in the middle of a blob.
//! Each pull must fail with a clear `{code, message}` and leave no layer, and
//! no half-written file, in the store. The same for an image past the store's
//! caps (`--max-image-bytes`), and for an imported OCI layout whose blob is a
//! symlink. Root tests (a real `ember serve`).
mod common;
#[path = "../src/bench/registry.rs"]
mod registry;

use common::Daemon;
use ember_types::image::PullRequest;
use std::collections::HashMap;
use std::sync::Arc;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[derive(Clone, Copy, PartialEq)]
enum Fault {
    None,
    WrongDigest,
    Unauthorized,
    DiesMidBlob,
}

/// Serves `repo/x:1` from the blobs of an OCI layout, with `fault` applied.
async fn fake_registry(blobs: HashMap<String, Vec<u8>>, manifest: Vec<u8>, fault: Fault) -> String {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap().to_string();
    let state = Arc::new((blobs, manifest));
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            let st = state.clone();
            tokio::spawn(async move {
                let mut buf = vec![0u8; 8192];
                let n = s.read(&mut buf).await.unwrap_or(0);
                let head = String::from_utf8_lossy(&buf[..n]).to_string();
                let mut parts = head.split_whitespace();
                let (method, path) = (parts.next().unwrap_or(""), parts.next().unwrap_or("").to_string());
                let (blobs, manifest) = (&st.0, &st.1);
                let reply = |status: &str, ct: &str, body: &[u8], extra: &str| {
                    let mut r = format!(
                        "HTTP/1.1 {status}\r\nContent-Type: {ct}\r\nContent-Length: {}\r\nConnection: close\r\n{extra}\r\n",
                        body.len()
                    )
                    .into_bytes();
                    if method != "HEAD" {
                        r.extend_from_slice(body);
                    }
                    r
                };
                let out = if fault == Fault::Unauthorized {
                    let body = br#"{"errors":[{"code":"UNAUTHORIZED","message":"authentication required"}]}"#;
                    reply("401 Unauthorized", "application/json", body, "WWW-Authenticate: Basic realm=\"test\"\r\n")
                } else if path == "/v2/" {
                    reply("200 OK", "application/json", b"{}", "")
                } else if path.contains("/manifests/") {
                    let d = ember_image::digest::sha256(manifest);
                    let h = format!("Docker-Content-Digest: {d}\r\n");
                    reply("200 OK", "application/vnd.oci.image.manifest.v1+json", manifest, &h)
                } else if let Some(d) = path.rsplit_once("/blobs/").map(|(_, d)| d.to_string()) {
                    let Some(blob) = blobs.get(&d) else {
                        let _ = s.write_all(&reply("404 Not Found", "application/json", b"{}", "")).await;
                        return;
                    };
                    let layer = blob.len() > 1000;
                    match fault {
                        Fault::WrongDigest if layer => {
                            let mut bad = blob.clone();
                            let i = bad.len() / 2;
                            bad[i] ^= 0xff;
                            reply("200 OK", "application/octet-stream", &bad, "")
                        }
                        Fault::DiesMidBlob if layer => {
                            let mut r = reply("200 OK", "application/octet-stream", blob, "");
                            r.truncate(r.len() - blob.len() / 2);
                            let _ = s.write_all(&r).await;
                            return; // the connection closes half-way through the body
                        }
                        _ => reply("200 OK", "application/octet-stream", blob, ""),
                    }
                } else {
                    reply("404 Not Found", "application/json", b"{}", "")
                };
                let _ = s.write_all(&out).await;
            });
        }
    });
    addr
}

fn image() -> (HashMap<String, Vec<u8>>, Vec<u8>) {
    image_of(&(0..200_000u32).map(|i| (i.wrapping_mul(2654435761) >> 13) as u8).collect::<Vec<_>>())
}

/// An image of one layer holding `d/data`: its blobs by digest, and its manifest.
fn image_of(data: &[u8]) -> (HashMap<String, Vec<u8>>, Vec<u8>) {
    let dir = std::env::temp_dir().join(format!("ember-faults-{}-{}", std::process::id(), rand_tag()));
    let layer = registry::layer_tar(&[registry::Entry::Dir("d"), registry::Entry::File("d/data", data, 0o644)]);
    let md = registry::write_layout(&dir, &[layer], &registry::Config::default(), "1").unwrap();
    let mut blobs = HashMap::new();
    for e in std::fs::read_dir(dir.join("blobs/sha256")).unwrap().flatten() {
        blobs.insert(format!("sha256:{}", e.file_name().to_string_lossy()), std::fs::read(e.path()).unwrap());
    }
    let manifest = blobs[&md].clone();
    let _ = std::fs::remove_dir_all(&dir);
    (blobs, manifest)
}

fn rand_tag() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64
}

async fn pull_fails(fault: Fault, code: &str, needle: &str) {
    let (blobs, manifest) = image();
    pull_fails_with((blobs, manifest), fault, &[], code, needle).await;
}

async fn pull_fails_with(
    (blobs, manifest): (HashMap<String, Vec<u8>>, Vec<u8>),
    fault: Fault,
    flags: &[&str],
    code: &str,
    needle: &str,
) {
    let addr = fake_registry(blobs, manifest, fault).await;
    let d = Daemon::start_with(&[&["--insecure-registry", &addr], flags].concat());
    let req = PullRequest { image: format!("{addr}/repo/x:1"), auth: None };
    let err = d.client.pull_image(&req).await.expect_err("the pull must fail").to_string();
    assert!(err.contains(code), "{err}");
    assert!(err.contains(needle), "{err:?} should mention {needle:?}");
    let store = d.data_dir.join("images");
    let entries = |sub: &str| std::fs::read_dir(store.join(sub)).unwrap().count();
    assert_eq!(entries("layers"), 0, "no layer was published");
    assert_eq!(entries("tmp"), 0, "no half-written download or unpack left behind");
    assert_eq!(entries("refs"), 0, "no image record");
    assert!(d.client.list_images().await.unwrap().items.is_empty());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_layer_with_the_wrong_content_is_refused() {
    pull_fails(Fault::WrongDigest, "IMAGE::DIGEST_MISMATCH", "sha256:").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_401_says_authentication_failed() {
    pull_fails(Fault::Unauthorized, "IMAGE::REGISTRY_UNAUTHORIZED", "authentication").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_registry_dying_mid_blob_leaves_nothing() {
    pull_fails(Fault::DiesMidBlob, "IMAGE::REGISTRY_ERROR", "/repo/x:1").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_layer_decompressing_past_the_cap_is_refused() {
    // 4 MiB of zeros gzip to a few KiB: only the decompressed size is over.
    let image = image_of(&vec![0u8; 4 << 20]);
    let flags = ["--max-image-bytes", "1000000"];
    pull_fails_with(image, Fault::None, &flags, "IMAGE::TOO_LARGE", "over its cap of 1000000 bytes").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_config_past_its_cap_is_refused() {
    let flags = ["--max-image-config-bytes", "100"];
    pull_fails_with(image(), Fault::None, &flags, "IMAGE::TOO_LARGE", "config blob").await;
}

/// An OCI layout whose layer blob is a symlink to a file outside the layout
/// (with the right content, so only the symlink can refuse it).
#[tokio::test(flavor = "multi_thread")]
async fn a_layout_import_with_a_symlinked_blob_is_refused() {
    let d = Daemon::start();
    let tmp = std::env::temp_dir().join(format!("ember-faults-layout-{}-{}", std::process::id(), rand_tag()));
    let layer = registry::layer_tar(&[registry::Entry::File("motd", b"hi\n", 0o644)]);
    let layout = tmp.join("layout");
    registry::write_layout(&layout, std::slice::from_ref(&layer), &registry::Config::default(), "1").unwrap();
    let hex = ember_image::digest::sha256(&registry::gzip(&layer))[7..].to_string();
    let blob = layout.join("blobs/sha256").join(&hex);
    std::fs::rename(&blob, tmp.join("outside")).unwrap();
    std::os::unix::fs::symlink(tmp.join("outside"), &blob).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_ember"))
        .args(["--url", &d.url, "image", "import"])
        .arg(&layout)
        .args(["--name", "local/symlinked:1"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(!out.status.success(), "the import must fail");
    assert!(err.contains("IMAGE::BAD_IMPORT") && err.contains(&hex), "{err}");
    let store = d.data_dir.join("images");
    assert_eq!(std::fs::read_dir(store.join("layers")).unwrap().count(), 0, "no layer was published");
    assert!(d.client.list_images().await.unwrap().items.is_empty());
    let _ = std::fs::remove_dir_all(&tmp);
}
