//! File and directory routes over raw HTTP, including a chunked multipart
//! upload without Content-Length, as the Python SDK sends it.
mod common;

use common::{enc, require_root, temp_dir, Agent};
use serde_json::{json, Value};
use std::path::Path;

const BOUNDARY: &str = "opensandbox_0123abcd_1700000000";

/// A multipart body of (metadata JSON, file name, content) pairs, as the SDK
/// writes it: the metadata is a file part named `metadata`.
fn multipart(parts: &[(Value, &str, &[u8])]) -> Vec<u8> {
    let mut b = Vec::new();
    for (meta, name, content) in parts {
        b.extend_from_slice(format!("--{BOUNDARY}\r\nContent-Disposition: form-data; name=\"metadata\"; filename=\"metadata\"\r\nContent-Type: application/json\r\n\r\n{meta}\r\n").as_bytes());
        b.extend_from_slice(format!("--{BOUNDARY}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"{name}\"\r\nContent-Type: application/octet-stream\r\n\r\n").as_bytes());
        b.extend_from_slice(content);
        b.extend_from_slice(b"\r\n");
    }
    b.extend_from_slice(format!("--{BOUNDARY}--\r\n").as_bytes());
    b
}

/// Encodes `body` as HTTP chunks of at most `size` bytes.
fn chunked(body: &[u8], size: usize) -> Vec<u8> {
    let mut out = Vec::new();
    for c in body.chunks(size) {
        out.extend_from_slice(format!("{:x}\r\n", c.len()).as_bytes());
        out.extend_from_slice(c);
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"0\r\n\r\n");
    out
}

fn upload_chunked(agent: &Agent, parts: &[(Value, &str, &[u8])]) -> common::Response {
    let ct = format!("multipart/form-data; boundary={BOUNDARY}");
    let headers = [("Content-Type", ct.as_str()), ("Transfer-Encoding", "chunked")];
    agent.request("POST", "/files/upload", &headers, &chunked(&multipart(parts), 1000))
}

fn info(agent: &Agent, path: &Path) -> Value {
    let p = path.to_str().unwrap();
    let r = agent.get(&format!("/files/info?path={}", enc(p)));
    assert_eq!(r.status, 200, "{}", r.text());
    r.json()[p].clone()
}

