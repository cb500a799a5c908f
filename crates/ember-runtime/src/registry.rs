//! The runtime classes of one daemon: `native` always, each OCI class whose
//! binary runs here, and a report of every class ember knows (those that
//! cannot run here say why).
use crate::Runtime;
use ember_types::api::RuntimeClassInfo;
use std::collections::BTreeMap;
use std::sync::Arc;

pub type ClassInfo = RuntimeClassInfo;

/// A registry of runtimes by class name. The default class serves sandboxes
/// whose template names no class, and owns host-wide facts (the id mapping
/// workspaces are chowned to).
#[derive(Clone)]
pub struct Runtimes {
    default: Arc<dyn Runtime>,
    by_class: BTreeMap<&'static str, Arc<dyn Runtime>>,
    infos: Vec<ClassInfo>,
}

impl Runtimes {
    pub fn new(default: Arc<dyn Runtime>, detail: impl Into<String>) -> Runtimes {
        let info = ClassInfo {
            name: default.class().to_string(),
            available: true,
            kernel_boundary: "shared host kernel (Linux namespaces + seccomp)".into(),
            detail: detail.into(),
        };
        let by_class = BTreeMap::from([(default.class(), default.clone())]);
        Runtimes { default, by_class, infos: vec![info] }
    }

    /// Registers an available class.
    pub fn add(&mut self, rt: Arc<dyn Runtime>, kernel_boundary: &str, detail: impl Into<String>) {
        self.infos.push(ClassInfo {
            name: rt.class().to_string(),
            available: true,
            kernel_boundary: kernel_boundary.into(),
            detail: detail.into(),
        });
        self.by_class.insert(rt.class(), rt);
    }

    /// Records a class that cannot run here, and why.
    pub fn unavailable(&mut self, class: &str, kernel_boundary: &str, why: impl Into<String>) {
        self.infos.push(ClassInfo {
            name: class.into(),
            available: false,
            kernel_boundary: kernel_boundary.into(),
            detail: why.into(),
        });
    }

    pub fn default_runtime(&self) -> &Arc<dyn Runtime> {
        &self.default
    }

    pub fn get(&self, class: &str) -> Option<&Arc<dyn Runtime>> {
        self.by_class.get(class)
    }

    /// The runtime of `class`, else the default (a record of a class this
    /// daemon no longer has is reaped by the default's sweep).
    pub fn for_class(&self, class: &str) -> Arc<dyn Runtime> {
        self.get(class).unwrap_or(&self.default).clone()
    }

    /// Every registered runtime.
    pub fn all(&self) -> impl Iterator<Item = &Arc<dyn Runtime>> {
        self.by_class.values()
    }

    pub fn infos(&self) -> &[ClassInfo] {
        &self.infos
    }

    /// Why `class` cannot be used, if it cannot.
    pub fn why_unavailable(&self, class: &str) -> Option<String> {
        if self.by_class.contains_key(class) {
            return None;
        }
        let installed = self.by_class.keys().copied().collect::<Vec<_>>().join(", ");
        Some(match self.infos.iter().find(|i| i.name == class) {
            Some(i) => format!("runtime class {class:?} is not available here: {}; available: {installed}", i.detail),
            None => format!("unknown runtime class {class:?}; available: {installed}"),
        })
    }
}
