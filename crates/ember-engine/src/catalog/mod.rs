//! The catalog of what a sandbox is made from: images (the store lives in
//! ember-image), templates (`templates.rs`), and the resolution of a request
//! into a validated [`SandboxSpec`] (template, image settings, resources,
//! TTL, runtime class, network, host volumes). Owns the template store;
//! knows nothing of running sandboxes (image pruning is told which layers
//! they hold).
//!
//! Layout: `mod.rs` (the service, spec resolution), `templates.rs`,
//! `images.rs` (image commands).
mod bundled;
mod images;
pub mod templates;

use crate::create::{apply_resources, check_env, CreateSandbox, HostVolumeRequest, ResourceArgs};
use crate::network::Network;
use crate::EngineError;
use ember_runtime::Runtimes;
use ember_types::limits;
use ember_types::{SandboxSpec, UserSpec, VolumeMount};
use std::collections::BTreeMap;
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use templates::{Template, TemplateStore};

pub(crate) struct Catalog {
    images: Arc<ember_image::ImageStore>,
    templates: TemplateStore,
    runtimes: Runtimes,
    network: Arc<Network>,
    /// Upper bound on a sandbox's TTL, if any.
    max_ttl: Option<Duration>,
    /// Where `host` volumes may come from.
    allowed_host_paths: Vec<PathBuf>,
}

impl Catalog {
    pub fn new(
        cfg: &crate::EngineConfig,
        images: Arc<ember_image::ImageStore>,
        runtimes: Runtimes,
        network: Arc<Network>,
    ) -> Result<Catalog, EngineError> {
        let templates = TemplateStore::open(cfg.data_dir.join("state/templates"))?;
        let (max_ttl, allowed_host_paths) = (cfg.max_ttl, cfg.allowed_host_paths.clone());
        Ok(Catalog { images, templates, runtimes, network, max_ttl, allowed_host_paths })
    }

    /// A sandbox's timeout: the request's, within the caps and `--max-ttl`;
    /// without one, `--max-ttl` if the daemon has one (a maximum bounds every
    /// sandbox), else none (manual cleanup).
    pub fn ttl(&self, asked: Option<u64>) -> Result<Option<u64>, EngineError> {
        let max = self.max_ttl.map(|m| m.as_secs());
        match asked {
            Some(t) => Ok(Some(limits::timeout_secs("timeout", t, max)?)),
            None => Ok(max.map(|m| m.min(limits::MAX_TIMEOUT_SECS))),
        }
    }

    /// The template a request names: `template`, else `image.uri` naming a
    /// template, else an ad-hoc one for the image `image.uri`, else `host`.
    pub fn template_of(&self, req: &CreateSandbox) -> Result<Template, EngineError> {
        let name = req.template.clone().or_else(|| req.image_uri.clone()).unwrap_or_else(|| "host".into());
        match self.template(&name) {
            Ok(t) => Ok(t),
            // A bundled template the host cannot run is that error, not an image name.
            Err(e) if req.template.is_some() || !matches!(e, EngineError::UnknownTemplate(_)) => Err(e),
            Err(_) => {
                let image = ember_image::ImageStore::normalize(&name)?;
                Ok(Template {
                    name: image.clone(),
                    builtin: false,
                    image: Some(image),
                    ..templates::builtin("host").expect("host")
                })
                .map(|mut t| {
                    t.user = None;
                    t
                })
            }
        }
    }

    /// Pulls the image the request needs if the store lacks it.
    pub async fn prepare_image(&self, req: &CreateSandbox) -> Result<(), EngineError> {
        if let Some(image) = self.template_of(req)?.image {
            self.image_or_pull(&image, req.image_auth.clone()).await?;
        }
        Ok(())
    }