#[test]
fn chunked_upload_then_download_range_and_lines() {
    let agent = Agent::start();
    let dir = temp_dir("upload");
    let (a, b) = (dir.join("hello.txt"), dir.join("new/sub/big.bin"));
    let big: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
    let r = upload_chunked(
        &agent,
        &[
            (json!({"path": a, "owner": null, "group": null, "mode": 644}), "hello.txt", b"l1\nl2\nl3\nl4\n"),
            (json!({"path": b, "owner": null, "group": null, "mode": 755}), "big.bin", &big),
        ],
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(std::fs::read(&b).unwrap(), big, "parent dirs created, content intact");
    assert_eq!(info(&agent, &a)["mode"], 644);
    assert_eq!(info(&agent, &b)["mode"], 755);

    let r = agent.get(&format!("/files/download?path={}", enc(a.to_str().unwrap())));
    assert_eq!((r.status, r.body.as_slice()), (200, &b"l1\nl2\nl3\nl4\n"[..]));
    assert_eq!(r.header("content-type"), Some("application/octet-stream"));
    assert_eq!(r.header("content-disposition"), Some("attachment; filename=\"hello.txt\""));

    let q = format!("/files/download?path={}", enc(b.to_str().unwrap()));
    let r = agent.request("GET", &q, &[("Range", "bytes=10-19")], b"");
    assert_eq!((r.status, r.header("content-range")), (206, Some("bytes 10-19/300000")));
    assert_eq!(r.body, &big[10..20]);
    let r = agent.request("GET", &q, &[("Range", "bytes=-5")], b"");
    assert_eq!((r.status, r.body.as_slice()), (206, &big[big.len() - 5..]));
    let r = agent.request("GET", &q, &[("Range", "bytes=300000-")], b"");
    assert_eq!((r.status, r.header("content-range")), (416, Some("bytes */300000")));

    let q = format!("/files/download?path={}", enc(a.to_str().unwrap()));
    let r = agent.get(&format!("{q}&offset=2&limit=2"));
    assert_eq!((r.status, r.text().as_str()), (200, "l2\nl3\n"));
    assert!(r.header("content-type").unwrap().starts_with("text/plain"));
    assert_eq!(agent.get(&format!("{q}&offset=4")).text(), "l4\n");
    agent.get(&format!("{q}&offset=0")).assert_error(400, "INVALID_REQUEST_BODY");
    agent.get("/files/download?path=/no/such/file").assert_error(404, "FILE_NOT_FOUND");
    agent.get("/files/download").assert_error(400, "MISSING_QUERY");
}

#[test]
fn upload_rejects_unpaired_parts_and_bad_metadata() {
    let agent = Agent::start();
    let ct = format!("multipart/form-data; boundary={BOUNDARY}");
    let only_meta = format!(
        "--{BOUNDARY}\r\nContent-Disposition: form-data; name=\"metadata\"; filename=\"metadata\"\r\n\r\n{{\"path\":\"/tmp/x\"}}\r\n--{BOUNDARY}--\r\n"
    );
    agent
        .request("POST", "/files/upload", &[("Content-Type", &ct)], only_meta.as_bytes())
        .assert_error(400, "INVALID_FILE");
    let bad = multipart(&[(json!({"owner": "x"}), "f", b"data")]);
    agent.request("POST", "/files/upload", &[("Content-Type", &ct)], &bad).assert_error(400, "INVALID_FILE_METADATA");
    agent.request("POST", "/files/upload", &[("Content-Type", "text/plain")], b"x").assert_error(400, "INVALID_FILE");
}

#[test]
fn info_list_search() {
    let agent = Agent::start();
    let dir = temp_dir("walk");
    std::fs::create_dir_all(dir.join("b/deep")).unwrap();
    std::fs::write(dir.join("a.txt"), "12345").unwrap();
    std::fs::write(dir.join("b/c.py"), "").unwrap();
    std::fs::write(dir.join("b/deep/d.txt"), "").unwrap();
    std::os::unix::fs::symlink("/", dir.join("link")).unwrap();

    let fi = info(&agent, &dir.join("a.txt"));
    assert_eq!((fi["size"].as_i64(), fi["type"].as_str()), (Some(5), Some("file")));
    assert_eq!(fi["owner"], owner_name());
    assert!(fi["modified_at"].as_str().unwrap().ends_with('Z'));
    assert_eq!(info(&agent, &dir.join("link"))["type"], "symlink");
    agent.get("/files/info?path=/no/such").assert_error(404, "FILE_NOT_FOUND");

    let d = enc(dir.to_str().unwrap());
    let names = |v: Value| -> Vec<String> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|f| f["path"].as_str().unwrap().strip_prefix(dir.to_str().unwrap()).unwrap().to_string())
            .collect()
    };
    assert_eq!(names(agent.get(&format!("/directories/list?path={d}")).json()), vec!["/a.txt", "/b", "/link"]);
    assert_eq!(
        names(agent.get(&format!("/directories/list?path={d}&depth=3")).json()),
        vec!["/a.txt", "/b", "/b/c.py", "/b/deep", "/b/deep/d.txt", "/link"]
    );
    assert_eq!(names(agent.get(&format!("/directories/list?path={d}&depth=0")).json()), Vec::<String>::new());
    let link = enc(dir.join("link").to_str().unwrap());
    agent.get(&format!("/directories/list?path={link}")).assert_error(400, "INVALID_REQUEST_BODY");
    agent.get(&format!("/directories/list?path={d}&depth=x")).assert_error(400, "INVALID_REQUEST_BODY");
    agent.get("/directories/list").assert_error(400, "MISSING_QUERY");

    let found = names(agent.get(&format!("/files/search?path={d}&pattern=*.txt")).json());
    assert_eq!(found, vec!["/a.txt", "/b/deep/d.txt"]);
    let all = names(agent.get(&format!("/files/search?path={d}")).json());
    assert_eq!(all, vec!["/a.txt", "/b/c.py", "/b/deep/d.txt", "/link"]);
    agent.get("/files/search?path=/no/such").assert_error(404, "FILE_NOT_FOUND");
    agent.get(&format!("/files/search?path={d}&pattern=[")).assert_error(400, "INVALID_REQUEST_BODY");
}

