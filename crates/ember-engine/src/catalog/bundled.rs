//! The built-in `browser` and `desktop` templates: the `host` template (the
//! host's `/usr`, read-only) with an entrypoint that starts a headless
//! Chromium, or a virtual X display with a window manager, a VNC server and
//! noVNC. Nothing is downloaded when a sandbox starts: the programs are
//! Debian's packages installed on the host (`apt-get install chromium`, or
//! `xvfb openbox x11vnc novnc python3-websockify`), which the sandbox sees
//! through the `/usr` bind. Borrowing the host's `/usr` is the cheapest way to
//! ship them: no image to build, pull or keep in step with the host's
//! libraries, and every sandbox shares the host's page cache for them. Both
//! are reached from outside through the port proxy
//! (`/v1/sandboxes/{id}/proxy/{port}`), docs/templates.md.
use super::templates::Template;
use crate::EngineError;
use ember_types::{NetworkMode, Resources};
use std::path::Path;

/// Chromium's DevTools port (CDP over HTTP and WebSocket) in a `browser` sandbox.
pub const CDP_PORT: u16 = 9222;
/// noVNC and its WebSocket-to-VNC bridge (`/websockify`) in a `desktop` sandbox.
pub const NOVNC_PORT: u16 = 6080;

/// The names of the bundled templates, as listed after `host`.
pub const NAMES: [&str; 2] = ["browser", "desktop"];

/// The desktop's session: the display, its window manager, the VNC server on
/// loopback only (`-bg` returns once it accepts connections; the proxy reaches
/// it through websockify), noVNC's bridge in front. `exec` keeps websockify as
/// the entrypoint's process: the sandbox ends when it does.
fn desktop_session() -> String {
    format!(
        "mkdir -p /tmp/desktop; cd /tmp/desktop || exit 1; \
Xvfb :1 -screen 0 1280x800x24 -nolisten tcp >xvfb.log 2>&1 & \
for i in $(seq 200); do [ -e /tmp/.X11-unix/X1 ] && break; sleep 0.05; done; \
openbox >openbox.log 2>&1 & \
x11vnc -display :1 -rfbport 5900 -localhost -forever -shared -nopw -quiet -bg -o x11vnc.log; \
exec websockify --web /usr/share/novnc {NOVNC_PORT} 127.0.0.1:5900"
    )
}

/// The template `name` if it is one of the bundled ones.
pub fn template(name: &str) -> Option<Template> {
    let (resources, env, entrypoint): (Resources, &[(&str, &str)], Vec<String>) = match name {
        "browser" => (
            // Chromium runs a few dozen threads per renderer: the pids limit counts them.
            Resources { memory_bytes: 2 << 30, pids: 1024, ..Resources::default() },
            &[("HOME", "/home/sandbox")],
            [
                "/usr/lib/chromium/chromium",
                "--headless",
                // ember's own namespaces, seccomp filter and cgroup are the
                // sandbox; Chromium's would need user namespaces inside it.
                "--no-sandbox",
                "--disable-gpu",
                "--disable-dev-shm-usage",
                "--no-first-run",
                "--user-data-dir=/tmp/chromium",
                "--remote-debugging-address=127.0.0.1",
                &format!("--remote-debugging-port={CDP_PORT}"),
                // The proxy path is the only way in, behind the API key.
                "--remote-allow-origins=*",
                "about:blank",
            ]
            .map(String::from)
            .to_vec(),
        ),
        "desktop" => (
            Resources { memory_bytes: 1 << 30, pids: 512, ..Resources::default() },
            &[("HOME", "/home/sandbox"), ("DISPLAY", ":1")],
            vec!["/bin/sh".into(), "-c".into(), desktop_session()],
        ),
        _ => return None,
    };
    Some(Template {
        name: name.into(),
        builtin: true,
        image: None,
        image_digest: None,
        runtime_class: "native".into(),
        resources,
        network: NetworkMode::None,
        user: Some("1000:1000".into()),
        workdir: Some("/home/sandbox".into()),
        env: env.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
        entrypoint: Some(entrypoint),
        created_at: None,
    })
}

/// The host programs a bundled template runs, with the Debian package of each.
fn needs(name: &str) -> &'static [(&'static str, &'static str)] {
    match name {
        "browser" => &[("/usr/lib/chromium/chromium", "chromium")],
        "desktop" => &[
            ("/usr/bin/Xvfb", "xvfb"),
            ("/usr/bin/openbox", "openbox"),
            ("/usr/bin/x11vnc", "x11vnc"),
            ("/usr/share/novnc/vnc.html", "novnc"),
            ("/usr/bin/websockify", "python3-websockify"),
        ],
        _ => &[],
    }
}

/// Refuses a bundled template whose programs the host lacks, naming the
/// packages to install: without this the sandbox would start and end at once
/// with exit 127, which says nothing about the cause.
pub fn check_host(name: &str) -> Result<(), EngineError> {
    check_paths(name, needs(name))
}

fn check_paths(name: &str, needs: &[(&str, &str)]) -> Result<(), EngineError> {
    let missing: Vec<&str> = needs.iter().filter(|(p, _)| !Path::new(p).exists()).map(|(_, pkg)| *pkg).collect();
    if missing.is_empty() {
        return Ok(());
    }
    Err(EngineError::invalid(
        "template",
        format!(
            "the {name} template runs programs of the host's /usr; install them first: apt-get install {}",
            missing.join(" ")
        ),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_program_names_its_package() {
        let needs = [("/bin/sh", "dash"), ("/nonexistent/ember-test/Xvfb", "xvfb"), ("/nonexistent/x11vnc", "x11vnc")];
        let err = check_paths("desktop", &needs).unwrap_err().to_string();
        assert!(err.contains("apt-get install xvfb x11vnc"), "{err}");
        assert!(check_paths("desktop", &needs[..1]).is_ok());
    }

    #[test]
    fn bundled_templates_keep_to_the_host_layer() {
        for name in NAMES {
            let t = template(name).expect(name);
            assert!(t.builtin && t.image.is_none() && t.entrypoint.is_some(), "{name}");
            assert_eq!(t.user.as_deref(), Some("1000:1000"));
        }
        assert!(template("host").is_none());
    }
}
