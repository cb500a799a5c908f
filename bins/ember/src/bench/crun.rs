//! The crun reference, measured in the same run and from the same side as
//! ember: each figure is the wall time of this client from the request to
//! the agent answering `GET /ping` (no polling: the agent serves on a socket
//! this process listens on before crun runs), over a container doing the
//! work of a `host` sandbox ([`super::oci`]). Blocking: call it from
//! `spawn_blocking`.
use super::oci::{self, Container, Reference};
use super::stats::Series;
use std::time::Instant;

#[derive(Default)]
pub struct CrunFigures {
    pub version: String,
    /// Request to an agent that answered `/ping`: rootfs, bundle, `crun
    /// create`, `crun start`, ping.
    pub create: Series,
    /// `crun delete --force` of a running container, unmount, dir removed.
    pub delete: Series,
    pub exec: Series,
    pub exec_bash: Series,
    /// The first container's init from the host: seccomp mode, uid map.
    pub init: Option<(String, String)>,
}

pub enum Crun {
    Measured(Box<CrunFigures>),
    Unavailable(String),
}

/// The reference's side of `bench create`, step by step like
/// [`super::ember::EmberBench`], so the two alternate.
pub struct CrunBench {
    r: Reference,
    pub f: CrunFigures,
    /// The container the exec figures run in.
    exec: Option<Container>,
}

impl CrunBench {
    /// The preflight and a discarded first container; if that fails, so
    /// would every other.
    pub fn start() -> Result<CrunBench, String> {
        let (version, agent) = oci::preflight()?;
        let r = Reference::new(agent)?;
        let mut f = CrunFigures { version, ..Default::default() };
        let c = r.start().map_err(|e| format!("a first container did not become ready: {e}"))?;
        f.init = r.init_boundary(&c).ok();
        r.remove(&c).map_err(|e| format!("removing the first container: {e}"))?;
        Ok(CrunBench { r, f, exec: None })
    }

    /// One container to a ready agent, and its removal.
    pub fn create_once(&mut self) {
        let t0 = Instant::now();
        match self.r.start() {
            Ok(c) => {
                self.f.create.push(t0.elapsed());
                let t1 = Instant::now();
                match self.r.remove(&c) {
                    Ok(()) => self.f.delete.push(t1.elapsed()),
                    Err(e) => self.f.delete.fail(e),
                }
            }
            Err(e) => self.f.create.fail(e),
        }
    }

    pub fn exec_start(&mut self) {
        match self.r.start() {
            Ok(c) => self.exec = Some(c),
            Err(e) => {
                let msg = format!("starting the exec container: {e}");
                self.f.exec.fail(&msg);
                self.f.exec_bash.fail(&msg);
            }
        }
    }

    /// One `crun exec` of `/bin/true` or `bash -c true`; `measured: false` is
    /// the discarded first call.
    pub fn exec_step(&mut self, bash: bool, measured: bool) {
        let Some(c) = self.exec.as_ref() else { return };
        let args: &[&str] = if bash { &["/bin/bash", "-c", "true"] } else { &["/bin/true"] };
        let t0 = Instant::now();
        let res = self.r.cli.exec(c.id.as_str(), args);
        if measured {
            let series = if bash { &mut self.f.exec_bash } else { &mut self.f.exec };
            match res {
                Ok(_) => series.push(t0.elapsed()),
                Err(e) => series.fail(e),
            }
        }
    }

    pub fn finish(mut self) -> Crun {
        if let Some(c) = self.exec.take() {
            if let Err(e) = self.r.remove(&c) {
                eprintln!("crun: {e}");
            }
        }
        Crun::Measured(Box::new(self.f))
    }
}
