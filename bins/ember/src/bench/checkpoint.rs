//! The checkpoint row of `ember bench classes`: gVisor (runsc) checkpoint to
//! disk and restore (`resume` of a checkpointed sandbox, until its agent
//! answers), wall time through the API, one cycle on each of `runs` sandboxes. Printed
//! beside runsc's cold create, so "resume from disk vs cold start" reads in
//! one run.
use super::stats::{Progress, Series, Summary};
use ember_client::Client;
use ember_types::api::CreateSandboxRequest;
use std::time::Instant;

#[derive(Clone, Debug, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CheckpointFigures {
    pub checkpoint: Summary,
    pub restore: Summary,
}

/// `runs` cycles, each on a fresh runsc sandbox (create, checkpoint, resume,
/// remove): on this gVisor a sandbox's second restore is unreliable
/// (docs/gvisor-checkpoint.md), so one cycle per sandbox is what is measured.
pub async fn measure(client: &Client, runs: usize) -> Result<CheckpointFigures, String> {
    let req = CreateSandboxRequest {
        template: Some("host".into()),
        runtime_class: Some("runsc".into()),
        ..Default::default()
    };
    let (mut ck, mut rs) = (Series::default(), Series::default());
    let p = Progress::new("runsc checkpoint+restore", runs);
    for i in 0..runs {
        if ck.gave_up() || rs.gave_up() {
            break;
        }
        let (info, _) = client.create_sandbox(&req).await.map_err(|e| format!("create: {e}"))?;
        let t = Instant::now();
        match client.checkpoint_sandbox(&info.id).await {
            Ok(()) => {
                ck.push(t.elapsed());
                let t = Instant::now();
                match client.resume_sandbox(&info.id).await {
                    Ok(()) => rs.push(t.elapsed()),
                    Err(e) => rs.fail(e),
                }
            }
            Err(e) => ck.fail(e),
        }
        let _ = client.delete_sandbox(&info.id).await;
        p.tick(i + 1);
    }
    p.finish(&rs);
    Ok(CheckpointFigures { checkpoint: ck.summary(), restore: rs.summary() })
}

/// One line: checkpoint and restore p50/p99 against runsc's cold create p50.
pub fn print(f: &Result<CheckpointFigures, String>, cold_p50: Option<f64>) {
    let ms = |v: Option<f64>| v.map_or_else(|| "-".into(), |v| format!("{v:.1}"));
    match f {
        Ok(f) => {
            println!(
                "gVisor checkpoint p50 {} ms p99 {} ms; restore from disk p50 {} ms p99 {} ms \
                 (vs cold create p50 {} ms; {} cycles)",
                ms(f.checkpoint.p50_ms),
                ms(f.checkpoint.p99_ms),
                ms(f.restore.p50_ms),
                ms(f.restore.p99_ms),
                ms(cold_p50),
                f.restore.samples
            );
            if let Some(e) = f.checkpoint.first_error.as_ref().or(f.restore.first_error.as_ref()) {
                println!("runsc checkpoint: first error: {e}");
            }
        }
        Err(e) => println!("runsc checkpoint: not measured: {e}"),
    }
}
