//! Templates: named, validated defaults a sandbox is created from: an image (or
//! the host rootfs), resources, runtime class, network, user, workdir, env and
//! entrypoint. `host` is built in; the others are persisted one JSON file each
//! under `<data>/state/templates/` (temp file + rename). Creating a template
//! pulls its image first, so the first sandbox from it starts from cached
//! layers.
use super::Catalog;
use crate::create::{apply_resources, ResourceArgs};
use crate::EngineError;
use ember_image::ImageRecord;
use ember_types::image::{TemplateInfo, TemplateRequest};
use ember_types::{NetworkMode, Resources};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// A template as the engine keeps it: the wire shape, validated.
pub type Template = TemplateInfo;

/// The built-in template `name`: `host`, or one of the bundled ones
/// (`browser`, `desktop`, bundled.rs).
pub fn builtin(name: &str) -> Option<Template> {
    super::bundled::template(name).or_else(|| host(name))
}

fn host(name: &str) -> Option<Template> {
    (name == "host").then(|| Template {
        name: "host".into(),
        builtin: true,
        image: None,
        image_digest: None,
        runtime_class: "native".into(),
        resources: Resources::default(),
        network: NetworkMode::None,
        user: Some("1000:1000".into()),
        workdir: None,
        env: Default::default(),
        entrypoint: None,
        created_at: None,
    })
}

/// `[a-z0-9][a-z0-9._-]*`, at most 63 characters.
pub fn valid_name(n: &str) -> bool {
    !n.is_empty()
        && n.len() <= 63
        && n.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"._-".contains(&b))
        && n.as_bytes()[0].is_ascii_alphanumeric()
}

/// The persisted templates, and those read or written since the daemon
/// started. The store is the only writer of its directory (the daemon's
/// private state), so a template read once is answered from memory: a
/// create from a template read and parsed its file twice (docs/performance.md
/// row 11). Only present ones are kept: a name not found is looked up again.
pub(crate) struct TemplateStore {
    dir: PathBuf,
    known: Mutex<HashMap<String, Template>>,
}

impl TemplateStore {
    pub fn open(dir: PathBuf) -> Result<TemplateStore, EngineError> {
        crate::store::private_dir(&dir)?;
        Ok(TemplateStore { dir, known: Mutex::new(HashMap::new()) })
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.join(format!("{name}.json"))
    }

    fn known(&self) -> std::sync::MutexGuard<'_, HashMap<String, Template>> {
        self.known.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    pub fn get(&self, name: &str) -> Option<Template> {
        if !valid_name(name) {
            return None;
        }
        // Held over the read: a save between it and the insert would be lost.
        let mut known = self.known();
        if let Some(t) = known.get(name) {
            return Some(t.clone());
        }
        let t: Template = serde_json::from_slice(&std::fs::read(self.path(name)).ok()?).ok()?;
        known.insert(name.to_string(), t.clone());
        Some(t)
    }

    pub fn list(&self) -> Vec<Template> {
        let mut out: Vec<Template> = std::fs::read_dir(&self.dir)
            .into_iter()
            .flatten()
            .flatten()
            // `.json` only: a `.tmp` is a save that never completed.
            .filter(|e| e.path().extension().is_some_and(|x| x == "json"))
            .filter_map(|e| serde_json::from_slice(&std::fs::read(e.path()).ok()?).ok())
            .collect();
        out.sort_by(|a, b| a.name.cmp(&b.name));
        out
    }

    pub fn save(&self, t: &Template) -> Result<(), EngineError> {
        // Templates are saved rarely: the lock is held over the write, and a
        // failed write (which may have replaced the file or not) is forgotten.
        let mut known = self.known();
        known.remove(&t.name);
        crate::store::write_durable(&self.path(&t.name), &serde_json::to_vec_pretty(t).unwrap_or_default(), true)?;
        known.insert(t.name.clone(), t.clone());
        Ok(())
    }

    pub fn remove(&self, name: &str) -> Result<(), EngineError> {
        let mut known = self.known();
        known.remove(name);
        let p = self.path(name);
        if !p.exists() {
            let source = std::io::ErrorKind::NotFound.into();
            return Err(EngineError::Store { path: p, source });
        }
        crate::store::remove_durable(&p)
    }
}

/// `uid[:gid]` for templates without an image (no passwd to look names up in).
pub(crate) fn numeric_user(user: &str) -> Option<(u32, u32)> {
    let (u, g) = user.split_once(':').map_or((user, None), |(u, g)| (u, Some(g)));
    let uid: u32 = u.parse().ok()?;
    let gid: u32 = match g {
        Some(g) => g.parse().ok()?,
        None => uid,
    };
    (uid < 65536 && gid < 65536).then_some((uid, gid))
}

impl Catalog {
    /// The built-in or stored template `name`.
    pub fn template(&self, name: &str) -> Result<Template, EngineError> {
        let t = builtin(name).or_else(|| self.templates.get(name));
        let t = t.ok_or_else(|| EngineError::UnknownTemplate(name.into()))?;
        if t.builtin {
            super::bundled::check_host(name)?;
        }
        Ok(t)
    }

    pub fn templates(&self) -> Vec<Template> {
        let mut all = vec![builtin("host").expect("host is built in")];
        all.extend(super::bundled::NAMES.iter().filter_map(|n| builtin(n)));
        all.extend(self.templates.list());
        all
    }

