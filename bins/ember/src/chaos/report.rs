//! The drill's report, as a lab report (lab 7): totals, MTTD per fault,
//! MTTR p50/p99/max, tasks and records, one row per session, the
//! invariants, and an SVG timeline of the calls (the labs' `svg.rs`).
use super::faults::Faults;
use super::host::{loadavg, WarmUp};
use super::session::{Kind, Session, SessionResult, Shared};
use super::verify::TaskFigures;
use super::RunArgs;
use crate::cluster::state::State;
use crate::lab::report::{LabReport, Table};
use crate::lab::Scale;
use serde_json::json;
use std::path::Path;

/// The value at quantile `q` of sorted `v` (nearest rank).
fn quantile(v: &[u64], q: f64) -> Option<u64> {
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss, reason = "1 ≤ rank ≤ len")]
    let rank = ((q * v.len() as f64).ceil() as usize).clamp(1, v.len().max(1));
    v.get(rank - 1).copied()
}

fn ms(v: Option<u64>) -> String {
    v.map_or("—".into(), |v| format!("{v} ms"))
}

/// p50 / p99 / max of sorted `v`.
fn spread(v: &[u64]) -> String {
    format!("{} / {} / {}", ms(quantile(v, 0.5)), ms(quantile(v, 0.99)), ms(v.last().copied()))
}

/// Kill → the session's next successful append on its sandbox, for each
/// session whose node was lost; `None`: it never came back.
fn mttr(r: &SessionResult, faults: &Faults) -> Option<Option<u64>> {
    let v = faults.killed(&r.node)?;
    r.sandbox.as_ref()?;
    Some(r.outages.iter().find(|(_, back)| *back > v.at_ms).map(|(_, back)| back - v.at_ms))
}

/// Where a recovered session's MTTR went: kill → its sandbox made again
/// elsewhere (the verdict, the rebind's queue and its steps up to the
/// create), and that → its next append back (the launch, the rebind's end,
/// the client's retry and the call). `None` unless it came back, and for
/// one whose times are out of that order (which the drill checks).
fn split(r: &SessionResult, faults: &Faults) -> Option<(u64, u64)> {
    let kill = faults.killed(&r.node)?.at_ms;
    let back = kill + mttr(r, faults)??;
    let made = r.remade_ms?;
    Some((made.checked_sub(kill)?, back.checked_sub(made)?))
}

/// Per-second counts of each kind of try.
fn per_second(shared: &Shared, kind: Kind, secs: u64) -> Vec<(f64, f64)> {
    let mut n = vec![0u32; usize::try_from(secs + 1).unwrap_or(0)];
    for e in shared.events.lock().iter().filter(|e| e.kind == kind) {
        if let Some(c) = n.get_mut(usize::try_from(e.at_ms / 1000).unwrap_or(usize::MAX)) {
            *c += 1;
        }
    }
    n.iter().enumerate().map(|(i, c)| (i as f64, f64::from(*c))).collect()
}

fn timeline(shared: &Shared, faults: &Faults, stopped_ms: u64) -> String {
    let secs = stopped_ms / 1000 + 1;
    let ok = per_second(shared, Kind::Ok, secs);
    let top = ok.iter().map(|p| p.1).fold(1.0, f64::max);
    let mut series = vec![
        ("calls ok/s".to_string(), ok),
        ("retried tries/s".to_string(), per_second(shared, Kind::Retry, secs)),
        ("user-visible errors/s".to_string(), per_second(shared, Kind::UserError, secs)),
    ];
    let mark = |at: u64| {
        let x = at as f64 / 1000.0;
        vec![(x, 0.0), (x, top)]
    };
    for v in &faults.victims {
        series.push((format!("{} {}", v.mode, v.host), mark(v.at_ms)));
    }
    if let Some(l) = &faults.leader {
        series.push((format!("kill nats {}", l.server), mark(l.at_ms)));
    }
    crate::lab::svg::lines("Calls through the drill", "seconds", "per second", &series)
}

