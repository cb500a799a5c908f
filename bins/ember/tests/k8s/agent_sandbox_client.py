"""kubernetes-sigs/agent-sandbox's Python client (PyPI `k8s-agent-sandbox`),
unchanged, against ember: the Kubernetes API server of the test (KUBECONFIG)
and `ember serve` as the sandbox-router (SandboxDirectConnectionConfig, the
client's own way to name a router URL). Driven by bins/ember/tests/k8s.rs.

    python agent_sandbox_client.py claim ROUTER_URL WARMPOOL
        claim -> Ready -> run commands; prints one JSON line; leaves the claim.
    python agent_sandbox_client.py extras ROUTER_URL WARMPOOL
        claim with env and a volume claim template -> run a command that
        shows them; prints one JSON line; leaves the claim.
    python agent_sandbox_client.py delete ROUTER_URL CLAIM
        deletes the claim through the client.
"""
import json
import sys

from k8s_agent_sandbox import SandboxClient, SandboxWarmPoolNotFoundError
from k8s_agent_sandbox.models import SandboxDirectConnectionConfig


def main() -> None:
    action, router, name = sys.argv[1], sys.argv[2], sys.argv[3]
    client = SandboxClient(connection_config=SandboxDirectConnectionConfig(api_url=router))
    if action == "delete":
        client.delete_sandbox(name, namespace="default")
        return
    if action == "extras":
        scratch = {"metadata": {"name": "scratch"},
                   "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "32Mi"}}}}
        sandbox = client.create_sandbox(warmpool=name, namespace="default", sandbox_ready_timeout=120,
                                        env={"A": "from-claim", "B": "b"}, volume_claim_templates=[scratch])
        run = sandbox.commands.run(
            "echo $A $B $T; for d in /data /scratch; do mountpoint -q $d && echo $d mounted; done")
        print(json.dumps({"claim": sandbox.claim_name, "stdout": run.stdout, "stderr": run.stderr}))
        sandbox.close_connection()
        return
    sandbox = client.create_sandbox(warmpool=name, namespace="default", sandbox_ready_timeout=120)
    ok = sandbox.commands.run("echo hello from ember; echo to stderr >&2")
    failed = sandbox.commands.run("exit 3")
    # The runtime's file routes, through the client's own calls.
    sandbox.files.write("notes/hello.txt", "written by the client")
    read = sandbox.files.read("notes/hello.txt").decode()
    listed = [(e.name, e.type, e.size) for e in sandbox.files.list("notes")]
    exists = [sandbox.files.exists("notes/hello.txt"), sandbox.files.exists("notes/none.txt")]
    seen_by_command = sandbox.commands.run("cat notes/hello.txt").stdout
    status, _ = sandbox.status()
    # Re-attach by the claim's name: resolves the Sandbox resource it names.
    again = client.get_sandbox(sandbox.claim_name, namespace="default")
    again_out = again.commands.run("echo again").stdout
    try:
        client.create_sandbox(warmpool="no-such-pool", namespace="default", sandbox_ready_timeout=60)
        missing = "claimed"
    except SandboxWarmPoolNotFoundError as e:
        missing = "WarmPoolNotFound"
    print(json.dumps({
        "claim": sandbox.claim_name,
        "sandbox": sandbox.sandbox_id,
        "stdout": ok.stdout,
        "stderr": ok.stderr,
        "exit_code": ok.exit_code,
        "failed_exit_code": failed.exit_code,
        "status": status,
        "again": again_out,
        "missing_pool": missing,
        "read": read,
        "listed": listed,
        "exists": exists,
        "seen_by_command": seen_by_command,
    }))
    sandbox.close_connection()


if __name__ == "__main__":
    main()
