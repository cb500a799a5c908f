//! What the dashboard shows, once a second: pools (with the sizing
//! arithmetic), sandboxes, latency histograms, queue depth, denied flows and
//! the count of live nodes (read back from the `/metrics` exposition: one
//! source for both), a cluster's node list (the node registry as this node
//! sees it) and the reports directory's listing.
use crate::error::ApiError;
use crate::{ApiPath, ApiState};
use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::io::Read;

/// Sandboxes listed at most: the page is a view, not an export.
const MAX_SANDBOXES: usize = 500;
/// Reports listed at most, and the largest one served.
const MAX_REPORTS: usize = 200;
const MAX_REPORT_BYTES: u64 = 4 << 20;

/// What `p` may see: the admin everything; a tenant its own pools and
/// sandboxes, and none of the daemon's figures (its `/metrics` and the lab
/// reports are the admin's).
pub(super) async fn take(st: &ApiState, p: &crate::Principal) -> Value {
    use ember_engine::tenants::Kind;
    let admin = p.tenant_key().is_none();
    let metrics = if admin { crate::system::metrics_text(st).await } else { String::new() };
    let pools = st.engine.list_pools().await.unwrap_or_default();
    let pools = crate::tenancy::visible(st, p, Kind::Pool, pools, |x| &x.spec.name);
    let claimed = by_label(&metrics, "ember_pool_claimed", "pool");
    let pools: Vec<Value> = pools
        .iter()
        .map(|p| {
            let mut v = serde_json::to_value(crate::pools::info(p)).unwrap_or_default();
            v["claimed"] = claimed.get(&p.spec.name).copied().unwrap_or(0.0).into();
            v
        })
        .collect();
    let recs = st.engine.list(&ember_engine::ListFilter::default()).await.unwrap_or_default();
    let mut recs = crate::tenancy::visible(st, p, Kind::Sandbox, recs, |r| r.id.as_str());
    recs.sort_by_key(|r| std::cmp::Reverse(r.created_at_ms));
    let sandboxes: Vec<Value> = recs
        .iter()
        .take(MAX_SANDBOXES)
        .map(|r| {
            json!({
                "id": r.id.as_str(), "state": r.state.as_str(), "runtimeClass": r.spec.runtime_class,
                "template": r.spec.template, "pool": r.pool, "launch": r.launch.as_ref().map(|l| &l.kind),
            })
        })
        .collect();
    json!({
        "pools": pools,
        "sandboxes": sandboxes,
        "sandboxesTotal": recs.len(),
        "latency": {
            "claim": histogram(&metrics, "ember_sandbox_launch_seconds", Some(("launch", "warm"))),
            "create": histogram(&metrics, "ember_sandbox_launch_seconds", Some(("launch", "cold"))),
            "exec": histogram(&metrics, "ember_exec_seconds", None),
        },
        "queue": by_label(&metrics, "ember_task_queue_depth", "tier"),
        "denied": by_label(&metrics, "ember_network_denied_flows_total", "rule"),
        "nodesAlive": sample(&metrics, "ember_cluster_nodes_alive"),
        // A cluster's nodes, with capacity and liveness: the daemon's figures, as `/metrics`.
        "nodes": if admin { st.engine.cluster_nodes() } else { Vec::new() },
        "reports": if admin { reports(st) } else { Vec::new() },
    })
}

/// `name{labels} value` lines of the exposition: (labels, value).
fn samples<'a>(text: &'a str, name: &'a str) -> impl Iterator<Item = (&'a str, f64)> + 'a {
    text.lines().filter_map(move |l| {
        let rest = l.strip_prefix(name)?;
        let (labels, value) = match rest.strip_prefix('{') {
            Some(r) => r.split_once("} ")?,
            None => ("", rest.strip_prefix(' ')?),
        };
        Some((labels, value.split_whitespace().next()?.parse().ok()?))
    })
}

fn label<'a>(labels: &'a str, key: &str) -> Option<&'a str> {
    labels.split(',').find_map(|kv| kv.strip_prefix(key)?.strip_prefix("=\"")?.strip_suffix('"'))
}

fn sample(text: &str, name: &str) -> Option<f64> {
    samples(text, name).map(|(_, v)| v).next()
}

/// The values of `name` summed per value of label `key`.
fn by_label(text: &str, name: &str, key: &str) -> BTreeMap<String, f64> {
    let mut out = BTreeMap::new();
    for (labels, v) in samples(text, name) {
        if let Some(k) = label(labels, key) {
            *out.entry(k.to_string()).or_default() += v;
        }
    }
    out
}