#[allow(clippy::too_many_arguments, reason = "the drill's parts, each built by its own step")]
pub fn build(
    st: &State,
    a: &RunArgs,
    out: &Path,
    shared: &Shared,
    faults: &Faults,
    sessions: &[Session],
    tasks: &TaskFigures,
    warm: &WarmUp,
    stopped_ms: u64,
) -> anyhow::Result<LabReport> {
    let scale = if a.sessions >= 100 { Scale::Full } else { Scale::Small };
    let mut rep = LabReport::new(crate::lab::lab(7), scale);
    // The report is made once the drill is over: its start is the drill's
    // (it said the time the report was written, minutes later).
    rep.started = rep.started.saturating_sub(shared.t0.elapsed().as_secs());
    let rs: Vec<&SessionResult> = sessions.iter().map(|s| &s.r).collect();
    let lost_node = |r: &&SessionResult| faults.killed(&r.node).is_some();
    let (on_lost, on_live): (Vec<&SessionResult>, Vec<&SessionResult>) = rs.iter().copied().partition(lost_node);
    let sum = |v: &[&SessionResult], f: fn(&SessionResult) -> u64| v.iter().map(|r| f(r)).sum::<u64>();
    let opened = rs.iter().filter(|r| r.sandbox.is_some()).count();
    let errors = sum(&rs, |r| r.user_errors);
    let mut rec: Vec<u64> = Vec::new();
    let mut unrecovered = 0;
    for r in &rs {
        match mttr(r, faults) {
            Some(Some(t)) => rec.push(t),
            Some(None) => unrecovered += 1,
            None => {}
        }
    }
    rec.sort_unstable();
    let (mut made, mut then): (Vec<u64>, Vec<u64>) = rs.iter().filter_map(|r| split(r, faults)).unzip();
    made.sort_unstable();
    then.sort_unstable();
    let unsupported = rs.iter().any(|r| r.checkpoint_unsupported);
    let live_bad = sum(&on_live, |r| r.written_lost + r.corrupted);
    let live_acked_bad = sum(&on_live, |r| r.acked_lost + r.corrupted);
    let all_acked_bad = sum(&rs.clone(), |r| r.acked_lost + r.corrupted);

    let mut t = Table::new("Total", &["figure", "value"]);
    let rows: Vec<(&str, String)> = vec![
        ("nodes", st.hosts.len().to_string()),
        ("sessions (opened)", format!("{} ({opened})", a.sessions)),
        ("calls", sum(&rs, |r| r.calls).to_string()),
        ("retried tries (503 or unreachable)", sum(&rs, |r| r.retries).to_string()),
        ("user-visible errors", errors.to_string()),
        ("sessions with a user-visible error", rs.iter().filter(|r| r.user_errors > 0).count().to_string()),
        ("MTTR p50 / p99 / max", spread(&rec)),
        ("sessions of lost nodes recovered / not", format!("{} / {unrecovered}", rec.len())),
        ("MTTR's first part, kill → sandbox made again, p50 / p99 / max", spread(&made)),
        ("MTTR's second part, sandbox made again → session back, p50 / p99 / max", spread(&then)),
        ("tasks acknowledged / succeeded", format!("{} / {}", tasks.acknowledged, tasks.succeeded)),
        (
            "tasks lost / unfinished / duplicated in effect / re-run",
            format!("{} / {} / {} / {}", tasks.lost, tasks.unfinished, tasks.duplicated, tasks.retried),
        ),
        ("records written / acknowledged", format!("{} / {}", sum(&rs, |r| r.written), sum(&rs, |r| r.acked))),
        ("records lost or corrupted, surviving nodes", live_bad.to_string()),
        (
            "rebinds seen by sessions / unacknowledged records they took back",
            format!("{} / {}", sum(&rs, |r| r.rebinds_seen), sum(&rs, |r| r.written_lost - r.acked_lost)),
        ),
        ("acknowledged records lost or corrupted, all", all_acked_bad.to_string()),
        ("host in the warm-up, before any fault", warm.line()),
        ("load average at the end", loadavg()),
    ];
    for (k, v) in rows {
        t.row(vec![k.into(), v]);
    }
    rep.tables.push(t);

    rep.tables.push(faults_table(faults));
    rep.tables.push(sessions_table(&rs, faults));

    rep.check("every session opened", opened == rs.len(), format!("{opened} of {}", rs.len()));
    rep.check(
        "0 tasks lost",
        tasks.lost == 0,
        format!("{} lost {:?}", tasks.lost, tasks.lost_ids.iter().take(5).collect::<Vec<_>>()),
    );
    rep.check("every task ended", tasks.unfinished == 0, format!("{} not ended after the wait", tasks.unfinished));
    rep.check(
        "0 tasks run twice in effect",
        tasks.duplicated == 0,
        format!("{:?}", tasks.duplicated_ids.iter().take(5).collect::<Vec<_>>()),
    );
    rep.check(
        "0 records lost or corrupted on surviving nodes",
        live_bad == 0 && live_acked_bad == 0,
        format!("{live_bad} over {} sessions", on_live.len()),
    );
    rep.check("0 acknowledged records lost or corrupted", all_acked_bad == 0, format!("{all_acked_bad}"));
    let measured = faults.victims.iter().all(|v| v.mttd_ms.is_some());
    rep.check("MTTD measured for every node fault", measured, format!("{} faults", faults.victims.len()));
    rep.check(
        "0 user-visible errors",
        errors == 0,
        format!("{errors} over {} sessions", rs.iter().filter(|r| r.user_errors > 0).count()),
    );
    rep.check(
        "every session of a lost node recovered",
        unrecovered == 0,
        format!("{unrecovered} of {} did not", on_lost.len()),
    );
    rep.check(
        "every recovered session's sandbox made again after the kill, and back after that",
        made.len() == rec.len(),
        format!("{} of {} (the rest: no time, or out of order)", made.len(), rec.len()),
    );
    if unsupported {
        rep.notes.push("the cluster answers no POST /v1/workspaces/{name}/checkpoint (rebind not built): no record was acknowledged, and the sessions of lost nodes stay lost (counted above)".into());
    }
    rep.notes.push(format!(
        "{} nodes, kill {} ({}), queue leader kill: {}, seed {}, pace {:?}, drill at nice {}",
        st.hosts.len(),
        a.kill_nodes,
        if a.partition { "partition" } else { "SIGKILL" },
        a.kill_queue_leader,
        a.seed,
        a.pace(),
        a.nice
    ));
    rep.chart(out, "timeline.svg", timeline(shared, faults, stopped_ms))?;
    rep.data = json!({
        "nodes": st.hosts.len(),
        "sessions": rs,
        "faults": faults,
        "tasks": tasks,
        "mttr": {
            "p50Ms": quantile(&rec, 0.5), "p99Ms": quantile(&rec, 0.99), "maxMs": rec.last(), "recovered": rec.len(), "unrecovered": unrecovered,
            "remade": {"p50Ms": quantile(&made, 0.5), "p99Ms": quantile(&made, 0.99), "maxMs": made.last(), "sessions": made.len()},
            "backAfterRemade": {"p50Ms": quantile(&then, 0.5), "p99Ms": quantile(&then, 0.99), "maxMs": then.last()},
        },
        "userVisibleErrors": errors,
        "records": {
            "survivors": {"sessions": on_live.len(), "lost": sum(&on_live, |r| r.written_lost), "ackedLost": sum(&on_live, |r| r.acked_lost), "corrupted": sum(&on_live, |r| r.corrupted), "written": sum(&on_live, |r| r.written)},
            "lostNodes": {"sessions": on_lost.len(), "readable": on_lost.iter().filter(|r| r.readable).count(), "lost": sum(&on_lost, |r| r.written_lost), "ackedLost": sum(&on_lost, |r| r.acked_lost), "corrupted": sum(&on_lost, |r| r.corrupted)},
        },
        "checkpointRoute": !unsupported,
        "loadavg": loadavg(),
        "warmUp": warm,
    });
    Ok(rep)
}

