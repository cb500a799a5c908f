//! Pools and templates as the cluster's desired state, and warm claims
//! asked of the nodes with a member over NATS: a pool created through one node is kept
//! across the nodes that run sandboxes, a claim through any node (an
//! API-only one included) is warm from whichever node has an idle member,
//! concurrent claims never get one sandbox twice, and a killed node's share
//! moves to the survivors; a rebind session claimed warm comes back on
//! another node under its id when its node is killed.
use super::common::Daemon;
use super::{eventually, nats, node, runtime};
use ember_types::api::{CreatePoolRequest, CreateSandboxRequest, PoolInfo, ResizePoolRequest, SandboxInfo};
use ember_types::image::TemplateRequest;
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

const FILL: Duration = Duration::from_secs(60);

/// Waits until pool `name`, seen through `d`, has exactly these idle
/// members per node and none starting.
async fn wait_spread(d: &Daemon, name: &str, want: &[(&str, u32)]) -> PoolInfo {
    let want: BTreeMap<String, u32> = want.iter().map(|(n, i)| (n.to_string(), *i)).collect();
    eventually(FILL, &format!("pool {name} spread as {want:?}"), || async {
        let p = match d.client.get_pool(name).await {
            Ok(p) => p,
            Err(e) => {
                eprintln!("{name} through {}: {e}", d.url);
                return None;
            }
        };
        let got: BTreeMap<String, u32> = p.nodes.iter().map(|n| (n.node.clone(), n.idle)).collect();
        let settled = p.starting == 0 && got == want && p.idle == want.values().sum::<u32>();
        settled.then_some(p)
    })
    .await
}

async fn claim(d: &Daemon, pool: &str) -> SandboxInfo {
    let req = CreateSandboxRequest {
        template: Some("host".into()),
        extensions: Some([("poolRef".to_string(), pool.to_string())].into()),
        ..Default::default()
    };
    d.client.create_sandbox(&req).await.unwrap_or_else(|e| panic!("claim from {pool} through {}: {e}", d.url)).0
}

fn kind(s: &SandboxInfo) -> &str {
    s.launch.as_ref().map_or("", |l| l.kind.as_str())
}

/// Whether node `d` holds sandbox `id` (its directory on that node's disk).
fn holds(d: &Daemon, id: &str) -> bool {
    d.data_dir.join("sandboxes").join(id).exists()
}

