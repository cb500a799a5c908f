//! A live Kubernetes API server for tests, the way controller-runtime's
//! envtest makes one: etcd and kube-apiserver (built once per machine by
//! `scripts/kube-test-env.sh`, found through `EMBER_ETCD` and
//! `EMBER_KUBE_APISERVER`) on free loopback ports, a temp data dir, a serving
//! certificate and a service-account key generated at start, an admin token,
//! and a kubeconfig. No kubelet, no controllers: objects are stored and
//! served, nothing runs pods. Both processes are killed on drop.
//!
//! A harness: it panics with a message on every failure (the test fails), and
//! fails, never skips, when the binaries are missing.
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, SanType};
use std::net::{IpAddr, Ipv4Addr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

const TOKEN: &str = "ember-envtest-admin-token";

pub struct ApiServer {
    etcd: Child,
    apiserver: Child,
    /// Kept for the processes' lifetime; removed on drop.
    _dir: tempfile::TempDir,
    pub url: String,
    pub kubeconfig: PathBuf,
}

fn binary(var: &str) -> PathBuf {
    let p = std::env::var_os(var).map(PathBuf::from).unwrap_or_else(|| {
        panic!("{var} is not set: run `eval \"$(scripts/kube-test-env.sh)\"` first (it builds etcd and kube-apiserver once per machine)")
    });
    assert!(p.is_file(), "{var}={} does not exist: run scripts/kube-test-env.sh", p.display());
    p
}

fn free_port() -> u16 {
    // The port is free when asked; a race with another process is possible
    // and shows as a start failure (envtest accepts the same).
    TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("a free loopback port").port()
}

fn write(path: &Path, body: &str) {
    std::fs::write(path, body).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
}

/// A CA and a serving certificate for 127.0.0.1/localhost signed by it: the
/// kubeconfig trusts the CA, so TLS is verified as in a real cluster.
fn certificates(dir: &Path) -> String {
    let ca_key = KeyPair::generate().expect("CA key");
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params.distinguished_name.push(DnType::CommonName, "ember-envtest-ca");
    let ca = ca_params.self_signed(&ca_key).expect("CA certificate");
    let issuer = Issuer::new(ca_params, ca_key);
    let key = KeyPair::generate().expect("serving key");
    let mut params = CertificateParams::new(vec!["localhost".to_string()]).expect("serving params");
    params.subject_alt_names.push(SanType::IpAddress(IpAddr::V4(Ipv4Addr::LOCALHOST)));
    let cert = params.signed_by(&key, &issuer).expect("serving certificate");
    write(&dir.join("serving.crt"), &cert.pem());
    write(&dir.join("serving.key"), &key.serialize_pem());
    // The service-account token signer (kube-apiserver insists on one).
    let sa = KeyPair::generate().expect("SA key");
    write(&dir.join("sa.key"), &sa.serialize_pem());
    write(&dir.join("sa.pub"), &sa.public_key_pem());
    write(&dir.join("tokens.csv"), &format!("{TOKEN},ember-envtest-admin,1,system:masters\n"));
    ca.pem()
}

fn kubeconfig_yaml(url: &str, ca_pem: &str) -> String {
    use base64::Engine;
    let ca = base64::engine::general_purpose::STANDARD.encode(ca_pem);
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: envtest\n  cluster:\n    server: {url}\n    certificate-authority-data: {ca}\n\
         users:\n- name: admin\n  user:\n    token: {TOKEN}\ncontexts:\n- name: envtest\n  context:\n    cluster: envtest\n    user: admin\n\
         current-context: envtest\n"
    )
}

fn spawn(cmd: &mut Command, log: &Path) -> Child {
    let out = std::fs::File::create(log).expect("log file");
    let err = out.try_clone().expect("log file");
    cmd.stdin(Stdio::null()).stdout(out).stderr(err);
    cmd.spawn().unwrap_or_else(|e| panic!("start {:?}: {e}", cmd.get_program()))
}

impl ApiServer {
    pub async fn start() -> ApiServer {
        ApiServer::start_opts(false).await
    }

    /// With etcd fsyncing its WAL and backend as a real cluster's does (the
    /// default start skips it: faster, and most tests measure nothing).
    pub async fn start_fsync() -> ApiServer {
        ApiServer::start_opts(true).await
    }

