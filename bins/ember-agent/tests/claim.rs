//! Warm-pool claim binding: env, user and entrypoint bound once at claim time.
mod common;

use common::{texts, Agent};
use std::time::Duration;

#[test]
fn claim_binds_env_and_user_once() {
    let a = Agent::start_with(&[("BOOT", "1")]);
    let before = a.run(r#"{"command":"echo ${CLAIMED:-none} $BOOT"}"#);
    assert_eq!(texts(&before, "stdout"), ["none 1"]);
    let r = a.post_json("/ember/v1/claim", r#"{"env":{"CLAIMED":"yes","BOOT":"2"},"uid":65534,"gid":65534}"#);
    assert_eq!(r.status, 200, "{}", r.text());
    let after = a.run(r#"{"command":"echo $CLAIMED $BOOT; id -u"}"#);
    assert_eq!(texts(&after, "stdout"), ["yes 2", "65534"]);
    // A request's own uid still wins over the bound default.
    let own = a.run(r#"{"command":"id -u","uid":0}"#);
    assert_eq!(texts(&own, "stdout"), ["0"]);
    a.post_json("/ember/v1/claim", r#"{"env":{}}"#).assert_error(409, "CONFLICT");
}

#[test]
fn bad_claims_are_refused_without_binding_anything() {
    let a = Agent::start();
    a.post_json("/ember/v1/claim", r#"{"gid":5}"#).assert_error(400, "INVALID_REQUEST_BODY");
    a.post_json("/ember/v1/claim", r#"{"env":{"A=B":"x"}}"#).assert_error(400, "INVALID_REQUEST_BODY");
    a.post_json("/ember/v1/claim", r#"{"bogus":1}"#).assert_error(400, "INVALID_REQUEST_BODY");
    // None of those counted: a good claim still works.
    assert_eq!(a.post_json("/ember/v1/claim", r#"{"env":{"X":"1"}}"#).status, 200);
}

#[test]
fn a_claimed_entrypoint_is_supervised_and_its_exit_ends_the_agent() {
    let mut a = Agent::start();
    let r = a.post_json("/ember/v1/claim", r#"{"entrypoint":["sh","-c","sleep 0.2; exit 4"]}"#);
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(a.wait_exit(Duration::from_secs(10)), Some(4));
}