    /// Validates, pulls the image (pre-warming), resolves the user in it, and
    /// persists the template.
    pub async fn create_template(&self, req: TemplateRequest) -> Result<Template, EngineError> {
        if !valid_name(&req.name) {
            return Err(EngineError::invalid("name", "lowercase letters, digits, '.', '_' and '-', at most 63"));
        }
        if builtin(&req.name).is_some() || self.templates.get(&req.name).is_some() {
            return Err(EngineError::TemplateExists(req.name));
        }
        let r = req.resources.clone().unwrap_or_default();
        let args = ResourceArgs { memory: r.memory, cpu: r.cpu, pids: r.pids, disk: r.disk };
        let resources = apply_resources(Resources::default(), &args)?;
        // A class that is not installed is refused here, at template creation,
        // not at the first claim.
        let class = req.runtime_class.clone().unwrap_or_else(|| self.runtimes.default_runtime().class().to_string());
        if let Some(why) = self.runtimes.why_unavailable(&class) {
            return Err(EngineError::invalid("runtimeClass", why));
        }
        match req.network.as_deref() {
            None | Some("none") => {}
            Some(other) => {
                return Err(EngineError::invalid("network", format!("{other:?}: only \"none\" is supported")))
            }
        }
        crate::create::check_env(req.env.iter().flatten().map(|(k, _)| k))?;
        if req.workdir.as_deref().is_some_and(|w| !w.starts_with('/')) {
            return Err(EngineError::invalid("workdir", "must be an absolute path"));
        }
        let image = match &req.image {
            Some(i) => Some(self.image_or_pull(i, req.auth.clone()).await?),
            None => None,
        };
        if let Some(u) = &req.user {
            match &image {
                Some(rec) => {
                    self.images.resolve_user(rec, u)?;
                }
                None if numeric_user(u).is_none() => {
                    return Err(EngineError::invalid(
                        "user",
                        "uid[:gid] below 65536 (a template without an image has no /etc/passwd)",
                    ))
                }
                None => {}
            }
        }
        let t = Template {
            name: req.name,
            builtin: false,
            image: image.as_ref().map(|i| i.name.clone()),
            image_digest: image.as_ref().map(|i| i.digest.clone()),
            runtime_class: class,
            resources,
            network: NetworkMode::None,
            user: req.user,
            workdir: req.workdir,
            env: req.env.unwrap_or_default(),
            entrypoint: req.entrypoint,
            created_at: Some(crate::record::now_ms().to_string()),
        };
        self.templates.save(&t)?;
        Ok(t)
    }

    pub fn delete_template(&self, name: &str) -> Result<(), EngineError> {
        if builtin(name).is_some() {
            return Err(EngineError::invalid("name", format!("{name:?} is built in and cannot be removed")));
        }
        self.template(name)?;
        self.templates.remove(name)
    }

    /// The stored image `reference`, pulled first if the store lacks it.
    pub(crate) async fn image_or_pull(
        &self,
        reference: &str,
        auth: Option<ember_types::image::RegistryAuth>,
    ) -> Result<ImageRecord, EngineError> {
        match self.images.get(reference) {
            Ok(rec) => Ok(rec),
            Err(ember_image::ImageError::NotFound(_)) => {
                Ok(self.images.pull(reference, super::images::auth(auth)).await?)
            }
            Err(e) => Err(e.into()),
        }
    }
}

/// The images directory inside the data dir.
pub fn images_dir(data_dir: &Path) -> PathBuf {
    data_dir.join("images")
}

impl Catalog {
    /// The spec a pool starts its idle sandboxes with: the template's defaults
    /// (image layers, env, workdir, user) and the pool's resources; everything
    /// per-caller is bound at claim, so no entrypoint runs.
    pub(crate) fn pooled_spec(&self, p: &crate::pool::PoolSpec) -> Result<ember_types::SandboxSpec, EngineError> {
        let req = crate::CreateSandbox { template: Some(p.template.clone()), ..Default::default() };
        let mut spec = self.resolve(&req)?;
        spec.resources = p.resources.clone();
        spec.runtime_class = p.runtime_class.clone();
        spec.network = p.network;
        spec.egress = p.egress.clone();
        spec.entrypoint = Vec::new();
        Ok(spec)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_template_read_once_is_answered_as_last_saved_or_removed() {
        let dir = std::env::temp_dir().join(format!("ember-templates-{}", std::process::id()));
        let store = TemplateStore::open(dir.clone()).unwrap();
        let mut t = host("host").unwrap();
        (t.name, t.builtin) = ("py".into(), false);
        assert!(store.get("py").is_none());
        store.save(&t).unwrap();
        assert_eq!(store.get("py").unwrap().env, t.env);
        t.env.insert("A".into(), "1".into());
        store.save(&t).unwrap();
        assert_eq!(store.get("py").unwrap().env.get("A").map(String::as_str), Some("1"), "the last save wins");
        // Another store on the same dir reads the file: what was saved is on disk.
        assert_eq!(TemplateStore::open(dir.clone()).unwrap().get("py").unwrap().env, t.env);
        store.remove("py").unwrap();
        assert!(store.get("py").is_none(), "a removed template is not answered from memory");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
