//! `cargo run --release -p ember-snapshot --example snapbench -- <size_mb> <work_dir> [forks]`:
//! the same benchmark as `ember bench snapshot`, without building the daemon.
fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let size: u64 = args.next().as_deref().unwrap_or("500").parse()?;
    let work_dir = args.next().unwrap_or_else(|| "/var/tmp/ember-snapbench".into()).into();
    let forks: usize = args.next().as_deref().unwrap_or("10").parse()?;
    let cfg = ember_snapshot::bench::BenchConfig { dir_size_mb: size, work_dir, forks, keep: false };
    print!("{}", ember_snapshot::bench::bench(&cfg)?);
    Ok(())
}
