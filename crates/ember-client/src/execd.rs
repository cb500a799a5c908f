//! execd calls through the daemon's proxy route: commands and files.
use crate::multipart::Part;
use crate::{read_body, Client, ClientError};
use bytes::Bytes;
use ember_types::execd::{FrameDecoder, RunCommandRequest, StreamEvent, EXECD_PORT};
use http_body_util::BodyExt;
use hyper::Method;

pub(crate) fn proxy(id: &str, path: &str) -> String {
    format!("/v1/sandboxes/{id}/proxy/{EXECD_PORT}{path}")
}

/// What a finished command reported.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecOutcome {
    /// Exit code: 0 on `execution_complete`, `error.evalue` otherwise; `None` if
    /// the stream ended with neither.
    pub exit_code: Option<i32>,
    /// The OS message when the command could not start.
    pub error: Option<String>,
}

impl Client {
    /// Runs a command and calls `on_event` for every streamed event.
    pub async fn exec(
        &self,
        id: &str,
        req: &RunCommandRequest,
        mut on_event: impl FnMut(&StreamEvent),
    ) -> Result<ExecOutcome, ClientError> {
        let path = proxy(id, "/command");
        let body = serde_json::to_vec(req)
            .map_err(|e| ClientError::Protocol { path: path.clone(), message: e.to_string() })?;
        let resp = self.send(Method::POST, &path, body.into(), Some("application/json")).await?;
        let mut body = Self::check(&path, resp).await?.into_body();
        let mut dec = FrameDecoder::default();
        let mut out = ExecOutcome { exit_code: None, error: None };
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|e| ClientError::Cut { path: path.clone(), message: e.to_string() })?;
            let Ok(data) = frame.into_data() else { continue };
            dec.push(&data);
            while let Some(ev) = dec.next_event() {
                let ev = ev.map_err(|e| ClientError::Protocol { path: path.clone(), message: e.to_string() })?;
                match ev.kind.as_str() {
                    "execution_complete" => out.exit_code = Some(0),
                    "error" => {
                        out.exit_code = ev.exit_code();
                        if out.exit_code.is_none() {
                            out.error = ev.error.as_ref().map(|e| e.evalue.clone());
                        }
                    }
                    _ => {}
                }
                on_event(&ev);
            }
        }
        Ok(out)
    }

    /// Writes `data` to `remote` inside the sandbox (multipart upload, as execd takes it).
    pub async fn upload(&self, id: &str, remote: &str, data: Bytes, mode: u32) -> Result<(), ClientError> {
        let path = proxy(id, "/files/upload");
        let meta = serde_json::json!({ "path": remote, "mode": ember_types::execd::mode_to_wire(mode) }).to_string();
        let name = remote.rsplit('/').next().unwrap_or("file");
        let (body, ct) = crate::multipart::encode(&[
            Part { name: "metadata", filename: "metadata", content_type: "application/json", data: meta.as_bytes() },
            Part { name: "file", filename: name, content_type: "application/octet-stream", data: &data },
        ]);
        let resp = self.send(Method::POST, &path, body.into(), Some(&ct)).await?;
        Self::check(&path, resp).await.map(|_| ())
    }

    /// Reads the file at `remote` inside the sandbox.
    pub async fn download(&self, id: &str, remote: &str) -> Result<Bytes, ClientError> {
        let q = percent_encoding::utf8_percent_encode(remote, crate::QUERY_PATH);
        let path = proxy(id, &format!("/files/download?path={q}"));
        let resp = self.send(Method::GET, &path, Bytes::new(), None).await?;
        let resp = Self::check(&path, resp).await?;
        read_body(&path, resp).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A server that starts a command's stream and closes the connection
    /// before its end, as a node does when it is killed mid-call.
    #[tokio::test]
    async fn an_exec_whose_stream_breaks_off_is_cut_not_a_protocol_error() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.expect("accept");
            let mut buf = vec![0u8; 4096];
            let _ = s.read(&mut buf).await;
            let head = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n";
            let event = "{\"type\":\"stdout\",\"text\":\"hi\",\"timestamp\":1}\n\n";
            let chunk = format!("{:x}\r\n{event}\r\n", event.len());
            s.write_all(format!("{head}{chunk}").as_bytes()).await.expect("write");
            // Dropped here: the chunked body never gets its last chunk.
        });
        let client = Client::new(&format!("http://{addr}"), None).expect("client");
        let mut seen = 0;
        let res = client.exec("s1", &RunCommandRequest::default(), |_| seen += 1).await;
        assert!(matches!(res, Err(ClientError::Cut { .. })), "{res:?}");
        assert_eq!(seen, 1, "the event before the cut was delivered");
    }
}
