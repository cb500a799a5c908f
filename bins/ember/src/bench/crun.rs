//! The crun reference, measured in the same run and from the same side as
//! ember: each figure is the wall time of this client from the request to
//! the agent answering `GET /ping` (no polling: the agent serves on a socket
//! this process listens on before crun runs), over a container doing the
//! work of a `host` sandbox ([`super::oci`]). Blocking: call it from
//! `spawn_blocking`.
use super::oci::{self, Container, Reference};
use super::stats::{Progress, Series};
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

pub fn measure(runs: usize) -> Crun {
    let (version, agent) = match oci::preflight() {
        Ok(v) => v,
        Err(e) => return unavailable(e),
    };
    let r = match Reference::new(agent) {
        Ok(r) => r,
        Err(e) => return unavailable(e),
    };
    let mut f = CrunFigures { version, ..Default::default() };
    // A discarded first container; if it fails, so would every other.
    match r.start() {
        Ok(c) => {
            f.init = r.init_boundary(&c).ok();
            if let Err(e) = r.remove(&c) {
                return unavailable(format!("removing the first container: {e}"));
            }
        }
        Err(e) => return unavailable(format!("a first container did not become ready: {e}")),
    }
    create_loop(&r, runs, &mut f);
    exec_loops(&r, runs, &mut f);
    Crun::Measured(Box::new(f))
}

fn unavailable(why: String) -> Crun {
    eprintln!("crun reference unavailable: {why}");
    Crun::Unavailable(why)
}

fn create_loop(r: &Reference, runs: usize, f: &mut CrunFigures) {
    let p = Progress::new("crun create+rm", runs);
    for i in 0..runs {
        let t0 = Instant::now();
        match r.start() {
            Ok(c) => {
                f.create.push(t0.elapsed());
                let t1 = Instant::now();
                match r.remove(&c) {
                    Ok(()) => f.delete.push(t1.elapsed()),
                    Err(e) => f.delete.fail(e),
                }
            }
            Err(e) => f.create.fail(e),
        }
        p.tick(i + 1);
        if f.create.gave_up() {
            break;
        }
    }
    p.finish(&f.create);
}

fn exec_loops(r: &Reference, runs: usize, f: &mut CrunFigures) {
    let c: Container = match r.start() {
        Ok(c) => c,
        Err(e) => {
            let msg = format!("starting the exec container: {e}");
            f.exec.fail(&msg);
            f.exec_bash.fail(&msg);
            return;
        }
    };
    let id = c.id.as_str();
    let argv: [(&str, &[&str], &mut Series); 2] = [
        ("crun exec /bin/true", &["/bin/true"], &mut f.exec),
        ("crun exec bash -c true", &["/bin/bash", "-c", "true"], &mut f.exec_bash),
    ];
    for (label, args, series) in argv {
        let _ = r.cli.exec(id, args);
        let p = Progress::new(label, runs);
        for i in 0..runs {
            let t0 = Instant::now();
            match r.cli.exec(id, args) {
                Ok(_) => series.push(t0.elapsed()),
                Err(e) => series.fail(e),
            }
            p.tick(i + 1);
            if series.gave_up() {
                break;
            }
        }
        p.finish(series);
    }
    if let Err(e) = r.remove(&c) {
        eprintln!("crun: {e}");
    }
}
