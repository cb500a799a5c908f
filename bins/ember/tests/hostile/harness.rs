//! The per-class harness of the hostile-workload suite: one daemon, one quiet
//! neighbour sandbox whose exec latency is measured before the attack, and the
//! checks every case ends with (neighbour and daemon unaffected, the attacker
//! gone without leftovers).
use crate::common::Daemon;
use ember_types::api::{CreateSandboxRequest, ResourcesSpec, SandboxInfo};
use std::time::{Duration, Instant};

pub struct Arena {
    pub d: Daemon,
    pub class: &'static str,
    pub neighbour: SandboxInfo,
    /// Median `echo` round trip of the neighbour before any attack.
    pub baseline: Duration,
}

/// What an attacker sandbox gets.
#[derive(Clone, Copy)]
pub struct Limits {
    pub memory: &'static str,
    pub pids: u64,
    pub disk: Option<&'static str>,
    pub cpu: Option<&'static str>,
    pub ttl_secs: Option<u64>,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits { memory: "256Mi", pids: 128, disk: None, cpu: None, ttl_secs: None }
    }
}

impl Arena {
    pub async fn new(class: &'static str) -> Arena {
        let d = Daemon::start();
        let neighbour = match d.client.create_sandbox(&request(class, Limits::default())).await {
            Ok((info, _)) => info,
            Err(e) => panic!("creating a {class} sandbox: {e} (is {class} installed? .ci/run installs it)"),
        };
        let mut a = Arena { d, class, neighbour, baseline: Duration::ZERO };
        let (code, out, _) = a.d.sh(&a.neighbour.id, "echo warm", None).await;
        assert_eq!((code, out.as_str()), (Some(0), "warm\n"), "{class}: the neighbour does not answer");
        a.baseline = a.neighbour_latency().await;
        a
    }

    pub fn request(&self, l: Limits) -> CreateSandboxRequest {
        request(self.class, l)
    }

    pub async fn attacker(&self, l: Limits) -> SandboxInfo {
        match self.d.client.create_sandbox(&self.request(l)).await {
            Ok((info, _)) => info,
            Err(e) => panic!("creating a {} sandbox: {e}", self.class),
        }
    }

    /// Median of seven `echo` round trips through the API into the neighbour.
    pub async fn neighbour_latency(&self) -> Duration {
        let mut times = Vec::new();
        for _ in 0..7 {
            let t = Instant::now();
            let (code, out, _) = self.d.sh(&self.neighbour.id, "echo alive", None).await;
            times.push(t.elapsed());
            assert_eq!((code, out.as_str()), (Some(0), "alive\n"), "{}: the neighbour was hurt", self.class);
        }
        times.sort();
        times[times.len() / 2]
    }

    /// The neighbour still runs and answers, and the daemon still serves.
    pub async fn assert_unaffected(&self) {
        let s = self.d.client.get_sandbox(&self.neighbour.id).await.expect("the neighbour is known");
        assert_eq!(s.status.state, "Running", "{}: neighbour {:?}", self.class, s.status);
        let (code, out, _) = self.d.sh(&self.neighbour.id, "echo alive", None).await;
        assert_eq!((code, out.as_str()), (Some(0), "alive\n"), "{}: the neighbour was hurt", self.class);
        let (status, _) = self.d.client.get_raw("/health").await.expect("the daemon answers");
        assert!(status.is_success(), "{}: /health {status}", self.class);
        self.d.client.list_sandboxes("").await.expect("the daemon lists sandboxes");
    }

    /// Waits for the sandbox to end and checks its state and reason.
    pub async fn assert_ended(&self, id: &str, state: &str, reason: &str, within: Duration) {
        let s = self.d.wait_state(id, state, within).await;
        assert_eq!(
            (s.status.state.as_str(), s.status.reason.as_deref()),
            (state, Some(reason)),
            "{}: attacker ended as {:?}",
            self.class,
            s.status
        );
        self.assert_no_leftovers(id).await;
    }

    /// Waits for the sandbox to end in one of `ends` (state, reason) and
    /// checks nothing of it is left on the host.
    pub async fn assert_ended_as_one_of(&self, id: &str, ends: &[(&str, &str)], within: Duration) {
        let deadline = Instant::now() + within;
        let s = loop {
            let s = self.d.client.get_sandbox(id).await.expect("get the attacker");
            if ["Terminated", "Failed"].contains(&s.status.state.as_str()) || Instant::now() > deadline {
                break s;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        let end = (s.status.state.as_str(), s.status.reason.as_deref().unwrap_or(""));
        assert!(ends.contains(&end), "{}: attacker ended as {:?}, not one of {ends:?}", self.class, s.status);
        self.assert_no_leftovers(id).await;
    }

    /// Removes the attacker and checks nothing of it is left on the host.
    pub async fn remove(&self, id: &str) {
        self.d.client.delete_sandbox(id).await.expect("delete the attacker");
        self.assert_no_leftovers(id).await;
    }

    async fn assert_no_leftovers(&self, id: &str) {
        let deadline = Instant::now() + Duration::from_secs(15);
        let mut left = self.d.leftovers(self.class, id);
        while !left.is_empty() && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(100)).await;
            left = self.d.leftovers(self.class, id);
        }
        assert!(left.is_empty(), "{} sandbox {id} left: {left:?}", self.class);
    }
}

pub fn request(class: &str, l: Limits) -> CreateSandboxRequest {
    CreateSandboxRequest {
        template: Some("host".into()),
        runtime_class: Some(class.into()),
        timeout: l.ttl_secs,
        resources: Some(ResourcesSpec {
            memory: Some(l.memory.into()),
            pids: Some(l.pids),
            disk: l.disk.map(Into::into),
            cpu: l.cpu.map(Into::into),
        }),
        ..Default::default()
    }
}

/// One `#[tokio::test]` per installed class for a case `async fn case(class)`.
#[macro_export]
macro_rules! per_class {
    ($case:ident) => {
        mod $case {
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn native() {
                super::$case("native").await;
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn crun() {
                super::$case("crun").await;
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn runc() {
                super::$case("runc").await;
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn runsc() {
                super::$case("runsc").await;
            }
        }
    };
}
