//! A real registry for the image bench and the image tests: Debian's
//! `docker-registry` (the distribution registry) started on loopback with a
//! config written to a temp dir, OCI image layouts built here, and `skopeo`
//! pushing them. Shared by `ember bench image` and bins/ember/tests.
#![allow(dead_code, reason = "the bench and each test use different parts")]

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A running `docker-registry serve` on 127.0.0.1; killed and removed on drop.
pub struct Registry {
    child: Child,
    pub addr: String,
    dir: PathBuf,
}

pub fn free_port() -> std::io::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

impl Registry {
    /// Starts a registry on `port` (0: any free one) with its storage in a temp dir.
    pub fn start(port: u16) -> Result<Registry, String> {
        let port = if port == 0 { free_port().map_err(|e| e.to_string())? } else { port };
        let dir = std::env::temp_dir().join(format!("ember-registry-{}-{port}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("data")).map_err(|e| e.to_string())?;
        let addr = format!("127.0.0.1:{port}");
        let config = format!(
            "version: 0.1\nlog:\n  level: error\n  accesslog:\n    disabled: true\nstorage:\n  filesystem:\n    rootdirectory: {}\n  delete:\n    enabled: true\nhttp:\n  addr: {addr}\n",
            dir.join("data").display()
        );
        std::fs::write(dir.join("config.yml"), config).map_err(|e| e.to_string())?;
        let child = Command::new("docker-registry")
            .arg("serve")
            .arg(dir.join("config.yml"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("starting docker-registry (scripts/bench-setup.sh installs docker-registry): {e}"))?;
        let reg = Registry { child, addr, dir };
        let deadline = Instant::now() + Duration::from_secs(15);
        while Instant::now() < deadline {
            if http_status(&reg.addr, "/v2/").is_some() {
                return Ok(reg);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Err(format!("docker-registry did not answer on {}", reg.addr))
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn http_status(addr: &str, path: &str) -> Option<u16> {
    let mut s = std::net::TcpStream::connect(addr).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    write!(s, "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").ok()?;
    let mut buf = [0u8; 64];
    let n = s.read(&mut buf).ok()?;
    String::from_utf8_lossy(&buf[..n]).split(' ').nth(1)?.parse().ok()
}

/// One entry of a layer tar.
pub enum Entry<'a> {
    Dir(&'a str),
    File(&'a str, &'a [u8], u32),
    Symlink(&'a str, &'a str),
}

/// An uncompressed layer tar, owned by root.
pub fn layer_tar(entries: &[Entry]) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    for e in entries {
        let mut h = tar::Header::new_ustar();
        h.set_uid(0);
        h.set_gid(0);
        h.set_mtime(1_700_000_000);
        let (path, data): (&str, &[u8]) = match e {
            Entry::Dir(p) => {
                h.set_entry_type(tar::EntryType::Directory);
                h.set_mode(0o755);
                (p, b"")
            }
            Entry::File(p, d, mode) => {
                h.set_entry_type(tar::EntryType::Regular);
                h.set_mode(*mode);
                (p, d)
            }
            Entry::Symlink(p, t) => {
                h.set_entry_type(tar::EntryType::Symlink);
                h.set_mode(0o777);
                h.set_link_name(t).expect("link name");
                (p, b"")
            }
        };
        h.set_size(data.len() as u64);
        b.append_data(&mut h, path, data).expect("append to an in-memory tar");
    }
    b.into_inner().expect("finish tar")
}

pub fn gzip(data: &[u8]) -> Vec<u8> {
    let mut w = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    w.write_all(data).expect("gzip in memory");
    w.finish().expect("gzip in memory")
}

/// Image config settings for [`write_layout`].
#[derive(Default)]
pub struct Config<'a> {
    pub env: &'a [&'a str],
    pub workdir: Option<&'a str>,
    pub user: Option<&'a str>,
    pub entrypoint: &'a [&'a str],
    pub cmd: &'a [&'a str],
}

/// Writes an OCI image layout at `dir` with `layers` (uncompressed tars,
/// bottom first, stored gzipped) tagged `tag`; returns the manifest digest.
pub fn write_layout(dir: &Path, layers: &[Vec<u8>], cfg: &Config, tag: &str) -> std::io::Result<String> {
    let sha = ember_image::digest::sha256;
    let blobs = dir.join("blobs/sha256");
    std::fs::create_dir_all(&blobs)?;
    let put = |data: &[u8]| -> std::io::Result<String> {
        let d = sha(data);
        std::fs::write(blobs.join(&d[7..]), data)?;
        Ok(d)
    };
    let mut descs = Vec::new();
    let mut diff_ids = Vec::new();
    for l in layers {
        diff_ids.push(sha(l));
        let gz = gzip(l);
        descs.push(serde_json::json!({
            "mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", "digest": put(&gz)?, "size": gz.len()
        }));
    }
    let (os, arch) = ember_image::platform();
    let mut c = serde_json::json!({"Env": cfg.env, "Entrypoint": cfg.entrypoint, "Cmd": cfg.cmd});
    if let Some(w) = cfg.workdir {
        c["WorkingDir"] = w.into();
    }
    if let Some(u) = cfg.user {
        c["User"] = u.into();
    }
    let config = serde_json::to_vec(&serde_json::json!({
        "architecture": arch, "os": os, "config": c, "rootfs": {"type": "layers", "diff_ids": diff_ids}
    }))?;
    let manifest = serde_json::to_vec(&serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": put(&config)?, "size": config.len()},
        "layers": descs,
    }))?;
    let md = put(&manifest)?;
    let index = serde_json::json!({
        "schemaVersion": 2,
        "manifests": [{
            "mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": md, "size": manifest.len(),
            "annotations": {"org.opencontainers.image.ref.name": tag}
        }]
    });
    std::fs::write(dir.join("index.json"), serde_json::to_vec(&index)?)?;
    std::fs::write(dir.join("oci-layout"), br#"{"imageLayoutVersion":"1.0.0"}"#)?;
    Ok(md)
}

/// `skopeo copy oci:DIR:TAG docker://DEST` over plain http.
pub fn push(layout: &Path, tag: &str, dest: &str) -> Result<(), String> {
    let out = Command::new("skopeo")
        .args(["--insecure-policy", "copy", "--quiet", "--dest-tls-verify=false"])
        .arg(format!("oci:{}:{tag}", layout.display()))
        .arg(format!("docker://{dest}"))
        .output()
        .map_err(|e| format!("running skopeo (scripts/bench-setup.sh installs skopeo): {e}"))?;
    if !out.status.success() {
        return Err(format!("skopeo copy to {dest}: {}", String::from_utf8_lossy(&out.stderr)));
    }
    Ok(())
}
