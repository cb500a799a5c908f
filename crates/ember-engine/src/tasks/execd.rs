//! A streaming `POST /command` over the agent's unix socket, for task workers.
//!
//! Hand-written like the claim and ping exchanges: the engine speaks no HTTP
//! library. The reply is untrusted: the head is capped, a chunked body is
//! de-chunked with size checks, and frames are parsed by
//! [`ember_types::execd::FrameDecoder`].
use ember_types::execd::{FrameDecoder, RunCommandRequest, StreamEvent};
use std::path::Path;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// How a command ended, as the stream told it.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum ExecEnd {
    /// It ran and exited with this code.
    Exited(i32),
    /// It never started (no such file, say).
    NotStarted(String),
    /// The stream ended without a verdict: the sandbox (or its agent) died.
    Cut(String),
}

const MAX_HEAD: usize = 16 << 10;

/// Runs `req` and calls `on_event` for each streamed event, in order.
pub(crate) async fn run(socket: &Path, req: &RunCommandRequest, mut on_event: impl FnMut(&StreamEvent)) -> ExecEnd {
    let body = match serde_json::to_string(req) {
        Ok(b) => b,
        Err(e) => return ExecEnd::NotStarted(e.to_string()),
    };
    let mut s = match crate::connect_agent(socket).await {
        Ok(s) => s,
        Err(e) => return ExecEnd::Cut(format!("connect to the agent: {e}")),
    };
    let head = format!(
        "POST /command HTTP/1.1\r\nHost: agent\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    if let Err(e) = s.write_all(format!("{head}{body}").as_bytes()).await {
        return ExecEnd::Cut(format!("write to the agent: {e}"));
    }
    let mut buf = Vec::with_capacity(4096);
    let mut chunk = [0u8; 8192];
    // The head.
    let (status, chunked) = loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let text = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
            let status = text.split_whitespace().nth(1).unwrap_or("").to_string();
            let chunked = text.lines().any(|l| l.starts_with("transfer-encoding:") && l.contains("chunked"));
            buf.drain(..end + 4);
            break (status, chunked);
        }
        if buf.len() > MAX_HEAD {
            return ExecEnd::Cut("the agent's reply head is too large".into());
        }
        match s.read(&mut chunk).await {
            Ok(0) => return ExecEnd::Cut("the agent closed the connection before answering".into()),
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(e) => return ExecEnd::Cut(format!("read from the agent: {e}")),
        }
    };
    let mut dechunk = Dechunker::default();
    let mut frames = FrameDecoder::default();
    let mut raw = std::mem::take(&mut buf);
    let mut non_stream = Vec::new();
    loop {
        let data = if chunked {
            match dechunk.push(&raw) {
                Ok(d) => d,
                Err(e) => return ExecEnd::Cut(e),
            }
        } else {
            std::mem::take(&mut raw)
        };
        raw.clear();
        if status != "200" {
            non_stream.extend_from_slice(&data);
        } else {
            frames.push(&data);
            while let Some(ev) = frames.next_event() {
                let Ok(ev) = ev else { return ExecEnd::Cut("the agent sent a malformed event".into()) };
                on_event(&ev);
                match ev.kind.as_str() {
                    "execution_complete" => return ExecEnd::Exited(0),
                    "error" => {
                        return match ev.exit_code() {
                            Some(c) => ExecEnd::Exited(c),
                            None => ExecEnd::NotStarted(ev.error.map(|e| e.evalue).unwrap_or_default()),
                        }
                    }
                    _ => {}
                }
            }
        }
        if dechunk.done {
            break;
        }
        match s.read(&mut chunk).await {
            Ok(0) => break,
            Ok(n) => raw.extend_from_slice(&chunk[..n]),
            Err(e) => return ExecEnd::Cut(format!("read from the agent: {e}")),
        }
    }
    if status != "200" {
        let msg = String::from_utf8_lossy(&non_stream[..non_stream.len().min(512)]).into_owned();
        return ExecEnd::NotStarted(format!("agent answered {status}: {msg}"));
    }
    ExecEnd::Cut("the command's stream ended without an exit status".into())
}

/// Incremental `Transfer-Encoding: chunked` decoder.
#[derive(Default)]
struct Dechunker {
    pending: Vec<u8>,
    /// Bytes of the current chunk still to come (+2 for its CRLF).
    left: usize,
    done: bool,
}

impl Dechunker {
    fn push(&mut self, input: &[u8]) -> Result<Vec<u8>, String> {
        self.pending.extend_from_slice(input);
        let mut out = Vec::new();
        loop {
            if self.done {
                return Ok(out);
            }
            if self.left > 0 {
                let take = self.left.min(self.pending.len());
                let data: Vec<u8> = self.pending.drain(..take).collect();
                // The last two bytes of a chunk are its CRLF.
                let payload = self.left.saturating_sub(2).min(data.len());
                out.extend_from_slice(&data[..payload]);
                self.left -= take;
                if self.left > 0 {
                    return Ok(out);
                }
                continue;
            }
            let Some(eol) = self.pending.windows(2).position(|w| w == b"\r\n") else {
                if self.pending.len() > 64 {
                    return Err("bad chunk header from the agent".into());
                }
                return Ok(out);
            };
            let line = String::from_utf8_lossy(&self.pending[..eol]).into_owned();
            self.pending.drain(..eol + 2);
            let size = usize::from_str_radix(line.split(';').next().unwrap_or("").trim(), 16)
                .map_err(|_| format!("bad chunk size {line:?} from the agent"))?;
            if size > 64 << 20 {
                return Err("chunk too large from the agent".into());
            }
            if size == 0 {
                self.done = true;
            } else {
                self.left = size + 2;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Dechunker;

    #[test]
    fn dechunks_across_arbitrary_splits() {
        let wire = b"5\r\nhello\r\n7;x=1\r\n, world\r\n0\r\n\r\n";
        for split in 0..wire.len() {
            let mut d = Dechunker::default();
            let mut out = d.push(&wire[..split]).unwrap();
            out.extend(d.push(&wire[split..]).unwrap());
            assert_eq!(out, b"hello, world", "split at {split}");
            assert!(d.done);
        }
        assert!(Dechunker::default().push(b"zz\r\n").is_err());
    }
}
