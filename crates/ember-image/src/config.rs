//! The parts of an OCI image config ember honours (Env, WorkingDir, User,
//! Entrypoint, Cmd), and resolving the image's user through the image's own
//! `/etc/passwd` and `/etc/group` (never the host's NSS).
use crate::ImageError;
use serde::{Deserialize, Serialize};
use std::path::PathBuf;

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ImageConfig {
    #[serde(default)]
    pub env: Vec<String>,
    #[serde(default)]
    pub working_dir: Option<String>,
    #[serde(default)]
    pub user: Option<String>,
    #[serde(default)]
    pub entrypoint: Vec<String>,
    #[serde(default)]
    pub cmd: Vec<String>,
}

/// The OCI config blob, as much of it as ember reads.
#[derive(Deserialize)]
pub(crate) struct ConfigBlob {
    #[serde(default)]
    pub config: Option<RawConfig>,
    #[serde(default)]
    pub rootfs: Option<RootFs>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "PascalCase")]
pub(crate) struct RawConfig {
    #[serde(default)]
    env: Option<Vec<String>>,
    #[serde(default)]
    working_dir: Option<String>,
    #[serde(default)]
    user: Option<String>,
    #[serde(default)]
    entrypoint: Option<Vec<String>>,
    #[serde(default)]
    cmd: Option<Vec<String>>,
}

#[derive(Deserialize)]
pub(crate) struct RootFs {
    #[serde(default)]
    pub diff_ids: Vec<String>,
}

impl ConfigBlob {
    pub fn parse(reference: &str, data: &[u8]) -> Result<ConfigBlob, ImageError> {
        serde_json::from_slice(data).map_err(|e| ImageError::Registry {
            reference: reference.to_string(),
            message: format!("image config is not valid JSON: {e}"),
        })
    }

    pub fn image_config(&self) -> ImageConfig {
        let c = self.config.as_ref();
        let get = |f: fn(&RawConfig) -> Option<Vec<String>>| c.and_then(f).unwrap_or_default();
        ImageConfig {
            env: get(|c| c.env.clone()),
            working_dir: c.and_then(|c| c.working_dir.clone()).filter(|w| !w.is_empty()),
            user: c.and_then(|c| c.user.clone()).filter(|u| !u.is_empty()),
            entrypoint: get(|c| c.entrypoint.clone()),
            cmd: get(|c| c.cmd.clone()),
        }
    }
}

/// Reads `rel` (e.g. `etc/passwd`) from the top-most layer that has it, without
/// following symlinks on the host: a symlinked `etc` or file is treated as
/// absent. A whiteout ends the search. `layers` are top first.
pub fn read_from_layers(layers: &[PathBuf], rel: &str) -> Option<String> {
    for l in layers {
        let mut cur = l.clone();
        let parts: Vec<&str> = rel.split('/').collect();
        for (i, p) in parts.iter().enumerate() {
            cur.push(p);
            let Ok(m) = std::fs::symlink_metadata(&cur) else { break };
            let last = i + 1 == parts.len();
            if m.file_type().is_symlink() {
                return None;
            }
            if last && m.is_file() {
                return std::fs::read_to_string(&cur).ok();
            }
            if !m.is_dir() {
                return None; // a whiteout (char device) or a file where a dir should be
            }
        }
    }
    None
}

/// `user`, `uid`, `user:group`, `uid:gid` → numeric ids, through the image's
/// files. An empty spec is root, as in Docker.
pub fn resolve_user(image: &str, layers: &[PathBuf], spec: &str) -> Result<(u32, u32), ImageError> {
    let err = |m: &str| ImageError::User { image: image.into(), user: spec.into(), message: m.into() };
    if spec.is_empty() {
        return Ok((0, 0));
    }
    let (u, g) = spec.split_once(':').map_or((spec, None), |(u, g)| (u, Some(g)));
    let passwd = read_from_layers(layers, "etc/passwd").unwrap_or_default();
    let entry =
        passwd.lines().map(|l| l.split(':').collect::<Vec<_>>()).find(|f| f.len() >= 4 && (f[0] == u || f[2] == u));
    let uid = match u.parse::<u32>() {
        Ok(n) => n,
        Err(_) => entry
            .as_ref()
            .and_then(|f| f[2].parse().ok())
            .ok_or_else(|| err("no such user in the image's /etc/passwd"))?,
    };
    let gid = match g {
        None => entry.as_ref().and_then(|f| f[3].parse().ok()).unwrap_or(0),
        Some(g) => match g.parse::<u32>() {
            Ok(n) => n,
            Err(_) => {
                let group = read_from_layers(layers, "etc/group").unwrap_or_default();
                group
                    .lines()
                    .map(|l| l.split(':').collect::<Vec<_>>())
                    .find(|f| f.len() >= 3 && f[0] == g)
                    .and_then(|f| f[2].parse().ok())
                    .ok_or_else(|| err("no such group in the image's /etc/group"))?
            }
        },
    };
    if uid >= 65536 || gid >= 65536 {
        return Err(err("ids must be below 65536 (the sandbox's id range)"));
    }
    Ok((uid, gid))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn users_resolve_through_the_image_files() {
        let d = std::env::temp_dir().join(format!("ember-image-user-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(d.join("top/etc")).unwrap();
        std::fs::create_dir_all(d.join("base/etc")).unwrap();
        std::fs::write(d.join("base/etc/passwd"), "root:x:0:0::/root:/bin/sh\napp:x:1234:1300::/app:/bin/sh\n")
            .unwrap();
        std::fs::write(d.join("base/etc/group"), "root:x:0:\nstaff:x:50:\n").unwrap();
        let layers = [d.join("top"), d.join("base")];
        assert_eq!(resolve_user("i", &layers, "").unwrap(), (0, 0));
        assert_eq!(resolve_user("i", &layers, "app").unwrap(), (1234, 1300));
        assert_eq!(resolve_user("i", &layers, "app:staff").unwrap(), (1234, 50));
        assert_eq!(resolve_user("i", &layers, "77").unwrap(), (77, 0));
        assert_eq!(resolve_user("i", &layers, "1234").unwrap(), (1234, 1300));
        assert!(resolve_user("i", &layers, "nobody-here").is_err());
        assert!(resolve_user("i", &layers, "app:nogroup").is_err());
        // A symlinked /etc/passwd in a layer is not followed on the host.
        std::os::unix::fs::symlink("/etc/passwd", d.join("top/etc/passwd")).unwrap();
        assert!(resolve_user("i", &layers, "app").is_err());
        std::fs::remove_dir_all(&d).unwrap();
    }
}
