//! `ember image` and `ember template`.
use clap::Subcommand;
use std::path::PathBuf;

#[derive(Subcommand)]
pub enum ImageCmd {
    /// Pull an image from its registry (shows progress; `--json` for scripts).
    Pull {
        /// Image reference: busybox, host:5000/repo:tag, repo@sha256:...
        reference: String,
        /// Registry user (basic auth); the password comes from EMBER_REGISTRY_PASSWORD.
        #[arg(long)]
        username: Option<String>,
        /// Registry password (basic auth; prefer the environment variable).
        #[arg(long, env = "EMBER_REGISTRY_PASSWORD", hide_env_values = true)]
        password: Option<String>,
        /// Bearer token instead of a user and password.
        #[arg(long, env = "EMBER_REGISTRY_TOKEN", hide_env_values = true)]
        token: Option<String>,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Import a root filesystem dir, a tar, or an OCI image layout (dir or tar).
    Import {
        /// A rootfs directory, a rootfs tar, or an OCI layout.
        path: PathBuf,
        /// Name to give the image.
        #[arg(long)]
        name: String,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// List images and the layers on this node.
    Ls {
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Forget images (their layers go with the next prune).
    Rm {
        /// Images to remove (at least one).
        #[arg(required = true)]
        names: Vec<String>,
    },
    /// Remove layers that no image and no running sandbox uses.
    Prune {
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Subcommand)]
#[allow(clippy::large_enum_variant, reason = "parsed once per process")]
pub enum TemplateCmd {
    /// Create a template (pulls its image first).
    Create {
        /// The template's name.
        name: String,
        /// Image of the template (default: the host's /usr).
        #[arg(long)]
        image: Option<String>,
        /// Memory limit, e.g. 512Mi (default: the template's).
        #[arg(long)]
        memory: Option<String>,
        /// CPU limit in cores, e.g. 1 or 0.5 (default: the template's).
        #[arg(long)]
        cpus: Option<String>,
        /// Process limit (default: the template's).
        #[arg(long)]
        pids: Option<u64>,
        /// Writable layer size, e.g. 1Gi (default: the template's).
        #[arg(long)]
        disk: Option<String>,
        /// Runtime class (only "native" is installed).
        #[arg(long)]
        runtime: Option<String>,
        /// Network mode: only none (loopback only) is accepted for a template;
        /// egress is asked for per sandbox or pool.
        #[arg(long, value_name = "none|egress")]
        network: Option<String>,
        /// user, uid, user:group or uid:gid, looked up in the image.
        #[arg(long)]
        user: Option<String>,
        /// Working directory of commands (default: the image's).
        #[arg(long)]
        workdir: Option<String>,
        /// Environment variable, K=V (repeatable).
        #[arg(long = "env", value_name = "K=V")]
        env: Vec<String>,
        /// Entrypoint argv as JSON, e.g. '["sleep","inf"]'; '[]' runs none.
        #[arg(long)]
        entrypoint: Option<String>,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// List the templates.
    Ls {
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Show one template.
    Inspect {
        /// The template's name.
        name: String,
    },
    /// Delete templates.
    Rm {
        /// Templates to delete (at least one).
        #[arg(required = true)]
        names: Vec<String>,
    },
}
