// The TypeScript SDK @alibaba-group/opensandbox, unchanged from npm, against a
// real `ember serve`: what tests/e2e/opensandbox does with the Python SDK that
// this SDK has (create, commands with streamed output, background commands,
// sessions, files, metrics, endpoints, list, pause/resume, renew, kill).
// Run by test_typescript_sdk.py, which installs the pinned package into
// $EMBER_NODE_DIR and starts the daemon; $OPEN_SANDBOX_DOMAIN names it.
import assert from "node:assert/strict";
import { createRequire } from "node:module";
import { test } from "node:test";

const require = createRequire(`${process.env.EMBER_NODE_DIR}/`);
const { ConnectionConfig, Sandbox, SandboxManager, SandboxException } = require("@alibaba-group/opensandbox");

const config = () => new ConnectionConfig({ domain: process.env.OPEN_SANDBOX_DOMAIN, requestTimeoutSeconds: 60 });

async function withSandbox(body, opts = {}) {
  const sb = await Sandbox.create({ connectionConfig: config(), image: "host", timeoutSeconds: 600, ...opts });
  try {
    await body(sb);
  } finally {
    try {
      await sb.kill();
    } finally {
      await sb.close();
    }
  }
}

const stdout = (ex) => ex.logs.stdout.map((m) => m.text).join("\n");

test("create, info, streamed commands, failing command", async () => {
  await withSandbox(
    async (sb) => {
      const info = await sb.getInfo();
      assert.equal(info.id, sb.id);
      assert.equal(info.status.state, "Running");
      assert.equal(info.metadata.suite, "ts");
      assert.ok(await sb.isHealthy());

      // Streamed: each line reaches the handler while the command runs.
      const seen = [];
      let done = null;
      const ex = await sb.commands.run("for i in 1 2 3; do echo line$i; sleep 0.1; done; echo oops >&2", undefined, {
        onStdout: (m) => seen.push(m.text),
        onExecutionComplete: (c) => (done = c),
      });
      assert.deepEqual(seen, ["line1", "line2", "line3"]);
      assert.deepEqual(ex.logs.stderr.map((m) => m.text), ["oops"]);
      assert.equal(ex.exitCode, 0);
      assert.ok(done, "onExecutionComplete was called");

      const failed = await sb.commands.run("echo partial; exit 3");
      assert.equal(failed.exitCode, 3);
      assert.equal(stdout(failed), "partial");

      const opts = { workingDirectory: "/tmp", envs: { X: "from envs" }, timeoutSeconds: 30 };
      const env = await sb.commands.run("echo $(pwd) $X", opts);
      assert.equal(stdout(env), "/tmp from envs");
      assert.equal(stdout(await sb.commands.run("id -u", { uid: 0 })), "0");
      assert.equal(stdout(await sb.commands.run("echo $FROM_CREATE")), "create env");
    },
    { env: { FROM_CREATE: "create env" }, metadata: { suite: "ts" } },
  );
});

test("background command: status, logs, interrupt; sessions", async () => {
  await withSandbox(async (sb) => {
    const bg = await sb.commands.run("for i in 1 2 3; do echo l$i; done; sleep 0.3; exit 4", { background: true });
    let st;
    for (let i = 0; i < 200; i++) {
      st = await sb.commands.getCommandStatus(bg.id);
      if (!st.running) break;
      await new Promise((r) => setTimeout(r, 50));
    }
    assert.equal(st.running, false);
    assert.equal(st.exitCode, 4);
    const logs = await sb.commands.getBackgroundCommandLogs(bg.id);
    assert.equal(logs.content, "l1\nl2\nl3\n");

    const long = await sb.commands.run("sleep 300", { background: true });
    assert.equal((await sb.commands.getCommandStatus(long.id)).running, true);
    await sb.commands.interrupt(long.id);
    for (let i = 0; i < 200; i++) {
      st = await sb.commands.getCommandStatus(long.id);
      if (!st.running) break;
      await new Promise((r) => setTimeout(r, 50));
    }
    assert.equal(st.running, false);

    const session = await sb.commands.createSession({ workingDirectory: "/tmp" });
    await sb.commands.runInSession(session, "export KEPT=yes; mkdir -p /tmp/s && cd /tmp/s");
    const kept = await sb.commands.runInSession(session, "echo $KEPT $(pwd)");
    assert.equal(stdout(kept), "yes /tmp/s");
    await sb.commands.deleteSession(session);
  });
});

