//! One live attempt per workspace: a task whose workspace another attempt
//! holds is not leased, so no attempt steals a live holder's workspace.
mod common;

use common::{spec, Fixture};
use ember_queue::{Outcome, QueueConfig, TaskQueue};
use ember_types::task::{TaskSpec, Tier};

fn on(ws: Option<&str>) -> TaskSpec {
    TaskSpec { workspace: ws.map(String::from), ..spec(Tier::Standard, 2) }
}

#[test]
fn a_held_workspace_is_not_leased_again_until_its_attempt_ends() {
    let f = Fixture::new("ws-held");
    let q = f.open(QueueConfig::default());
    for (id, ws) in [("w1", Some("w")), ("w2", Some("w")), ("v1", Some("v")), ("n1", None), ("w3", Some("w"))] {
        q.submit(id, on(ws)).unwrap();
        f.advance(1);
    }
    let mut got = Vec::new();
    while let Some((l, _)) = q.lease("x").unwrap() {
        got.push(l);
    }
    let ids: Vec<&str> = got.iter().map(|l| l.task.as_str()).collect();
    assert_eq!(ids, ["w1", "v1", "n1"], "w2 and w3 wait for w1's attempt");
    for l in &got[1..] {
        q.finish(l, Outcome::Succeeded).unwrap();
    }
    // A failed attempt returns w1 to the queue ahead of w2 (submission order).
    q.finish(&got[0], Outcome::Retry { reason: "exit 1".into(), exit_code: Some(1) }).unwrap();
    let (l, _) = q.lease("x").unwrap().unwrap();
    assert_eq!((l.task.as_str(), l.attempt), ("w1", 2));
    assert!(q.lease("x").unwrap().is_none(), "w is held again");
    q.finish(&l, Outcome::Succeeded).unwrap();
    let (l, _) = q.lease("x").unwrap().unwrap();
    assert_eq!(l.task, "w2");
    // An expired lease frees the workspace: its holder is presumed dead.
    f.advance(2_000);
    let expired = q.expire().unwrap();
    assert!(expired.iter().any(|x| x.task == "w2"));
    let (l, _) = q.lease("x").unwrap().unwrap();
    assert_eq!((l.task.as_str(), l.attempt), ("w2", 2));
    // A cancelled attempt frees it too.
    q.cancel("w2").unwrap();
    assert_eq!(q.lease("x").unwrap().unwrap().0.task, "w3");
}

#[test]
fn a_reopened_queue_still_holds_the_workspaces_of_live_attempts() {
    let f = Fixture::new("ws-reopen");
    {
        let q = f.open(QueueConfig::default());
        q.submit("a", on(Some("w"))).unwrap();
        f.advance(1);
        q.submit("b", on(Some("w"))).unwrap();
        assert_eq!(q.lease("x").unwrap().unwrap().0.task, "a");
    }
    let q = f.open(QueueConfig::default());
    assert!(q.lease("x").unwrap().is_none(), "a's attempt still holds w after a restart");
}
