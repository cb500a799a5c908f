//! ember's image and template routes against the document: an import, a pull
//! from a real local registry, templates, and their error answers.
use super::registry::{layer_tar, push, write_layout, Config, Entry, Registry};
use super::Api;
use serde_json::json;

/// A registry with `oa/pulled:1` pushed to it (started before the daemon, which
/// must list it as insecure).
pub fn registry_with_image() -> Registry {
    let reg = Registry::start(0).expect("a local docker-registry");
    let dir = std::env::temp_dir().join(format!("ember-openapi-img-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let layer = layer_tar(&[Entry::Dir("etc"), Entry::File("etc/motd", b"hi\n", 0o644)]);
    write_layout(&dir, &[layer], &Config::default(), "1").unwrap();
    push(&dir, "1", &format!("{}/oa/pulled:1", reg.addr)).expect("skopeo push");
    let _ = std::fs::remove_dir_all(&dir);
    reg
}

pub async fn images_and_templates(api: &Api, reg: &str) {
    let tar = layer_tar(&[Entry::Dir("bin"), Entry::File("bin/true", b"#!/bin/sh\n", 0o755)]);
    let r = api.req("POST", "/v1/images/import", &[]).query("name=oa/img:1").raw("application/x-tar", tar).send().await;
    assert_eq!(r.status, 201, "{}", r.text());
    let r = api.req("POST", "/v1/images/import", &[]).raw("application/x-tar", vec![]).send().await;
    assert_eq!(r.status, 400);
    let name = "oa%2Fimg%3A1";
    assert_eq!(api.req("GET", "/v1/images/{name}", &[name]).send().await.json()["name"], "docker.io/oa/img:1");
    assert_eq!(api.req("GET", "/v1/images/{name}", &["nope%3A1"]).send().await.status, 404);
    let r = api.req("POST", "/v1/images/pull", &[]).json(json!({"image": format!("{reg}/oa/pulled:1")})).send().await;
    assert_eq!(r.status, 200, "{}", r.text());
    let r = api.req("POST", "/v1/images/pull", &[]).json(json!({"image": format!("{reg}/oa/missing:1")})).send().await;
    assert_eq!((r.status, r.json()["code"].as_str()), (404, Some("IMAGE::NOT_IN_REGISTRY")));
    let r = api.req("POST", "/v1/images/pull", &[]).json(json!({"image": "UPPER/Case"})).send().await;
    assert_eq!((r.status, r.json()["code"].as_str()), (400, Some("IMAGE::INVALID_REFERENCE")));
    assert_eq!(api.req("GET", "/v1/images/pulls", &[]).send().await.status, 200);
    assert_eq!(api.req("GET", "/v1/images", &[]).send().await.json()["items"].as_array().map(Vec::len), Some(2));

    let t = json!({"name": "oa-t", "image": "oa/img:1", "resources": {"memory": "64Mi"}, "env": {"A": "b"}});
    let r = api.req("POST", "/v1/templates", &[]).json(t.clone()).send().await;
    assert_eq!(r.status, 201, "{}", r.text());
    let r = api.req("POST", "/v1/templates", &[]).json(t).send().await;
    assert_eq!((r.status, r.json()["code"].as_str()), (409, Some("TEMPLATE::EXISTS")));
    let r = api.req("POST", "/v1/templates", &[]).json(json!({"name": "Bad Name"})).send().await;
    assert_eq!(r.status, 400);
    assert_eq!(api.req("GET", "/v1/templates", &[]).send().await.json()[0]["name"], "host");
    assert_eq!(
        api.req("GET", "/v1/templates/{name}", &["oa-t"]).send().await.json()["resources"]["memoryBytes"],
        64 << 20
    );
    let r = api.req("GET", "/v1/templates/{name}", &["nope"]).send().await;
    assert_eq!((r.status, r.json()["code"].as_str()), (404, Some("TEMPLATE::NOT_FOUND")), "{}", r.text());
    let r = api.req("DELETE", "/v1/templates/{name}", &["nope"]).send().await;
    assert_eq!((r.status, r.json()["code"].as_str()), (404, Some("TEMPLATE::NOT_FOUND")), "{}", r.text());
    let r = api.req("DELETE", "/v1/images/{name}", &[name]).send().await;
    assert_eq!((r.status, r.json()["code"].as_str()), (409, Some("IMAGE::IN_USE")));
    assert_eq!(api.req("DELETE", "/v1/templates/{name}", &["host"]).send().await.status, 400);
    assert_eq!(api.req("DELETE", "/v1/templates/{name}", &["oa-t"]).send().await.status, 204);
    assert_eq!(api.req("DELETE", "/v1/images/{name}", &[name]).send().await.status, 204);
    let r = api.req("POST", "/v1/images/prune", &[]).send().await;
    assert_eq!(r.json()["removedLayers"].as_array().map(Vec::len), Some(1), "{}", r.text());
}
