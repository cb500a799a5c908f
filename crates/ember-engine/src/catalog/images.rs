//! Image commands: pull, import, list, remove, prune. The store itself lives in
//! ember-image; the engine adds what only it knows: which templates and live
//! sandboxes use which images and layers.
use super::Catalog;
use crate::EngineError;
use ember_image::{Auth, ImageRecord, PruneReport};
use ember_types::image::RegistryAuth;
use std::collections::HashSet;
use std::path::PathBuf;

pub(crate) fn auth(a: Option<RegistryAuth>) -> Auth {
    match a {
        Some(RegistryAuth { token: Some(t), .. }) => Auth::Bearer(t),
        Some(RegistryAuth { username: Some(u), password, .. }) => {
            Auth::Basic { username: u, password: password.unwrap_or_default() }
        }
        _ => Auth::Anonymous,
    }
}

impl Catalog {
    pub fn images(&self) -> &ember_image::ImageStore {
        &self.images
    }

    /// Pulls `reference` (again, if present: a tag may have moved).
    pub async fn pull_image(&self, reference: &str, a: Option<RegistryAuth>) -> Result<ImageRecord, EngineError> {
        Ok(self.images.pull(reference, auth(a)).await?)
    }

    /// Imports the tar file at `tar` as image `name`; the file is the caller's.
    pub async fn import_image(&self, name: &str, tar: PathBuf) -> Result<ImageRecord, EngineError> {
        let store = self.images.clone();
        let name = name.to_string();
        tokio::task::spawn_blocking(move || store.import_tar(&name, &tar))
            .await
            .map_err(|e| EngineError::Internal(e.to_string()))?
            .map_err(Into::into)
    }

    /// Forgets an image no template uses. Its layers stay until `prune`.
    pub fn remove_image(&self, reference: &str) -> Result<ImageRecord, EngineError> {
        let rec = self.images.get(reference)?;
        if let Some(t) = self.templates.list().into_iter().find(|t| t.image.as_deref() == Some(rec.name.as_str())) {
            return Err(ember_image::ImageError::InUse { image: rec.name, template: t.name }.into());
        }
        Ok(self.images.remove(reference)?)
    }

    /// Removes layers no image lists and no live sandbox has mounted.
    /// `held`: the lower dirs of every sandbox this node knows.
    pub async fn prune_images(&self, held: Vec<PathBuf>) -> Result<PruneReport, EngineError> {
        let in_use: HashSet<String> = held
            .into_iter()
            .filter_map(|p| Some(p.parent()?.file_name()?.to_string_lossy().replacen('-', ":", 1)))
            .collect();
        let store = self.images.clone();
        tokio::task::spawn_blocking(move || store.prune(&in_use))
            .await
            .map_err(|e| EngineError::Internal(e.to_string()))?
            .map_err(Into::into)
    }
}
