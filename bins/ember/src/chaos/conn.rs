//! A session's calls under the drill's retry policy (session.rs's module
//! docs): each try through the node the session enters by, a failed one
//! tried again after a back-off, an unreachable node's moving the session
//! to another (`health.rs`).
use super::session::{Kind, SessionResult, Shared};
use ember_client::{Client, ClientError};
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

pub const BACKOFF_FIRST: Duration = Duration::from_millis(100);
pub const BACKOFF_MAX: Duration = Duration::from_secs(1);
pub const RETRY_FOR: Duration = Duration::from_secs(30);
/// How long one try of a call may wait for its answer.
pub const CALL_WAIT: Duration = Duration::from_secs(20);
/// A try that took this long is kept even if it answered at once.
pub const SLOW_TRY: Duration = Duration::from_secs(1);

/// The session's view of the cluster: a client per node, the one in use.
pub struct Conn {
    clients: Vec<Client>,
    cur: usize,
    /// Which of the nodes left this session moves to (`Health::next`).
    spread: usize,
    pub(super) shared: Arc<Shared>,
}

/// A 503, an unreachable node, or an answer that broke off mid-stream (its
/// node died during the call). The last may follow a command that ran: the
/// drill's only streamed call, the append, is idempotent (it appends its
/// line only if the file lacks it), as a client must make any call it
/// retries after a cut.
fn retryable(e: &ClientError) -> bool {
    matches!(e, ClientError::Api { status: 503, .. } | ClientError::Connect { .. } | ClientError::Cut { .. })
}

impl Conn {
    /// The node this session enters by now.
    pub(super) fn entry(&self) -> &Client {
        &self.clients[self.cur]
    }

    pub fn new(clients: Vec<Client>, first: usize, spread: usize, shared: Arc<Shared>) -> Conn {
        Conn { cur: first % clients.len().max(1), clients, spread, shared }
    }

    /// `f` under the retry policy; the time of the first failed try if any.
    pub async fn call<T, F, Fut>(
        &mut self,
        r: &mut SessionResult,
        what: &'static str,
        f: F,
    ) -> (Result<T, ClientError>, Option<Instant>)
    where
        F: Fn(Client) -> Fut,
        Fut: Future<Output = Result<T, ClientError>>,
    {
        self.call_expecting(r, what, |_| false, f).await
    }

    /// As `call`; an error `expected` accepts is handed back without being
    /// counted as a user-visible error.
    pub async fn call_expecting<T, F, Fut>(
        &mut self,
        r: &mut SessionResult,
        what: &'static str,
        expected: impl Fn(&ClientError) -> bool,
        f: F,
    ) -> (Result<T, ClientError>, Option<Instant>)
    where
        F: Fn(Client) -> Fut,
        Fut: Future<Output = Result<T, ClientError>>,
    {
        r.calls += 1;
        let (start, mut wait, mut first_fail) = (Instant::now(), BACKOFF_FIRST, None);
        loop {
            // A call that hangs is given up as a load balancer would (its
            // node failing health probes, or no answer in CALL_WAIT), and
            // tried again through the next node that has not failed lately:
            // one into a copy frozen for good had held the 300-session
            // drill's end for over 20 min.
            let client = self.clients[self.cur].clone();
            let url = client.base_url().to_string();
            let try_at = Instant::now();
            let res = super::health::watched(&url, CALL_WAIT, f(client)).await;
            r.took(what, self.shared.ms(start), start.elapsed());
            let (try_ms, try_took) = (self.shared.ms(try_at), try_at.elapsed());
            let failed =
                |r: &mut SessionResult, e: &ClientError| r.keep_try(try_ms, try_took, &url, format!("{what}: {e}"));
            match res {
                Ok(v) => {
                    self.shared.note(Kind::Ok);
                    self.shared.health.mark_up(&url);
                    if first_fail.is_some() || try_took >= SLOW_TRY {
                        r.keep_try(try_ms, try_took, &url, format!("{what}: ok"));
                    }
                    return (Ok(v), first_fail);
                }
                Err(e) if retryable(&e) && start.elapsed() + wait <= RETRY_FOR => {
                    first_fail.get_or_insert_with(Instant::now);
                    r.retries += 1;
                    failed(r, &e);
                    self.shared.note(Kind::Retry);
                    if matches!(e, ClientError::Connect { .. } | ClientError::Cut { .. }) {
                        self.shared.health.mark_down(&url);
                        let urls: Vec<&str> = self.clients.iter().map(Client::base_url).collect();
                        self.cur = self.shared.health.next(&urls, self.cur, self.spread);
                    }
                    tokio::time::sleep(wait).await;
                    wait = (wait * 2).min(BACKOFF_MAX);
                }
                Err(e) if expected(&e) => return (Err(e), first_fail),
                Err(e) => {
                    failed(r, &e);
                    self.shared.note(Kind::UserError);
                    r.user_errors += 1;
                    if r.first_errors.len() < 3 {
                        r.first_errors.push(e.to_string());
                    }
                    return (Err(e), first_fail.or(Some(Instant::now())));
                }
            }
        }
    }
}
