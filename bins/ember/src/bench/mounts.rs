//! `ember bench mounts`: a workspace's mount round trip made with syscalls
//! as ember makes it, beside mount(8)/umount(8) in the same run, and its
//! `mkfs.ext4` in the store's small namespace beside one in the host's, at
//! growing sizes of the host's mount table (`ember_workspace::bench`). Local, in this
//! process: no daemon needed. Root only.
use super::stats::{Series, Summary};
use std::path::PathBuf;

pub struct Args {
    pub runs: usize,
    pub tables: Vec<usize>,
    pub work_dir: PathBuf,
}

pub fn run(a: &Args) -> anyhow::Result<i32> {
    let mut tables = a.tables.clone();
    tables.sort_unstable();
    println!("mount round trip (loop mount + bind + 2 unmounts), {} runs each way, alternated;", a.runs);
    println!("mkfs.ext4 of a 1 GiB image in the store's namespace (journal not zeroed) and in the host's (zeroed)");
    println!(
        "{:>11} {:>6} {:>24} {:>24} {:>24} {:>24}",
        "host mounts",
        "load",
        "ember p50/p90/p99 ms",
        "mount(8) p50/p90/p99 ms",
        "mkfs ember p50/p90/p99",
        "mkfs host p50/p90/p99"
    );
    let mut failed = false;
    ember_workspace::bench::mounts(&a.work_dir, a.runs, &tables, |row| {
        let mut cells = Vec::new();
        let sides =
            [("ember", row.ours), ("mount(8)", row.mount8), ("mkfs ember", row.mkfs), ("mkfs host", row.mkfs_host)];
        for (name, side) in sides {
            match side {
                Ok(ms) => {
                    let mut s = Series::default();
                    ms.into_iter().for_each(|m| s.push_ms(m));
                    cells.push(figures(&s.summary()));
                }
                Err(e) => {
                    failed = true;
                    cells.push("failed".into());
                    eprintln!("{name}: {e}");
                }
            }
        }
        let load = super::procfs::loadavg();
        let load = load.split(' ').next().unwrap_or("");
        println!("{:>11} {load:>6} {:>24} {:>24} {:>24} {:>24}", row.table, cells[0], cells[1], cells[2], cells[3]);
    })?;
    Ok(i32::from(failed))
}

fn figures(s: &Summary) -> String {
    let v = |x: Option<f64>| x.map_or("-".into(), |x| format!("{x:.2}"));
    format!("{}/{}/{}", v(s.p50_ms), v(s.p90_ms), v(s.p99_ms))
}