#[test]
fn pools_are_cluster_state_and_claims_are_pulled_by_idle_nodes() {
    let nats = nats::NatsCluster::start("pools", 3);
    let a = node(&nats, "a", &[]);
    let mut b = node(&nats, "b", &[]);
    let front = node(&nats, "f", &["--api-only"]);
    runtime().block_on(async {
        // Every node knows the others before the pool is planned.
        for d in [&a, &b, &front] {
            eventually(Duration::from_secs(20), "three nodes", || async {
                (d.client.list_sandboxes("").await.is_ok()).then_some(())
            })
            .await;
        }
        // A template created through one node is registered on every node.
        let t = TemplateRequest { name: "shared".into(), ..Default::default() };
        a.client.create_template(&t).await.expect("template through a");
        eventually(Duration::from_secs(20), "the template on b", || async {
            b.client.get_template("shared").await.ok()
        })
        .await;
        let dup = b.client.create_template(&t).await.expect_err("the name is taken in the cluster");
        assert!(dup.to_string().contains("exists"), "{dup}");

        // A pool of 4 through node A: 2 on each node that runs sandboxes,
        // the same totals through every node.
        let req = CreatePoolRequest {
            name: Some("py".into()),
            template: "host".into(),
            min: 0,
            max: 8,
            target: Some(4.into()),
            ..Default::default()
        };
        a.client.create_pool(&req).await.expect("pool through a");
        let p = wait_spread(&b, "py", &[("a", 2), ("b", 2)]).await;
        assert_eq!((p.idle, p.target.clone()), (4, 4.into()), "{p:?}");
        wait_spread(&front, "py", &[("a", 2), ("b", 2)]).await;
        let again = front.client.create_pool(&req).await.expect_err("one pool of a name in the cluster");
        assert!(again.to_string().contains("already exists"), "{again}");

        // A claim through the API-only node is warm, on a node with a member.
        let s = claim(&front, "py").await;
        assert_eq!(kind(&s), "warm", "{s:?}");
        assert!(holds(&a, &s.id) || holds(&b, &s.id), "claimed {} on neither node", s.id);
        assert_eq!(front.client.get_sandbox(&s.id).await.expect("routed").id, s.id);
        // Refilled: each node's own part is read fresh through it (another
        // node's view is its last heartbeat, which may predate the claim).
        for d in [&a, &b, &front] {
            wait_spread(d, "py", &[("a", 2), ("b", 2)]).await;
        }

        // Concurrent claims on fewer idle members: none returned twice; the
        // claims that find no member start cold.
        let burst: Vec<SandboxInfo> =
            futures_util::future::join_all((0..10).map(|i| claim(if i % 2 == 0 { &front } else { &b }, "py"))).await;
        let ids: BTreeSet<&str> = burst.iter().map(|s| s.id.as_str()).collect();
        assert_eq!(ids.len(), burst.len(), "a sandbox returned twice: {burst:?}");
        let warm = burst.iter().filter(|s| kind(s) == "warm").count();
        let cold = burst.iter().filter(|s| kind(s) == "cold").count();
        eprintln!("10 concurrent claims on 4 idle members: {warm} warm, {cold} cold");
        assert_eq!(warm + cold, burst.len());
        // A claim asks every node its heartbeats show with a member, so
        // none starts cold while one of the 4 is left (a node emptied since
        // its heartbeat answers a miss and the next is asked).
        assert!(warm >= 4, "{warm} warm claims on 4 idle members: {burst:?}");

        // Idle members on one node only (a target of 1 lands on A, first
        // by name): a claim through B gets A's member.
        wait_spread(&b, "py", &[("a", 2), ("b", 2)]).await;
        b.client
            .resize_pool("py", &ResizePoolRequest { target: Some(1.into()), ..Default::default() })
            .await
            .expect("resize");
        wait_spread(&b, "py", &[("a", 1), ("b", 0)]).await;
        let s = claim(&b, "py").await;
        assert_eq!(kind(&s), "warm", "{s:?}");
        assert!(holds(&a, &s.id) && !holds(&b, &s.id), "claimed through b, not from a's member: {}", s.id);

        // One member on each node, two claims at once: a claim that meets a
        // node emptied by the other asks the next node, so both are warm
        // (a queue group handed both to one node half the time: one cold).
        b.client
            .resize_pool("py", &ResizePoolRequest { target: Some(2.into()), ..Default::default() })
            .await
            .expect("resize");
        for round in 0..4 {
            for d in [&a, &b, &front] {
                wait_spread(d, "py", &[("a", 1), ("b", 1)]).await;
            }
            let two = futures_util::future::join_all((0..2).map(|_| claim(&front, "py"))).await;
            assert!(two.iter().all(|s| kind(s) == "warm"), "round {round}: {two:?}");
            assert_ne!(two[0].id, two[1].id);
        }

        // A node killed: the survivor raises its share, the total comes back.
        a.client
            .resize_pool("py", &ResizePoolRequest { target: Some(4.into()), ..Default::default() })
            .await
            .expect("resize");
        wait_spread(&a, "py", &[("a", 2), ("b", 2)]).await;
        b.kill9();
        let p = wait_spread(&front, "py", &[("a", 4)]).await;
        assert_eq!(p.idle, 4, "{p:?}");

        // Removed through any node: gone everywhere, members destroyed.
        front.client.delete_pool("py").await.expect("remove through f");
        let err = a.client.get_pool("py").await.expect_err("removed");
        assert!(err.to_string().contains("not found"), "{err}");
    });
}

#[test]
fn a_warm_claimed_rebind_session_comes_back_elsewhere_under_its_id() {
    let nats = nats::NatsCluster::start("pools-rebind", 3);
    let mut a = node(&nats, "a", &[]);
    let b = node(&nats, "b", &[]);
    runtime().block_on(async {
        for d in [&a, &b] {
            eventually(Duration::from_secs(20), "two nodes", || async {
                (d.client.list_sandboxes("").await.is_ok()).then_some(())
            })
            .await;
        }
        // A target of 1 lands on A (first by name).
        let pool = CreatePoolRequest {
            name: Some("rb".into()),
            template: "host".into(),
            min: 0,
            max: 2,
            target: Some(1.into()),
            ..Default::default()
        };
        a.client.create_pool(&pool).await.expect("pool through a");
        wait_spread(&b, "rb", &[("a", 1), ("b", 0)]).await;
        let ext = [("poolRef", "rb"), ("restartPolicy", "rebind")];
        let req = CreateSandboxRequest {
            template: Some("host".into()),
            extensions: Some(ext.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()),
            ..Default::default()
        };
        let s = b.client.create_sandbox(&req).await.expect("a warm claim through b").0;
        assert_eq!(kind(&s), "warm", "{s:?}");
        assert!(holds(&a, &s.id), "claimed {} not on a", s.id);

        // A's loss: the session is re-created on B under its id.
        a.kill9();
        eventually(Duration::from_secs(90), "the session back on b", || async {
            match b.client.get_sandbox(&s.id).await {
                Ok(got) if got.status.state == "Running" && holds(&b, &s.id) => Some(()),
                Ok(got) => {
                    eprintln!("{} through b: {}", s.id, got.status.state);
                    None
                }
                Err(e) => {
                    eprintln!("{} through b: {e}", s.id);
                    None
                }
            }
        })
        .await;
        let (code, out, err) = b.sh(&s.id, "echo alive", None).await;
        assert_eq!((code, out.trim()), (Some(0), "alive"), "{err}");
    });
}
