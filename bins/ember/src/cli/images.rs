//! `ember image` and `ember template`.
use clap::Subcommand;
use std::path::PathBuf;

#[derive(Subcommand)]
pub enum ImageCmd {
    /// Pull an image from its registry (shows progress; `--json` for scripts).
    Pull {
        reference: String,
        /// Registry user (basic auth); the password comes from EMBER_REGISTRY_PASSWORD.
        #[arg(long)]
        username: Option<String>,
        #[arg(long, env = "EMBER_REGISTRY_PASSWORD", hide_env_values = true)]
        password: Option<String>,
        /// Bearer token instead of a user and password.
        #[arg(long, env = "EMBER_REGISTRY_TOKEN", hide_env_values = true)]
        token: Option<String>,
        #[arg(long)]
        json: bool,
    },
    /// Import a root filesystem dir, a tar, or an OCI image layout (dir or tar).
    Import {
        path: PathBuf,
        #[arg(long)]
        name: String,
        #[arg(long)]
        json: bool,
    },
    /// List images and the layers on this node.
    Ls {
        #[arg(long)]
        json: bool,
    },
    /// Forget images (their layers go with the next prune).
    Rm { names: Vec<String> },
    /// Remove layers that no image and no running sandbox uses.
    Prune {
        #[arg(long)]
        json: bool,
    },
}

#[derive(Subcommand)]
#[allow(clippy::large_enum_variant, reason = "parsed once per process")]
pub enum TemplateCmd {
    /// Create a template (pulls its image first).
    Create {
        name: String,
        #[arg(long)]
        image: Option<String>,
        #[arg(long)]
        memory: Option<String>,
        #[arg(long)]
        cpus: Option<String>,
        #[arg(long)]
        pids: Option<u64>,
        #[arg(long)]
        disk: Option<String>,
        /// Runtime class (only "native" is installed).
        #[arg(long)]
        runtime: Option<String>,
        /// Network mode (only "none": loopback only).
        #[arg(long)]
        network: Option<String>,
        /// user, uid, user:group or uid:gid, looked up in the image.
        #[arg(long)]
        user: Option<String>,
        #[arg(long)]
        workdir: Option<String>,
        #[arg(long = "env", value_name = "K=V")]
        env: Vec<String>,
        /// Entrypoint argv as JSON, e.g. '["sleep","inf"]'; '[]' runs none.
        #[arg(long)]
        entrypoint: Option<String>,
        #[arg(long)]
        json: bool,
    },
    Ls {
        #[arg(long)]
        json: bool,
    },
    Inspect {
        name: String,
    },
    Rm {
        names: Vec<String>,
    },
}
