//! Header rules shared by ember's two reverse proxies: the daemon's
//! `/v1/sandboxes/{id}/proxy/{port}` route and the agent's `/proxy/{port}`.
//! Pure functions over [`http::HeaderMap`], no IO.
use http::{header, HeaderMap, HeaderName, HeaderValue};

/// Never forwarded in either direction (RFC 9110 §7.6.1); `connection` and
/// `upgrade` are put back for an upgrade (a WebSocket), which the proxy then
/// splices through.
pub const HOP_BY_HOP: &[&str] = &[
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "proxy-connection",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
];

/// Removes the hop-by-hop headers of one hop: the fixed list, every header the
/// `Connection` header names (RFC 9110 §7.6.1: a sender lists its own
/// hop-by-hop fields there), and `extra` (what a proxy must not pass on, e.g.
/// the daemon's API key). An `Upgrade` is kept, with `Connection: upgrade`,
/// and returned.
pub fn strip_hop_by_hop(h: &mut HeaderMap, extra: &[&str]) -> Option<HeaderValue> {
    let upgrade = h.get(header::UPGRADE).cloned();
    let named: Vec<HeaderName> = h
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|t| HeaderName::from_bytes(t.trim().as_bytes()).ok())
        .collect();
    for name in named {
        h.remove(name);
    }
    for name in HOP_BY_HOP.iter().chain(extra) {
        h.remove(*name);
    }
    if let Some(u) = &upgrade {
        h.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
        h.insert(header::UPGRADE, u.clone());
    }
    upgrade
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(*k, HeaderValue::from_static(v));
        }
        h
    }

    #[test]
    fn fixed_listed_and_extra_headers_go_the_rest_stays() {
        let mut h = map(&[
            ("connection", "keep-alive, X-Hop"),
            ("connection", "x-other"),
            ("keep-alive", "timeout=5"),
            ("transfer-encoding", "chunked"),
            ("x-hop", "secret"),
            ("x-other", "1"),
            ("x-api-key", "k"),
            ("content-type", "text/plain"),
            ("x-keep", "yes"),
        ]);
        assert_eq!(strip_hop_by_hop(&mut h, &["x-api-key"]), None);
        let left: Vec<&str> = h.keys().map(|k| k.as_str()).collect();
        assert_eq!(left, ["content-type", "x-keep"]);
    }

    #[test]
    fn an_upgrade_survives_with_connection_upgrade_only() {
        let mut h = map(&[("connection", "Upgrade, X-Hop"), ("upgrade", "websocket"), ("x-hop", "1")]);
        assert_eq!(strip_hop_by_hop(&mut h, &[]), Some(HeaderValue::from_static("websocket")));
        assert_eq!(h.len(), 2);
        assert_eq!(h[header::CONNECTION], "upgrade");
        assert_eq!(h[header::UPGRADE], "websocket");
    }

    #[test]
    fn junk_in_connection_is_ignored() {
        let mut h = map(&[("connection", ", ,bad name"), ("x-keep", "1")]);
        strip_hop_by_hop(&mut h, &[]);
        assert_eq!(h.keys().map(|k| k.as_str()).collect::<Vec<_>>(), ["x-keep"]);
    }
}
