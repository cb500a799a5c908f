//! What pulls are doing right now, for `GET /v1/images/pulls` and the CLI's
//! progress bars.
use crate::ImageStore;
use serde::{Deserialize, Serialize};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use tokio::io::AsyncWrite;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LayerState {
    Waiting,
    Downloading,
    Unpacking,
    Done,
    /// Already in the store: nothing to fetch.
    Cached,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LayerProgress {
    pub digest: String,
    pub size: u64,
    pub downloaded: u64,
    pub state: LayerState,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PullProgress {
    pub reference: String,
    pub layers: Vec<LayerProgress>,
}

impl ImageStore {
    pub(crate) fn progress_start(&self, name: &str, layers: Vec<(String, u64)>) {
        let layers = layers
            .into_iter()
            .map(|(digest, size)| LayerProgress { digest, size, downloaded: 0, state: LayerState::Waiting })
            .collect();
        self.lock_progress().insert(name.to_string(), PullProgress { reference: name.to_string(), layers });
    }

    fn with_layer(&self, name: &str, digest: &str, f: impl FnOnce(&mut LayerProgress)) {
        if let Some(p) = self.lock_progress().get_mut(name) {
            if let Some(l) = p.layers.iter_mut().find(|l| l.digest == digest) {
                f(l);
            }
        }
    }

    pub(crate) fn progress_layer(&self, name: &str, digest: &str, state: LayerState) {
        self.with_layer(name, digest, |l| {
            l.state = state;
            if matches!(state, LayerState::Done | LayerState::Cached) {
                l.downloaded = l.size;
            }
        });
    }

    pub(crate) fn progress_end(&self, name: &str) {
        self.lock_progress().remove(name);
    }

    /// Pulls in flight, with per-layer bytes.
    pub fn pulls(&self) -> Vec<PullProgress> {
        self.lock_progress().values().cloned().collect()
    }

    fn lock_progress(&self) -> parking_lot::MutexGuard<'_, std::collections::BTreeMap<String, PullProgress>> {
        self.progress.lock()
    }
}

/// A file writer that counts bytes into the pull's progress.
pub(crate) struct ProgressWriter {
    file: tokio::fs::File,
    store: Arc<ImageStore>,
    name: String,
    digest: String,
}

impl ProgressWriter {
    pub fn new(file: tokio::fs::File, store: Arc<ImageStore>, name: String, digest: String) -> Self {
        ProgressWriter { file, store, name, digest }
    }
}

impl AsyncWrite for ProgressWriter {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        let r = Pin::new(&mut this.file).poll_write(cx, buf);
        if let Poll::Ready(Ok(n)) = r {
            this.store.with_layer(&this.name, &this.digest, |l| l.downloaded += n as u64);
        }
        r
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.file).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.file).poll_shutdown(cx)
    }
}
