//! The figures as a side-by-side table, or as JSON.
use super::crun::{Crun, CrunFigures};
use super::ember::{EmberFigures, PHASES, TEMPLATE};
use super::oci::{DIFFERENCES, SETUP, UID_BASE};
use super::stats::Summary;
use serde_json::{json, Value};
use std::collections::BTreeMap;

/// The targets, judged on ember's p50 as this client saw it.
pub const TARGET_CREATE_MS: f64 = 15.0;
pub const TARGET_EXEC_MS: f64 = 2.0;

pub struct Report<'a> {
    pub url: &'a str,
    pub runs: usize,
    pub ember: &'a EmberFigures,
    /// `None` with `--no-crun`.
    pub crun: Option<&'a Crun>,
}

struct Row {
    label: &'static str,
    ember: Option<Summary>,
    crun: Option<Summary>,
    target: Option<f64>,
}

impl Report<'_> {
    fn crun_figures(&self) -> Option<&CrunFigures> {
        match self.crun {
            Some(Crun::Measured(f)) => Some(f),
            _ => None,
        }
    }

    fn rows(&self) -> Vec<Row> {
        let e = self.ember;
        let c = self.crun_figures();
        let cs = |pick: fn(&CrunFigures) -> &super::stats::Series| c.map(|f| pick(f).summary());
        let row = |label, ember: Option<Summary>, crun, target| Row { label, ember, crun, target };
        vec![
            row("cold create → ready", Some(e.create_wall.summary()), cs(|f| &f.create), Some(TARGET_CREATE_MS)),
            row("  server side", Some(e.create_server.summary()), None, None),
            row("exec true (argv)", Some(e.exec_argv.summary()), cs(|f| &f.exec), Some(TARGET_EXEC_MS)),
            row("exec bash -c true", Some(e.exec_bash.summary()), cs(|f| &f.exec_bash), None),
            row("remove", Some(e.delete.summary()), cs(|f| &f.delete), None),
        ]
    }

    /// ember's phase series in launch order (µs in the reply, ms here like the rest).
    fn phases(&self) -> Vec<(&'static str, Summary)> {
        PHASES.iter().filter_map(|p| self.ember.phases.get(*p).map(|s| (*p, s.summary()))).collect()
    }

    fn notes(&self) -> Vec<String> {
        let mut n = Vec::new();
        if self.runs < 100 {
            n.push(format!("only {} runs per figure: p99 needs at least 100 to mean anything", self.runs));
        }
        if self.ember.warm > 0 {
            n.push(format!("{} creates were warm claims and are left out of the cold figures", self.ember.warm));
        }
        if !self.ember.leftovers.is_empty() {
            n.push(format!("could not remove sandboxes: {}", self.ember.leftovers.join(" ")));
        }
        match self.crun {
            None => n.push("crun reference skipped (--no-crun)".into()),
            Some(Crun::Unavailable(why)) => n.push(format!("crun reference unavailable: {why}")),
            Some(Crun::Measured(f)) if f.init.as_ref().is_none_or(|(s, _)| s != "2") => {
                n.push(format!("the crun init's seccomp mode is not 2 (filter): {:?}", f.init))
            }
            Some(Crun::Measured(_)) => {}
        }
        n
    }

    pub fn print_table(&self) {
        let crun_name = self.crun_figures().map_or("crun (not measured)".to_string(), |f| f.version.clone());
        println!(
            "ember bench create: {} runs per figure, template {TEMPLATE}, daemon {}; reference: {crun_name}",
            self.runs, self.url
        );
        println!();
        println!("{:<24}{:^27} │{:^27}  target (ember p50)", "", "ember", "crun");
        println!("{:<24}{:>9}{:>9}{:>9} │{:>9}{:>9}{:>9}", "ms", "p50", "p90", "p99", "p50", "p90", "p99");
        for r in self.rows() {
            let target = match (r.target, r.ember.as_ref().and_then(|s| s.p50_ms)) {
                (Some(t), Some(p50)) => format!("  p50 ≤ {t} ms {}", if p50 <= t { "✓" } else { "✗" }),
                (Some(t), None) => format!("  p50 ≤ {t} ms ? (no samples)"),
                _ => String::new(),
            };
            println!("{:<24}{} │{}{target}", r.label, three(r.ember.as_ref()), three(r.crun.as_ref()));
        }
        println!();
        println!("  cold create → ready  both from this client, request → the agent answered GET /ping:");
        println!("                       ember: the create call (202 after its ping); crun: rootfs + bundle,");
        println!("                       `crun create` (socket as fd 3), `crun start`, GET /ping on that socket");
        println!("    server side        ember's X-Ember-Launch-Micros (inside the daemon), for reference");
        println!("  exec                 ember: Client::exec round trip (argv / command); crun: `crun exec <ctr> ...`");
        println!("  remove               ember: DELETE /v1/sandboxes/{{id}}; crun: `crun delete --force`, unmount");

        println!();
        println!(
            "{:<34}{:>5}{:>6}{:>9}{:>9}{:>9}{:>9}{:>9}{:>9}",
            "all figures, ms", "n", "fail", "min", "p50", "p90", "p99", "max", "mean"
        );
        let mut errors = Vec::new();
        for (name, s) in self.detail() {
            println!(
                "{:<34}{:>5}{:>6}{}{}{}{}{}{}",
                name,
                s.samples,
                s.failed,
                ms(s.min_ms),
                ms(s.p50_ms),
                ms(s.p90_ms),
                ms(s.p99_ms),
                ms(s.max_ms),
                ms(s.mean_ms)
            );
            if let Some(e) = &s.first_error {
                errors.push(format!("{name}: {e}{}", if s.gave_up { " (gave up)" } else { "" }));
            }
        }
        let ph = self.phases();
        if !ph.is_empty() {
            let parts: Vec<String> = ph.iter().map(|(k, s)| format!("{k} {}", ms(s.p50_ms).trim())).collect();
            println!();
            println!("ember create phases, p50 ms (server): {}", parts.join(" · "));
        }
        if !errors.is_empty() {
            println!();
            println!("first error of each failing figure:");
            errors.iter().for_each(|e| println!("  {e}"));
        }
        if let Some(f) = self.crun_figures() {
            let (seccomp, map) = f.init.clone().unwrap_or_default();
            println!();
            println!("crun reference: config.json from ember_runtime::oci::bundle::build for a default `host` spec");
            println!("  (ember's seccomp deny-list, capabilities, 512Mi / 1 cpu / 256 pids, 0 → {UID_BASE}), tmpfs +");
            println!("  overlay over the host template layer, ember-agent as the init; its init seen from the host:");
            println!("  Seccomp {seccomp}, uid_map {map}. What still differs:");
            DIFFERENCES.iter().for_each(|d| println!("  - {d}"));
        }
        println!("one discarded warm-up run precedes each figure.");
        for n in self.notes() {
            println!("note: {n}");
        }
    }

    /// Every series, named, for the detail table.
    fn detail(&self) -> Vec<(String, Summary)> {
        let e = self.ember;
        let mut v = vec![
            ("ember create → ready (server)".to_string(), e.create_server.summary()),
            ("ember create (client wall)".into(), e.create_wall.summary()),
            ("ember remove".into(), e.delete.summary()),
            ("ember exec argv true".into(), e.exec_argv.summary()),
            ("ember exec bash -c true".into(), e.exec_bash.summary()),
        ];
        v.extend(self.phases().into_iter().map(|(k, s)| (format!("  phase {k}"), s)));
        if let Some(f) = self.crun_figures() {
            v.extend([
                ("crun create → ready (client)".to_string(), f.create.summary()),
                ("crun remove".into(), f.delete.summary()),
                ("crun exec /bin/true".into(), f.exec.summary()),
                ("crun exec /bin/bash -c true".into(), f.exec_bash.summary()),
            ]);
        }
        v
    }

    pub fn to_json(&self) -> Value {
        let e = self.ember;
        let crun = match self.crun {
            None => json!({ "skipped": true }),
            Some(Crun::Unavailable(why)) => json!({ "unavailable": why, "setup": SETUP }),
            Some(Crun::Measured(f)) => json!({
                "version": f.version,
                "createToReady": f.create.summary(),
                "delete": f.delete.summary(),
                "exec": f.exec.summary(),
                "execBash": f.exec_bash.summary(),
                "init": f.init.as_ref().map(|(s, m)| json!({ "seccomp": s, "uidMap": m })),
            }),
        };
        let targets: Vec<Value> = self
            .rows()
            .into_iter()
            .filter_map(|r| {
                let limit = r.target?;
                let p50 = r.ember.as_ref().and_then(|s| s.p50_ms);
                Some(json!({ "figure": r.label.trim(), "p50LimitMs": limit, "p50Ms": p50, "met": p50.map(|p| p <= limit) }))
            })
            .collect();
        json!({
            "runs": self.runs,
            "url": self.url,
            "template": TEMPLATE,
            "ember": {
                "createServer": e.create_server.summary(),
                "createWall": e.create_wall.summary(),
                "delete": e.delete.summary(),
                "phases": self.phases().into_iter().collect::<BTreeMap<_, _>>(),
                "execArgv": e.exec_argv.summary(),
                "execBash": e.exec_bash.summary(),
                "warmClaims": e.warm,
                "leftovers": e.leftovers,
            },
            "crun": crun,
            "targets": targets,
            "reference": { "uidBase": UID_BASE, "differences": DIFFERENCES },
            "notes": self.notes(),
        })
    }
}

fn three(s: Option<&Summary>) -> String {
    match s {
        Some(s) => format!("{}{}{}", ms(s.p50_ms), ms(s.p90_ms), ms(s.p99_ms)),
        None => format!("{:>9}{:>9}{:>9}", "—", "—", "—"),
    }
}

pub(super) fn ms(v: Option<f64>) -> String {
    match v {
        Some(v) => format!("{v:>9.2}"),
        None => format!("{:>9}", "—"),
    }
}
