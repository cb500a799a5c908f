//! `ember bench` (filled in below).
use crate::cli::BenchCmd;
use ember_client::Client;

pub async fn run(_client: &Client, _cmd: BenchCmd) -> anyhow::Result<i32> {
    anyhow::bail!("bench is not built yet")
}
