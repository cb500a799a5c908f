//! `ember cp SRC DST`, where one side is `ID:/path`.
use anyhow::{bail, Context};
use ember_client::Client;
use std::os::unix::fs::PermissionsExt;

/// Splits `ID:/path`; a plain local path (or `./x:y`) is not remote.
fn remote(s: &str) -> Option<(&str, &str)> {
    let (id, path) = s.split_once(':')?;
    (!id.is_empty() && !id.contains('/') && path.starts_with('/')).then_some((id, path))
}

pub async fn cp(client: &Client, src: &str, dst: &str) -> anyhow::Result<i32> {
    match (remote(src), remote(dst)) {
        (None, Some((id, path))) => {
            let data = std::fs::read(src).with_context(|| format!("reading {src}"))?;
            let mode = std::fs::metadata(src).map(|m| m.permissions().mode() & 0o7777).unwrap_or(0o644);
            client.upload(id, path, data.into(), mode).await?;
        }
        (Some((id, path)), None) => {
            let data = client.download(id, path).await?;
            if dst == "-" {
                use std::io::Write;
                std::io::stdout().write_all(&data)?;
            } else {
                std::fs::write(dst, &data).with_context(|| format!("writing {dst}"))?;
            }
        }
        (Some(_), Some(_)) => bail!("copying between two sandboxes is not supported; copy through a local file"),
        (None, None) => bail!("one side of cp must be ID:/absolute/path"),
    }
    Ok(0)
}
