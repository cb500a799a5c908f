//! `ember logs`: the entrypoint's output, which the sandbox's agent keeps
//! (the last 8 MiB of it), so it outlives daemon restarts as long as the
//! sandbox runs. Read through the proxy route, from a line cursor.
use anyhow::bail;
use ember_client::{Client, ClientError};
use std::io::Write;
use std::time::Duration;

/// How often `-f` asks for new lines.
const POLL: Duration = Duration::from_millis(250);

/// Prints the entrypoint's output (the last `tail` lines of it if given),
/// then with `follow` new lines as they come until the entrypoint exits.
pub async fn logs(client: &Client, id: &str, follow: bool, tail: Option<usize>) -> anyhow::Result<i32> {
    let (text, cursor) = fetch(client, id, None).await?;
    print(tail_of(&text, tail));
    if follow {
        follow_from(client, id, cursor).await?;
    }
    Ok(0)
}

/// `ember attach ID`: the entrypoint's output from now on, until it exits.
pub async fn follow_entrypoint(client: &Client, id: &str) -> anyhow::Result<i32> {
    let (_, cursor) = fetch(client, id, None).await?;
    // Once the starting point is taken: everything printed from here on is
    // new output.
    eprintln!("ember: attached to the entrypoint of {id} (its output; it has no terminal and no stdin); ctrl-c leaves");
    follow_from(client, id, cursor).await?;
    Ok(0)
}

async fn follow_from(client: &Client, id: &str, mut cursor: u64) -> anyhow::Result<()> {
    let mut unreachable = 0;
    loop {
        // Whether it still runs is asked before the read, so the lines it
        // wrote before exiting are all printed.
        let read = async {
            let running = client.entrypoint_status(id).await?.running;
            Ok::<_, anyhow::Error>((running, fetch(client, id, Some(cursor)).await?))
        };
        match read.await {
            Ok((running, (text, next))) => {
                print(&text);
                cursor = next;
                unreachable = 0;
                if !running {
                    return Ok(());
                }
                tokio::time::sleep(POLL).await;
            }
            // The entrypoint's exit ends the sandbox, and its agent with
            // the output it kept: say so rather than fail. The agent (PID 1)
            // can be gone a moment before the daemon records the end, so
            // an unreachable agent of a sandbox still listed as running is
            // asked about again, a bounded number of times.
            Err(e) => match client.get_sandbox(id).await {
                Ok(s) if !matches!(s.status.state.as_str(), "Running" | "Paused" | "Pending") => {
                    let reason = s.status.reason.unwrap_or_default();
                    eprintln!("ember: sandbox {id} ended: {} {reason}", s.status.state);
                    return Ok(());
                }
                Ok(_) if unreachable < UNREACHABLE_POLLS && agent_unreachable(&e) => {
                    unreachable += 1;
                    tokio::time::sleep(POLL).await;
                }
                _ => return Err(e),
            },
        }
    }
}

/// How many polls an unreachable agent of a running sandbox gets (~10 s).
const UNREACHABLE_POLLS: u32 = 40;

fn agent_unreachable(e: &anyhow::Error) -> bool {
    matches!(e.downcast_ref::<ClientError>(), Some(ClientError::Api { code, .. }) if code == "SANDBOX::AGENT_UNREACHABLE")
}

async fn fetch(client: &Client, id: &str, cursor: Option<u64>) -> anyhow::Result<(String, u64)> {
    match client.entrypoint_logs(id, cursor).await {
        Ok(r) => Ok(r),
        // A 404 from the agent (not the API's SANDBOX::NOT_FOUND): no command
        // of that name.
        Err(ClientError::Api { status: 404, code, .. }) if !code.starts_with("SANDBOX::") => {
            bail!("sandbox {id} has no entrypoint (it was created without one)")
        }
        Err(e) => Err(e.into()),
    }
}

/// The last `n` lines of `text` (all of it if `None`).
fn tail_of(text: &str, n: Option<usize>) -> &str {
    let Some(n) = n else { return text };
    if n == 0 {
        return "";
    }
    let body = text.strip_suffix('\n').unwrap_or(text);
    match body.rmatch_indices('\n').nth(n - 1) {
        Some((at, _)) => &text[at + 1..],
        None => text,
    }
}

fn print(s: &str) {
    let mut o = std::io::stdout().lock();
    let _ = o.write_all(s.as_bytes()).and_then(|()| o.flush());
}

#[cfg(test)]
mod tests {
    #[test]
    fn tail_keeps_the_last_lines() {
        let t = "a\nb\nc\n";
        assert_eq!(super::tail_of(t, Some(2)), "b\nc\n");
        assert_eq!(super::tail_of(t, Some(3)), t);
        assert_eq!(super::tail_of(t, Some(9)), t);
        assert_eq!(super::tail_of(t, Some(0)), "");
        assert_eq!(super::tail_of(t, None), t);
        assert_eq!(super::tail_of("", Some(1)), "");
    }
}
