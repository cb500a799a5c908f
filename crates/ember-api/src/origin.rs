//! Sandbox origins (`ember serve --sandbox-domain DOMAIN`): a request whose
//! `Host` is `<port>-<sandbox id>.<DOMAIN>` is that sandbox port's own, on a
//! browser origin of its own, so a page a sandbox serves never runs on the
//! API's origin. The whole request (path, query, body, upgrade) goes to the
//! port through the proxy (`proxy::forward_host`), never to the API's routes,
//! after the same key rule as the path route: the admin key, the owning
//! tenant's key (another tenant's sandbox is a 404), or a scoped token of
//! the sandbox within its scope (docs/tenancy.md).
//!
//! The name is unambiguous: a port is digits only and a sandbox id is
//! `[a-z0-9-]` without a leading `-` and without dots (`ember_types::SandboxId`),
//! so the label splits at its first `-`, and the rest of the name must be
//! exactly the domain.
use crate::middleware::{principal, request_host};
use crate::ApiState;
use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::Response;
use ember_types::SandboxId;

/// A sandbox's port named by a `Host` name under the sandbox domain.
#[derive(Debug, PartialEq, Eq)]
pub struct SandboxOrigin {
    pub port: u16,
    pub id: SandboxId,
}

/// `name` is a host name without port, lowercase, without final dot
/// (`middleware::host_name`); `domain` as [`normalize_domain`] left it.
pub fn parse(name: &str, domain: &str) -> Option<SandboxOrigin> {
    let label = name.strip_suffix(domain)?.strip_suffix('.')?;
    let (port, id) = label.split_once('-')?;
    // One spelling per origin: `08080-…` would be a second origin for 8080.
    let port: u16 = port.parse().ok().filter(|p: &u16| *p != 0 && p.to_string() == port)?;
    let id = SandboxId::try_from(id.to_string()).ok()?;
    Some(SandboxOrigin { port, id })
}

/// `--sandbox-domain`'s value as the parse compares it: lowercase, without a
/// leading or final dot; `None` when nothing of a name is left.
pub fn normalize_domain(domain: &str) -> Option<String> {
    let d = domain.trim_matches('.').to_ascii_lowercase();
    let ok = !d.is_empty()
        && d.split('.').all(|l| !l.is_empty() && l.bytes().all(|c| c.is_ascii_alphanumeric() || c == b'-'));
    ok.then_some(d)
}

/// `<port>-<id>.<DOMAIN>`, the name [`parse`] reads back.
pub fn host_name(port: u16, id: &str, domain: &str) -> String {
    format!("{port}-{id}.{domain}")
}

/// Runs before the router: a request to a sandbox origin is proxied whole and
/// never reaches the API's routes (a `GET /v1/sandboxes` there is the
/// sandbox's). Any other request goes on.
pub async fn dispatch(State(st): State<ApiState>, req: Request, next: Next) -> Response {
    let Some(domain) = st.cfg.sandbox_domain.as_deref() else { return next.run(req).await };
    let Some(host) = request_host(&req) else { return next.run(req).await };
    let target = crate::middleware::host_name(&host).and_then(|name| parse(&name, domain));
    let Some(SandboxOrigin { port, id }) = target else { return next.run(req).await };
    let p = match principal(&st, req.headers()) {
        Ok(p) => p,
        Err(refused) => return crate::tenancy::unauthorized(&st, req, *refused).await,
    };
    let path = req.uri().path().to_string();
    let forward = |req| crate::proxy::forward_host(st.clone(), id.to_string(), port, &host, req);
    crate::tenancy::outside_call(&st, &p, (id.as_str(), port, &path), req, forward).await
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: &str = "3f2a1b4c-5d6e-4f70-8a9b-0c1d2e3f4a5b";

    #[test]
    fn a_sandbox_name_splits_at_its_first_dash() {
        let d = normalize_domain(".Sb.Example.").unwrap();
        assert_eq!(d, "sb.example");
        let got = parse(&host_name(8080, ID, &d), &d).unwrap();
        assert_eq!((got.port, got.id.as_str()), (8080, ID));
        // An id made of dashes and digits still parses one way only.
        let got = parse("44772-1-2-3.sb.example", &d).unwrap();
        assert_eq!((got.port, got.id.as_str()), (44772, "1-2-3"));
    }

    #[test]
    fn names_that_are_not_a_sandbox_port_do_not_parse() {
        let d = "sb.example";
        for bad in [
            "sb.example",
            "8080.sb.example",
            "8080-.sb.example",
            "8080--x.sb.example",
            "08080-abc.sb.example",
            "0-abc.sb.example",
            "65536-abc.sb.example",
            "x8080-abc.sb.example",
            "8080-abc.evil.sb.example",
            "8080-abc.xsb.example",
            "8080-abc.sb.example.evil",
            "8080-ABC.sb.example",
            "-8080-abc.sb.example",
        ] {
            assert_eq!(parse(bad, d), None, "{bad}");
        }
        assert_eq!(normalize_domain(".."), None);
        assert_eq!(normalize_domain("a..b"), None);
        assert_eq!(normalize_domain("a/b"), None);
    }
}