/// A histogram's buckets summed over its series (those with `filter`):
/// `{"buckets": [[le, cumulative count]...], "count", "sum"}`.
fn histogram(text: &str, name: &str, filter: Option<(&str, &str)>) -> Value {
    let keep = |labels: &str| filter.is_none_or(|(k, v)| label(labels, k) == Some(v));
    let mut buckets: BTreeMap<u64, (String, f64)> = BTreeMap::new();
    for (labels, v) in samples(text, &format!("{name}_bucket")).filter(|(l, _)| keep(l)) {
        let Some(le) = label(labels, "le") else { continue };
        let bound: f64 = if le == "+Inf" { f64::INFINITY } else { le.parse().unwrap_or(f64::INFINITY) };
        buckets.entry(bound.to_bits()).or_insert_with(|| (le.to_string(), 0.0)).1 += v;
    }
    let total = |suffix: &str| -> f64 {
        samples(text, &format!("{name}_{suffix}")).filter(|(l, _)| keep(l)).map(|(_, v)| v).sum()
    };
    // Positive floats' bit patterns sort as the floats do.
    let buckets: Vec<Value> = buckets.into_values().map(|(le, n)| json!([le, n])).collect();
    json!({ "buckets": buckets, "count": total("count"), "sum": total("sum") })
}

/// The reports directory's regular files (names only), newest first.
fn reports(st: &ApiState) -> Vec<Value> {
    let Some(dir) = st.cfg.ui.as_ref().and_then(|u| u.reports.as_ref()) else { return Vec::new() };
    let mut out: Vec<(std::time::SystemTime, String)> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .take(10 * MAX_REPORTS)
        .filter_map(|e| {
            let m = e.metadata().ok().filter(|m| m.is_file())?;
            let name = e.file_name().into_string().ok().filter(|n| servable(n))?;
            Some((m.modified().ok()?, name))
        })
        .collect();
    out.sort_by(|a, b| b.cmp(a));
    out.into_iter().take(MAX_REPORTS).map(|(_, n)| Value::String(n)).collect()
}

/// A plain file name of a report kind: no path, no dot file.
fn servable(name: &str) -> bool {
    !name.starts_with('.') && !name.contains('/') && [".md", ".json", ".txt", ".log"].iter().any(|s| name.ends_with(s))
}

/// `GET /ui/reports/{name}`: one report as text, at most 4 MiB.
pub(super) async fn report(
    State(st): State<ApiState>,
    h: HeaderMap,
    ApiPath(name): ApiPath<String>,
) -> Result<Response, ApiError> {
    match super::principal(&st, &h) {
        None => return Err(super::refused()),
        // The lab's reports are the daemon's, as `/metrics` is.
        Some(p) if p.tenant_key().is_some() => {
            return Err(ApiError::new(StatusCode::FORBIDDEN, "TENANT::FORBIDDEN", "the reports need the admin key"))
        }
        Some(_) => {}
    }
    let not_found = || ApiError::new(StatusCode::NOT_FOUND, "GENERAL::NOT_FOUND", format!("no report {name:?}"));
    let dir = st.cfg.ui.as_ref().and_then(|u| u.reports.clone()).ok_or_else(not_found)?;
    if !servable(&name) {
        return Err(not_found());
    }
    let path = dir.join(&name);
    let read = tokio::task::spawn_blocking(move || -> std::io::Result<Vec<u8>> {
        use std::os::unix::fs::OpenOptionsExt;
        // The directory is the operator's; a link in it is still not followed.
        let f = std::fs::OpenOptions::new().read(true).custom_flags(libc_o_nofollow()).open(&path)?;
        let mut buf = Vec::new();
        f.take(MAX_REPORT_BYTES).read_to_end(&mut buf)?;
        Ok(buf)
    })
    .await
    .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "GENERAL::INTERNAL", e.to_string()))?;
    let body = read.map_err(|_| not_found())?;
    Ok(([(header::CONTENT_TYPE, "text/plain; charset=utf-8")], body).into_response())
}

fn libc_o_nofollow() -> i32 {
    rustix::fs::OFlags::NOFOLLOW.bits() as i32
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = "# TYPE x histogram\n\
        ember_exec_seconds_bucket{le=\"0.001\"} 2\n\
        ember_exec_seconds_bucket{le=\"+Inf\"} 3\n\
        ember_exec_seconds_sum 0.5\n\
        ember_exec_seconds_count 3\n\
        ember_task_queue_depth{tier=\"batch\"} 4\n\
        ember_task_queue_depth{tier=\"interactive\"} 1\n";

    #[test]
    fn the_exposition_reads_back() {
        let h = histogram(TEXT, "ember_exec_seconds", None);
        assert_eq!(h["buckets"], json!([["0.001", 2.0], ["+Inf", 3.0]]));
        assert_eq!((h["count"].as_f64(), h["sum"].as_f64()), (Some(3.0), Some(0.5)));
        let q = by_label(TEXT, "ember_task_queue_depth", "tier");
        assert_eq!((q["batch"], q["interactive"]), (4.0, 1.0));
        assert!(!servable("../x.md") && !servable(".hidden.md") && servable("lab-3.md"));
    }
}
