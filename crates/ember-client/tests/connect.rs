//! A daemon that takes no connection (a host cut off drops the SYN) is an
//! error within the client's connect bound, not a call that hangs.
use ember_client::{Client, ClientError};
use std::time::Duration;

#[tokio::test]
async fn a_connection_that_is_never_made_is_a_connect_error() {
    // A listener with a backlog of 1 that never accepts: once its queue is
    // full the kernel drops further SYNs, as a cut link does.
    let sock = tokio::net::TcpSocket::new_v4().expect("socket");
    sock.bind("127.0.0.1:0".parse().expect("addr")).expect("bind");
    let addr = sock.local_addr().expect("addr");
    let _listener = sock.listen(1).expect("listen");
    let mut fill = Vec::new();
    for _ in 0..4 {
        if let Ok(Ok(s)) = tokio::time::timeout(Duration::from_millis(300), tokio::net::TcpStream::connect(addr)).await
        {
            fill.push(s);
        }
    }
    let client =
        Client::new(&format!("http://{addr}"), None).expect("client").with_connect_timeout(Duration::from_millis(500));
    // The bound only stops a hang (without the connect timeout, the SYN
    // retries run for minutes); it asserts no timing.
    let res = tokio::time::timeout(Duration::from_secs(60), client.get_raw("/health"))
        .await
        .expect("the call ended on its own connect timeout");
    match res {
        Err(ClientError::Connect { message, .. }) => assert!(message.contains("deadline has elapsed"), "{message}"),
        other => panic!("expected a connect error, got {other:?}"),
    }
}
