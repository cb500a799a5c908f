//! `ember`: the daemon (`ember serve`) and the CLI. Every verb but `serve` is a
//! client of the HTTP API (through ember-client), so the CLI and any other client
//! take the same code path for each operation.
#![forbid(unsafe_code)]

mod bench;
mod chaos;
mod cli;
mod cluster;
mod commands;
mod datadir;
mod lab;
mod logging;
mod netsetup;
mod serve;
mod term;

fn main() {
    let cli = cli::parse();
    let rt = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("ember: cannot start the async runtime: {e}");
            std::process::exit(1);
        }
    };
    let code = rt.block_on(async {
        match commands::dispatch(cli).await {
            Ok(code) => code,
            Err(e) => {
                // The whole chain, once, at the top.
                eprintln!("ember: {e:#}");
                1
            }
        }
    });
    std::process::exit(code);
}
