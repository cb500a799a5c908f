//! Lab 1's baseline: one worker process running three agent tasks as
//! threads, the way an agent server without isolation runs them.
//!
//! 1. print `waiting`, read one line from stdin (the lab moves the process
//!    into its memory-limited cgroup first, then writes `go`);
//! 2. `research` and `coder` each run `steps` steps of 100 ms, printing
//!    `step <task> <i>`, then `done <task>`; `coder` first runs model-written
//!    code (the payload, `sh -c`) with the worker's environment and files, as
//!    a code tool does, its output into `--payload-out`;
//! 3. once the payload ran, `hog` allocates (and touches) 4 MiB at a time,
//!    printing `hog <MiB>`; the kernel's OOM killer ends the whole process,
//!    the other two tasks with it. At `--hog-cap-mib` it stops and prints
//!    `hog-capped`, so a cgroup that failed to cap it cannot take the host.
use anyhow::Context;
use std::io::BufRead;
use std::path::PathBuf;
use std::sync::mpsc;
use std::time::Duration;

pub const STEP: Duration = Duration::from_millis(100);
const CHUNK: usize = 4 << 20;

#[derive(clap::Args)]
pub struct WorkerArgs {
    #[arg(long)]
    pub steps: u32,
    #[arg(long)]
    pub hog_cap_mib: u64,
    #[arg(long)]
    pub payload: String,
    #[arg(long)]
    pub payload_out: PathBuf,
}

pub fn main(a: WorkerArgs) -> anyhow::Result<i32> {
    println!("waiting");
    let mut go = String::new();
    std::io::stdin().lock().read_line(&mut go).context("reading the go line")?;
    anyhow::ensure!(go.trim() == "go", "expected `go`, got {go:?}");
    let (ran, payload_ran) = mpsc::channel::<()>();
    let steps = a.steps;
    let research = std::thread::spawn(move || steady("research", steps));
    let out = std::fs::File::create(&a.payload_out).with_context(|| format!("creating {}", a.payload_out.display()))?;
    let coder = std::thread::spawn(move || {
        let status = std::process::Command::new("sh").arg("-c").arg(&a.payload).stdout(out).status();
        println!("payload-done {}", status.map_or_else(|e| e.to_string(), |s| s.to_string()));
        let _ = ran.send(());
        steady("coder", steps);
    });
    let cap = a.hog_cap_mib;
    let hog = std::thread::spawn(move || {
        let _ = payload_ran.recv();
        let mut held: Vec<Vec<u8>> = Vec::new();
        while ((held.len() * CHUNK) as u64 >> 20) < cap {
            // vec![1; n] writes every byte: the pages are really charged.
            held.push(vec![1u8; CHUNK]);
            println!("hog {}", (held.len() * CHUNK) >> 20);
        }
        println!("hog-capped");
    });
    for t in [research, coder, hog] {
        let _ = t.join();
    }
    println!("all-done");
    Ok(0)
}

fn steady(name: &str, steps: u32) {
    for i in 1..=steps {
        std::thread::sleep(STEP);
        println!("step {name} {i}");
    }
    println!("done {name}");
}