    /// Resolves the template and validates every field into a [`SandboxSpec`].
    /// Image settings (Env, WorkingDir, User, Entrypoint+Cmd) apply unless the
    /// template or the request overrides them. The image must be in the store.
    pub fn resolve(&self, req: &CreateSandbox) -> Result<SandboxSpec, EngineError> {
        let t = self.template_of(req)?;
        let args =
            ResourceArgs { memory: req.memory.clone(), cpu: req.cpu.clone(), pids: req.pids, disk: req.disk.clone() };
        let res = apply_resources(t.resources.clone(), &args)?;
        let ttl_secs = self.ttl(req.ttl_secs)?;
        let class = req.runtime_class.clone().unwrap_or(t.runtime_class.clone());
        if let Some(why) = self.runtimes.why_unavailable(&class) {
            return Err(EngineError::invalid("runtimeClass", why));
        }
        check_env(req.env.keys())?;
        req.secrets.validate().map_err(|e| EngineError::invalid("secrets", e.to_string()))?;
        if !req.workspaces.is_empty() && !self.runtimes.for_class(&class).can_inject_mounts() {
            return Err(EngineError::invalid(
                "workspaces",
                format!("the {class} class cannot mount workspaces into a running sandbox"),
            ));
        }
        let image = t.image.as_deref().map(|i| self.images.get(i)).transpose()?;
        let cfg = image.as_ref().map(|i| i.config.clone()).unwrap_or_default();
        let mut env: BTreeMap<String, String> =
            cfg.env.iter().filter_map(|kv| kv.split_once('=')).map(|(k, v)| (k.to_string(), v.to_string())).collect();
        env.extend(t.env.clone());
        env.extend(req.env.clone());
        let user = match (req.user, &image, t.user.as_deref().or(cfg.user.as_deref())) {
            (Some(u), _, _) => u,
            (None, Some(img), u) => {
                let (uid, gid) = self.images.resolve_user(img, u.unwrap_or(""))?;
                UserSpec { uid, gid }
            }
            (None, None, u) => {
                u.and_then(templates::numeric_user).map_or(UserSpec::SANDBOX, |(uid, gid)| UserSpec { uid, gid })
            }
        };
        // The OpenSandbox SDKs send `tail -f /dev/null` when their caller
        // names no entrypoint (it keeps a container alive upstream): that
        // default gives way to a template's own entrypoint, or
        // `Sandbox.create("browser")` would start no browser.
        let sdk_default = req.entrypoint == ["tail", "-f", "/dev/null"] && t.entrypoint.is_some();
        let entrypoint = if !req.entrypoint.is_empty() && !sdk_default {
            req.entrypoint.clone()
        } else if let Some(ep) = &t.entrypoint {
            ep.clone()
        } else if !cfg.entrypoint.is_empty() {
            // An image's ENTRYPOINT is its program; a bare CMD (a shell, a REPL)
            // is only a default for interactive use and would exit at once here.
            cfg.entrypoint.iter().chain(&cfg.cmd).cloned().collect()
        } else {
            Vec::new()
        };
        let (network, egress) = self.network.resolve(req)?;
        if network != ember_types::NetworkMode::None && class != self.runtimes.default_runtime().class() {
            return Err(EngineError::invalid(
                "network",
                format!("egress networking is not available for the {class} class yet (native only)"),
            ));
        }
        Ok(SandboxSpec {
            template: t.name,
            runtime_class: class,
            resources: res,
            ttl_secs,
            env,
            metadata: req.metadata.clone(),
            entrypoint,
            user,
            network,
            egress,
            lower_dirs: image.as_ref().map(|i| self.images.lower_dirs(i)).unwrap_or_default(),
            workdir: t.workdir.clone().or(cfg.working_dir),
            volumes: req.volumes.iter().map(|v| self.check_volume(v)).collect::<Result<_, _>>()?,
            secret_names: req.secrets.names(),
            auto_pause_secs: crate::autopause::check(req.auto_pause_secs)?,
            auto_pause_checkpoint: req.auto_pause_checkpoint,
        })
    }

    /// A host volume is allowed when its (canonical) path is an existing
    /// directory under one of the allowed host paths, and its mount path is an
    /// absolute path outside what the sandbox's own root needs.
    fn check_volume(&self, v: &HostVolumeRequest) -> Result<VolumeMount, EngineError> {
        let bad = |m: String| EngineError::invalid("volumes", format!("{}: {m}", v.name));
        let mut host = PathBuf::from(&v.host_path);
        if let Some(sub) = v.sub_path.as_deref().filter(|s| !s.is_empty()) {
            if Path::new(sub).is_absolute() || Path::new(sub).components().any(|c| c == Component::ParentDir) {
                return Err(bad(format!("subPath {sub:?} must be relative, without ..")));
            }
            host.push(sub);
        }
        let real = host.canonicalize().map_err(|e| bad(format!("host path {}: {e}", host.display())))?;
        if !real.is_dir() {
            return Err(bad(format!("host path {} is not a directory", real.display())));
        }
        if !self.allowed_host_paths.iter().any(|a| real.starts_with(a)) {
            return Err(bad(format!(
                "host path {} is not under an allowed host path (ember serve --allow-host-path)",
                real.display()
            )));
        }
        let mp = Path::new(&v.mount_path);
        let normal = mp.components().all(|c| matches!(c, Component::RootDir | Component::Normal(_)));
        if !mp.is_absolute() || !normal || mp == Path::new("/") {
            return Err(bad(format!("mountPath {:?} must be an absolute path without . or ..", v.mount_path)));
        }
        if ["/proc", "/dev", "/usr", "/etc", "/sys"].iter().any(|p| mp.starts_with(p)) {
            return Err(bad(format!("mountPath {:?} would hide a system directory", v.mount_path)));
        }
        Ok(VolumeMount { host_path: real, mount_path: v.mount_path.clone(), read_only: v.read_only })
    }
}
