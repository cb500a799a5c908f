//! `bench claim`'s figures as a table, or as JSON, judged against issues 4's and 19's targets.
use super::claim::{ClaimArgs, ClaimFigures};
use super::ember::PHASES;
use super::pool::TEMPLATE;
use super::report::ms;
use super::stats::{Series, Summary};
use serde_json::{json, Value};

/// Issue 4's targets, and issue 19's (the server's p99 with the pool
/// refilling, the burst's p99, time to first output, claims/s).
pub const WARM_P50_MS: f64 = 1.0;
pub const WARM_P99_MS: f64 = 5.0;
pub const WARM_SERVER_P99_MS: f64 = 2.0;
pub const BURST_P99_MS: f64 = 10.0;
pub const FIRST_OUTPUT_MS: f64 = 3.0;
pub const CLAIMS_PER_SEC: f64 = 2000.0;

pub struct ClaimReport<'a> {
    pub url: &'a str,
    pub args: &'a ClaimArgs,
    pub f: &'a ClaimFigures,
    /// /proc/loadavg at the start and the end.
    pub load: (String, String),
}

/// A limit on one percentile of a figure.
struct Limit {
    pct: &'static str,
    max_ms: f64,
}

impl Limit {
    fn value(&self, s: &Summary) -> Option<f64> {
        if self.pct == "p99" {
            s.p99_ms
        } else {
            s.p50_ms
        }
    }

    fn verdict(&self, s: &Summary) -> String {
        let mark = match self.value(s) {
            Some(v) if v <= self.max_ms => "✓",
            Some(_) => "✗",
            None => "?",
        };
        format!("{} ≤ {} {mark}", self.pct, self.max_ms)
    }
}

struct Row {
    key: &'static str,
    label: String,
    s: Summary,
    limits: Vec<Limit>,
}

fn mark(ok: Option<bool>) -> &'static str {
    match ok {
        Some(true) => "✓",
        Some(false) => "✗",
        None => "?",
    }
}