fn faults_table(faults: &Faults) -> Table {
    let mut f = Table::new("Faults", &["fault", "at", "MTTD / election"]);
    for v in &faults.victims {
        f.row(vec![format!("{} {}", v.mode, v.host), format!("{} ms", v.at_ms), ms(v.mttd_ms)]);
    }
    if let Some(l) = &faults.leader {
        f.row(vec![
            format!("kill nats-server {} (task stream leader)", l.server),
            format!("{} ms", l.at_ms),
            ms(l.elected_ms),
        ]);
    }
    f
}

fn sessions_table(rs: &[&SessionResult], faults: &Faults) -> Table {
    let mut s = Table::new(
        "Sessions",
        &[
            "#",
            "node",
            "lost node",
            "written",
            "acked",
            "retries",
            "errors",
            "MTTR",
            "lost (written/acked)",
            "corrupted",
            "slowest call (at)",
        ],
    );
    for r in rs {
        let m = mttr(r, faults);
        s.row(vec![
            r.index.to_string(),
            r.node.clone(),
            if m.is_some() { "yes" } else { "" }.into(),
            r.written.to_string(),
            r.acked.to_string(),
            r.retries.to_string(),
            r.user_errors.to_string(),
            m.map_or(String::new(), ms),
            format!("{}/{}", r.written_lost, r.acked_lost),
            r.corrupted.to_string(),
            r.slowest.as_ref().map_or(String::new(), |(what, at, took)| format!("{what} {took} ms ({at} ms)")),
        ]);
    }
    s
}