test("files: write, read (ranges, lines), info, permissions, list, search, replace, move, delete", async () => {
  await withSandbox(async (sb) => {
    const f = sb.files;
    await f.createDirectories([{ path: "/tmp/ts/dir", mode: 755 }]);
    await f.writeFiles([
      { path: "/tmp/ts/dir/a.txt", data: "alpha\nbeta\n", mode: 644 },
      { path: "/tmp/ts/dir/b.bin", data: new Uint8Array([0, 1, 2, 255]), mode: 600 },
    ]);
    assert.equal(await f.readFile("/tmp/ts/dir/a.txt"), "alpha\nbeta\n");
    assert.deepEqual([...(await f.readBytes("/tmp/ts/dir/b.bin"))], [0, 1, 2, 255]);
    const info = await f.getFileInfo(["/tmp/ts/dir/a.txt"]);
    assert.equal(info["/tmp/ts/dir/a.txt"].size, 11);
    assert.equal(info["/tmp/ts/dir/a.txt"].mode, 644);
    const found = await f.search({ path: "/tmp/ts", pattern: "*.txt" });
    assert.deepEqual(found.map((e) => e.path), ["/tmp/ts/dir/a.txt"]);
    await f.replaceContents([{ path: "/tmp/ts/dir/a.txt", oldContent: "beta", newContent: "gamma" }]);
    assert.equal(await f.readFile("/tmp/ts/dir/a.txt"), "alpha\ngamma\n");
    await f.moveFiles([{ src: "/tmp/ts/dir/a.txt", dest: "/tmp/ts/moved.txt" }]);
    assert.equal(await f.readFile("/tmp/ts/moved.txt"), "alpha\ngamma\n");
    await f.deleteFiles(["/tmp/ts/moved.txt"]);
    await assert.rejects(f.readFile("/tmp/ts/moved.txt"), SandboxException);
    // Partial reads: a byte range (the Range header), and execd's lines
    // (offset = first line, 1-based; limit = how many).
    await f.writeFiles([{ path: "/tmp/ts/dir/digits", data: "0123456789\nl2\nl3\nl4\n" }]);
    assert.equal(await f.readFile("/tmp/ts/dir/digits", { range: "bytes=2-4" }), "234");
    assert.equal(await f.readFile("/tmp/ts/dir/digits", { offset: 2, limit: 2 }), "l2\nl3\n");
    await f.setPermissions([{ path: "/tmp/ts/dir/digits", mode: 600 }]);
    assert.equal((await f.getFileInfo(["/tmp/ts/dir/digits"]))["/tmp/ts/dir/digits"].mode, 600);
    await f.createDirectories([{ path: "/tmp/ts/dir/deeper/deepest", mode: 755 }]);
    const one = await f.listDirectory({ path: "/tmp/ts/dir" });
    assert.deepEqual(one.map((e) => e.path), ["/tmp/ts/dir/b.bin", "/tmp/ts/dir/deeper", "/tmp/ts/dir/digits"]);
    const two = await f.listDirectory({ path: "/tmp/ts/dir", depth: 2 });
    assert.ok(two.some((e) => e.path === "/tmp/ts/dir/deeper/deepest"), JSON.stringify(two.map((e) => e.path)));
    await f.deleteDirectories(["/tmp/ts/dir"]);
    const ls = await sb.commands.run("ls -A /tmp/ts");
    assert.equal(stdout(ls), "");
  });
});

test("metrics, endpoints, list, metadata, egress policy, runStream, renew, pause/resume, kill", async () => {
  await withSandbox(
    async (sb) => {
    const m = await sb.getMetrics();
    assert.ok(m.memoryTotalMiB > 0, `memory total ${m.memoryTotalMiB}`);
    assert.ok(m.cpuCount > 0, `cpu count ${m.cpuCount}`);

    // A server inside the sandbox, reached through the endpoint the SDK resolves.
    await sb.files.writeFiles([{ path: "/tmp/served.txt", data: "served from inside" }]);
    await sb.commands.run("python3 -m http.server 8321 --bind 127.0.0.1 --directory /tmp >/dev/null 2>&1", { background: true });
    const url = await sb.getEndpointUrl(8321);
    let body = null;
    for (let i = 0; i < 100 && body === null; i++) {
      const r = await fetch(`${url}/served.txt`).catch(() => null);
      if (r && r.ok) body = await r.text();
      else await new Promise((res) => setTimeout(res, 100));
    }
    assert.equal(body, "served from inside");

    const manager = SandboxManager.create({ connectionConfig: config() });
    try {
      const list = await manager.listSandboxInfos({ states: ["Running"], pageSize: 50 });
      assert.ok(list.items.some((s) => s.id === sb.id));
    } finally {
      await manager.close();
    }
    const patched = await sb.patchMetadata({ added: "yes", suite: null });
    assert.equal(patched.metadata.added, "yes");
    assert.equal(patched.metadata.suite, undefined);
    // Port 18080, answered by the daemon from the sandbox's record.
    const policy = await sb.getEgressPolicy();
    assert.equal(typeof policy.defaultAction, "string", JSON.stringify(policy));

    // runStream: the raw execd events, in order.
    const kinds = [];
    for await (const ev of sb.commands.runStream("echo streamed")) kinds.push(ev.type);
    assert.ok(kinds.includes("stdout") && kinds.at(-1) === "execution_complete", kinds.join(","));

    await sb.renew(1200);
    const info = await sb.getInfo();
    assert.ok(info.expiresAt.getTime() - Date.now() > 900_000, `expiresAt ${info.expiresAt}`);
    },
    { metadata: { suite: "ts" } },
  );

  // pause/resume: resume() hands back a new instance (the old one's transport is closed).
  const sb = await Sandbox.create({ connectionConfig: config(), image: "host", timeoutSeconds: 600 });
  await sb.pause();
  assert.equal((await sb.getInfo()).status.state, "Paused");
  const resumed = await sb.resume();
  try {
    assert.equal((await resumed.getInfo()).status.state, "Running");
    assert.equal(stdout(await resumed.commands.run("echo back")), "back");
  } finally {
    await resumed.kill();
    await resumed.close();
  }
  const gone = await fetch(`http://${process.env.OPEN_SANDBOX_DOMAIN}/v1/sandboxes/${sb.id}`);
  assert.equal(gone.status, 404);
});

test("an unknown sandbox is a SandboxException with the server's code", async () => {
  await assert.rejects(
    Sandbox.connect({ sandboxId: "does-not-exist", connectionConfig: config(), skipHealthCheck: true }).then((s) => s.getInfo()),
    (e) => e instanceof SandboxException && /NOT_FOUND/.test(e.error.code),
  );
});