impl ClaimReport<'_> {
    fn rows(&self) -> Vec<Row> {
        let f = self.f;
        let row = |key, label: &str, s: &Series, limits| Row { key, label: label.into(), s: s.summary(), limits };
        let lim = |pct, max_ms| Limit { pct, max_ms };
        let n = self.args.concurrency;
        let mut v = vec![
            // Targets are judged where a peer's figures are taken: at the
            // client. The server's own figure is shown beside, unjudged.
            // Issue 19 judges this one at the server: the pool refills
            // beside it, and the question is whether refills delay claims.
            row("warmServer", "1 warm claim, server", &f.warm_server, vec![lim("p99", WARM_SERVER_P99_MS)]),
            row(
                "warmClient",
                "2 warm claim, client (loopback)",
                &f.warm_wall,
                vec![lim("p50", WARM_P50_MS), lim("p99", WARM_P99_MS)],
            ),
            row("warmOutside", "    client − server", &f.warm_outside, vec![]),
            row(
                "burstClient",
                &format!("3 {n} concurrent claims, client"),
                &f.burst_wall,
                vec![lim("p99", BURST_P99_MS)],
            ),
            row("burstServer", "    same, server", &f.burst_server, vec![]),
            row("burstSpan", "    release → last reply", &f.burst_span, vec![]),
            row("firstOutput", "4 claim → first stdout (echo x)", &f.first_output, vec![lim("p50", FIRST_OUTPUT_MS)]),
            row("firstOutputClaim", "    create call", &f.first_output_claim, vec![]),
            row("firstOutputExec", "    create returned → first stdout", &f.first_output_exec, vec![]),
            row("steadyOutput", "    the same again (steady command)", &f.steady_output, vec![]),
            row("coldServer", "5 cold create, server", &f.cold_server, vec![]),
            row("coldClient", "    cold create, client", &f.cold_wall, vec![]),
        ];
        for p in PHASES {
            if let Some(s) = f.phases.get(p) {
                v.push(Row { key: "phase", label: format!("    phase {p}"), s: s.summary(), limits: vec![] });
            }
        }
        v.push(row("sustainClient", "6 sustained claims, client", &f.sustain.wall, vec![]));
        v.push(row("sustainServer", "    sustained claims, server", &f.sustain.server, vec![]));
        v
    }

    fn sustain_line(&self) -> String {
        let s = &self.f.sustain;
        if s.claims == 0 {
            return "6 sustained: not measured (--sustain 0)".into();
        }
        let Some(rate) = s.per_sec() else { return "6 sustained: no claim succeeded".into() };
        let ok = s.wall.summary().samples;
        format!(
            "6 sustained: {ok} claims in {:.2} s from {} tasks = {rate:.0} claims/s (target ≥ {CLAIMS_PER_SEC} {}); \
             {} warm ({:.1} %); the pool ({} idle, filled in {:.1} s) refilled alongside",
            s.elapsed.as_secs_f64(),
            s.tasks,
            mark(Some(rate >= CLAIMS_PER_SEC)),
            s.warm,
            100.0 * s.warm as f64 / ok as f64,
            s.claims,
            s.fill.as_secs_f64(),
        )
    }

    /// p50s side by side: what the client saw, what the server took, and the rest.
    fn where_time_goes(&self) -> Vec<String> {
        let f = self.f;
        let p50 = |s: &Series| s.summary().p50_ms;
        let v = |x: Option<f64>| x.map_or("—".to_string(), |x| format!("{x:.2}"));
        let phases: Vec<String> =
            PHASES.iter().filter_map(|p| f.phases.get(*p).map(|s| format!("{p} {}", v(p50(s))))).collect();
        let (cw, cs) = (p50(&f.cold_wall), p50(&f.cold_server));
        let (ww, ws, wo) = (p50(&f.warm_wall), p50(&f.warm_server), p50(&f.warm_outside));
        let (fo, fc, fe) = (p50(&f.first_output), p50(&f.first_output_claim), p50(&f.first_output_exec));
        let (bw, bs) = (p50(&f.burst_wall), p50(&f.burst_server));
        vec![
            format!(
                "cold   {} ms client = {} server [{}] + {} HTTP/loopback",
                v(cw),
                v(cs),
                phases.join(" · "),
                v(cw.zip(cs).map(|(a, b)| a - b))
            ),
            format!(
                "warm   {} ms client = {} server (pop idle, bind env/user via the agent, persist the record) + {} HTTP/loopback/JSON",
                v(ww),
                v(ws),
                v(wo)
            ),
            format!(
                "burst  {} ms client = {} server (one claim alone: {}; the rest is waiting behind the others) + {} outside",
                v(bw),
                v(bs),
                v(ws),
                v(bw.zip(bs).map(|(a, b)| a - b))
            ),
            format!("output {} ms = claim {} + exec until the first stdout event {}", v(fo), v(fc), v(fe)),
        ]
    }

    fn notes(&self) -> Vec<String> {
        let f = self.f;
        let mut n = vec![format!(
            "{} cores, load average {} at the start and {} at the end: shared with other work, so the figures are noisy",
            std::thread::available_parallelism().map_or(0, |n| n.get()),
            self.load.0,
            self.load.1
        )];
        if self.args.runs < 100 {
            n.push(format!("only {} runs per figure: p99 needs at least 100 to mean anything", self.args.runs));
        }
        if f.misses > 0 {
            n.push(format!("{} sequential claims missed the pool and were left out of figures 1, 2 and 4", f.misses));
        }
        if f.burst_claims > f.burst_warm {
            n.push(format!(
                "{} of {} burst claims were cold (pool misses); figure 3 includes them",
                f.burst_claims - f.burst_warm,
                f.burst_claims
            ));
        }
        if f.cold_warm > 0 {
            n.push(format!("{} cold-reference creates came back warm and were left out", f.cold_warm));
        }
        n.push(format!("bursts: each task held an open connection before the release (a discarded GET /health), so figure 3 is {} claims, not {} TCP handshakes", self.args.concurrency, self.args.concurrency));
        if !f.leftovers.is_empty() {
            n.push(format!("could not remove: {}", f.leftovers.join(" ")));
        }
        if let Some(a) = &f.aborted {
            n.push(format!("stopped early: {a}"));
        }
        n
    }

    pub fn print_table(&self) {
        let (a, f) = (self.args, self.f);
        println!("ember bench claim: template {TEMPLATE}, daemon {}, pool {}", self.url, f.pool);
        println!(
            "  {} cold creates; {} sequential claims; {} claims + echo; {} bursts of {}; {} sustained claims from {} tasks",
            a.runs, a.runs, a.runs, a.bursts, a.concurrency, a.sustain, a.tasks
        );
        if let Some((idle, t)) = f.fill {
            println!("  the pool filled to {idle} idle in {:.2} s; each figure starts on a full pool", t.as_secs_f64());
        }
        println!();
        println!(
            "{:<38}{:>5}{:>6}{:>9}{:>9}{:>9}{:>9}{:>9}{:>9}  target",
            "ms", "n", "fail", "min", "p50", "p90", "p99", "max", "mean"
        );
        let mut errors = Vec::new();
        for r in self.rows() {
            let s = &r.s;
            let target: Vec<String> = r.limits.iter().map(|l| l.verdict(s)).collect();
            println!(
                "{:<38}{:>5}{:>6}{}{}{}{}{}{}  {}",
                r.label,
                s.samples,
                s.failed,
                ms(s.min_ms),
                ms(s.p50_ms),
                ms(s.p90_ms),
                ms(s.p99_ms),
                ms(s.max_ms),
                ms(s.mean_ms),
                target.join("  ")
            );
            if let Some(e) = &s.first_error {
                errors.push(format!("{}: {e}", r.label.trim()));
            }
        }
        println!();
        println!("{}", self.sustain_line());
        println!("3 burst claims: {} of {} warm", f.burst_warm, f.burst_claims);
        println!();
        println!("where the time goes (p50, ms):");
        self.where_time_goes().iter().for_each(|l| println!("  {l}"));
        println!();
        println!("  server = X-Ember-Launch-Micros (request → ready agent, measured by the daemon);");
        println!(
            "  client = the create call as this client saw it; claimed sandboxes are removed between figures, untimed."
        );
        if !errors.is_empty() {
            println!();
            println!("first error of each failing figure:");
            errors.iter().for_each(|e| println!("  {e}"));
        }
        for n in self.notes() {
            println!("note: {n}");
        }
    }

    pub fn to_json(&self) -> Value {
        let (a, f) = (self.args, self.f);
        let rows = self.rows();
        let mut targets: Vec<Value> = rows
            .iter()
            .flat_map(|r| {
                r.limits.iter().map(move |l| {
                    let v = l.value(&r.s);
                    json!({ "figure": r.key, "percentile": l.pct, "limitMs": l.max_ms, "valueMs": v, "met": v.map(|v| v <= l.max_ms) })
                })
            })
            .collect();
        let rate = f.sustain.per_sec();
        targets.push(json!({ "figure": "claimsPerSec", "min": CLAIMS_PER_SEC, "value": rate, "met": rate.map(|r| r >= CLAIMS_PER_SEC) }));
        let figures: serde_json::Map<String, Value> = rows
            .iter()
            .filter(|r| r.key != "phase")
            .map(|r| (r.key.to_string(), serde_json::to_value(&r.s).unwrap_or(Value::Null)))
            .collect();
        let phases: serde_json::Map<String, Value> = f
            .phases
            .iter()
            .map(|(k, s)| (k.clone(), serde_json::to_value(s.summary()).unwrap_or(Value::Null)))
            .collect();
        json!({
            "url": self.url,
            "template": TEMPLATE,
            "pool": f.pool,
            "runs": a.runs,
            "concurrency": a.concurrency,
            "bursts": a.bursts,
            "poolFillSecs": f.fill.map(|(_, t)| t.as_secs_f64()),
            "figures": figures,
            "coldPhases": phases,
            "burstClaims": { "claims": f.burst_claims, "warm": f.burst_warm },
            "sustained": {
                "claims": f.sustain.claims,
                "tasks": f.sustain.tasks,
                "elapsedSecs": f.sustain.elapsed.as_secs_f64(),
                "claimsPerSec": rate,
                "warm": f.sustain.warm,
                "poolFillSecs": f.sustain.fill.as_secs_f64(),
            },
            "misses": f.misses,
            "targets": targets,
            "whereTheTimeGoes": self.where_time_goes(),
            "leftovers": f.leftovers,
            "aborted": f.aborted,
            "notes": self.notes(),
        })
    }

    /// 0 when every run succeeded and nothing was left behind.
    pub fn exit_code(&self) -> i32 {
        let failed = self.rows().iter().any(|r| r.s.failed > 0);
        i32::from(failed || self.f.aborted.is_some() || !self.f.leftovers.is_empty())
    }
}