fn owner_name() -> String {
    if ember_sys::process::getuid() == 0 {
        "root".into()
    } else {
        ember_sys::process::getuid().to_string()
    }
}

#[test]
fn mv_replace_permissions_mkdir_delete() {
    let agent = Agent::start();
    let dir = temp_dir("ops");
    let (src, dest) = (dir.join("src.txt"), dir.join("moved/dest.txt"));
    std::fs::write(&src, "host=localhost port=1 localhost").unwrap();

    let r = agent.post_json("/files/mv", &json!([{"src": src, "dest": dest}]).to_string());
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(!src.exists() && dest.exists());
    agent.post_json("/files/mv", &json!([{"src": src, "dest": dest}]).to_string()).assert_error(404, "FILE_NOT_FOUND");
    agent.post_json("/files/mv", r#"{"src":"x"}"#).assert_error(400, "INVALID_REQUEST_BODY");

    let body = json!({ dest.to_str().unwrap(): {"old": "localhost", "new": "0.0.0.0"} }).to_string();
    let r = agent.post_json("/files/replace?verbose=true", &body);
    assert_eq!(r.json(), json!({ dest.to_str().unwrap(): {"replacedCount": 2} }));
    assert_eq!(std::fs::read_to_string(&dest).unwrap(), "host=0.0.0.0 port=1 0.0.0.0");
    let r = agent.post_json("/files/replace", &body);
    assert_eq!((r.status, r.body.len()), (200, 0));
    let empty = json!({ dest.to_str().unwrap(): {"old": "", "new": "x"} }).to_string();
    agent.post_json("/files/replace", &empty).assert_error(400, "INVALID_REQUEST_BODY");

    let body = json!({ dest.to_str().unwrap(): {"mode": 600, "owner": "65534", "group": "65534"} }).to_string();
    assert_eq!(agent.post_json("/files/permissions", &body).status, 200);
    let fi = info(&agent, &dest);
    assert_eq!(fi["mode"], 600);
    // Only root may give a file away: this test, like the suite, runs as root.
    require_root("chown through /files/permissions");
    use std::os::unix::fs::MetadataExt;
    assert_eq!(std::fs::metadata(&dest).unwrap().uid(), 65534);
    let bad = json!({ dest.to_str().unwrap(): {"mode": 999} }).to_string();
    agent.post_json("/files/permissions", &bad).assert_error(400, "INVALID_REQUEST_BODY");

    let newdir = dir.join("x/y/z");
    let r = agent.post_json("/directories", &json!({ newdir.to_str().unwrap(): {"mode": 700} }).to_string());
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(info(&agent, &newdir)["type"], "directory");
    assert_eq!(info(&agent, &newdir)["mode"], 700);

    let d = enc(dir.join("moved").to_str().unwrap());
    agent.delete(&format!("/files?path={d}")).assert_error(500, "RUNTIME_ERROR");
    let f = enc(dest.to_str().unwrap());
    assert_eq!(agent.delete(&format!("/files?path={f}&path=%2Fno%2Fsuch")).status, 200);
    assert!(!dest.exists());
    let x = enc(dir.join("x").to_str().unwrap());
    assert_eq!(agent.delete(&format!("/directories?path={x}")).status, 200);
    assert!(!dir.join("x").exists());
}