    async fn start_opts(fsync: bool) -> ApiServer {
        let (etcd_bin, apiserver_bin) = (binary("EMBER_ETCD"), binary("EMBER_KUBE_APISERVER"));
        let dir = tempfile::Builder::new().prefix("ember-envtest-").tempdir().expect("temp dir");
        let d = dir.path();
        let ca_pem = certificates(d);
        let (client, peer, secure) = (free_port(), free_port(), free_port());
        let etcd_url = format!("http://127.0.0.1:{client}");
        let peer_url = format!("http://127.0.0.1:{peer}");
        let etcd = spawn(
            Command::new(etcd_bin)
                .args(["--name", "envtest", "--data-dir"])
                .arg(d.join("etcd"))
                .args(["--listen-client-urls", &etcd_url, "--advertise-client-urls", &etcd_url])
                .args(["--listen-peer-urls", &peer_url, "--initial-advertise-peer-urls", &peer_url])
                .args(["--initial-cluster", &format!("envtest={peer_url}")])
                .args(if fsync { &[][..] } else { &["--unsafe-no-fsync"][..] }),
            &d.join("etcd.log"),
        );
        let url = format!("https://127.0.0.1:{secure}");
        let apiserver = spawn(
            Command::new(apiserver_bin)
                .arg(format!("--etcd-servers={etcd_url}"))
                // No kubelet, no Service endpoints: as envtest, the loopback
                // address is refused by the endpoint reconciler otherwise.
                .args(["--bind-address=127.0.0.1", "--advertise-address=127.0.0.1", "--endpoint-reconciler-type=none"])
                .arg(format!("--secure-port={secure}"))
                .arg(format!("--cert-dir={}", d.join("certs").display()))
                .arg(format!("--tls-cert-file={}", d.join("serving.crt").display()))
                .arg(format!("--tls-private-key-file={}", d.join("serving.key").display()))
                .arg(format!("--service-account-key-file={}", d.join("sa.pub").display()))
                .arg(format!("--service-account-signing-key-file={}", d.join("sa.key").display()))
                .arg(format!("--service-account-issuer={url}"))
                .arg(format!("--token-auth-file={}", d.join("tokens.csv").display()))
                .args([
                    "--service-cluster-ip-range=10.0.0.0/24",
                    "--authorization-mode=RBAC",
                    "--allow-privileged=true",
                ]),
            &d.join("kube-apiserver.log"),
        );
        let kubeconfig = d.join("kubeconfig");
        write(&kubeconfig, &kubeconfig_yaml(&url, &ca_pem));
        let mut s = ApiServer { etcd, apiserver, _dir: dir, url, kubeconfig };
        s.wait_ready().await;
        s
    }

    /// A client as the kubeconfig describes it (TLS verified against the CA).
    pub async fn client(&self) -> kube::Client {
        crate::tls_provider();
        let kc = kube::config::Kubeconfig::read_from(&self.kubeconfig).expect("kubeconfig");
        let cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default()).await.expect("kube config");
        kube::Client::try_from(cfg).expect("kube client")
    }

    fn logs(&self) -> String {
        let d = self._dir.path();
        // klog's errors and fatals (E..., F...) say why it stopped; its info
        // lines only crowd them out.
        let tail = |f: &str, n: usize| {
            let s = std::fs::read_to_string(d.join(f)).unwrap_or_default();
            let lines: Vec<&str> = s.lines().filter(|l| !l.starts_with(['I', 'W'])).collect();
            lines[lines.len().saturating_sub(n)..].join("\n")
        };
        format!("--- etcd.log\n{}\n--- kube-apiserver.log\n{}", tail("etcd.log", 5), tail("kube-apiserver.log", 20))
    }

    /// Until `/readyz` answers 200 (etcd reached, the built-in resources and
    /// the CRD machinery up); a process that exits fails the test at once.
    async fn wait_ready(&mut self) {
        let client = self.client().await;
        for _ in 0..240 {
            let exited = [("etcd", &mut self.etcd), ("kube-apiserver", &mut self.apiserver)]
                .into_iter()
                .find_map(|(name, child)| Some((name, child.try_wait().ok()??)));
            if let Some((name, st)) = exited {
                panic!("{name} exited ({st}) while starting:\n{}", self.logs());
            }
            let req = http::Request::get("/readyz").body(Vec::new()).expect("request");
            if client.request_text(req).await.is_ok() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        panic!("kube-apiserver not ready after 60 s:\n{}", self.logs());
    }
}

impl Drop for ApiServer {
    fn drop(&mut self) {
        for child in [&mut self.apiserver, &mut self.etcd] {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}
