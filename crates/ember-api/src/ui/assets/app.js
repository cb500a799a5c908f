// The ember dashboard: renders the snapshot /ui/events pushes every second,
// and a minimal terminal (a <pre> and key events) over the agent's PTY
// WebSocket. No framework, no build step (docs/observability.md).
"use strict";
const $ = (s) => document.querySelector(s);
const el = (tag, attrs, ...kids) => {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  for (const k of kids) e.append(k instanceof Node ? k : String(k ?? ""));
  return e;
};
const fmtSecs = (s) => (s == null || !isFinite(s) ? "–" : s < 1e-3 ? (s * 1e6).toFixed(0) + " µs" : s < 1 ? (s * 1e3).toFixed(1) + " ms" : s.toFixed(2) + " s");

function fill(tbody, rows) {
  tbody.replaceChildren(...rows);
}

function pools(list) {
  fill($("#pools tbody"), list.map((p) => {
    const z = p.sizing || {};
    const arithmetic = `λ=${(z.arrivalPerSec ?? 0).toFixed(2)}/s × W=${fmtSecs(z.refillSecs)} = ${(z.inFlightDemand ?? 0).toFixed(2)} in flight, +${(z.headroom ?? 0).toFixed(1)} headroom → ${z.target}`;
    return el("tr", { "data-pool": p.name },
      el("td", {}, p.name), el("td", {}, p.template), el("td", {}, p.runtimeClass),
      el("td", { class: "idle" }, p.idle), el("td", { class: "starting" }, p.starting),
      el("td", { class: "claimed" }, p.claimed), el("td", { class: "target" }, z.target),
      el("td", {}, `${p.min}..${p.max} (${typeof p.target === "string" ? p.target : "fixed " + p.target})`),
      el("td", { class: "arith" }, arithmetic), el("td", { class: "claims" }, p.claimsTotal), el("td", {}, p.missesTotal));
  }));
}

const fmtMiB = (b) => (b / (1 << 20)).toFixed(0) + " MiB";

// A cluster node's view of every node it heard of (none on a lone daemon).
function nodes(list) {
  $("#nodebox").hidden = list.length === 0;
  fill($("#nodelist tbody"), list.map((n) => el("tr", { "data-node": n.name, class: n.alive ? "alive" : "dead" },
    el("td", {}, n.name), el("td", { class: "alive" }, n.alive ? "live" : `dead (silent ${fmtSecs(n.silentMs / 1000)})`),
    el("td", {}, n.apiOnly ? "api only" : "sandboxes"), el("td", { class: "free" }, fmtMiB(n.freeMemoryBytes)),
    el("td", { class: "sandboxes" }, n.sandboxes), el("td", { class: "idle" }, n.idleMembers),
    el("td", { class: "mono" }, n.advertise))));
}

function quantile(h, q) {
  const want = q * h.count;
  for (const [le, n] of h.buckets) if (n >= want && h.count > 0) return le === "+Inf" ? Infinity : Number(le);
  return null;
}

function histogram(name, h) {
  let prev = 0;
  const counts = h.buckets.map(([le, n]) => { const c = n - prev; prev = n; return [le, c]; });
  const first = counts.findIndex(([, c]) => c > 0);
  let last = counts.length - 1;
  while (last > 0 && counts[last][1] === 0) last--;
  const shown = first < 0 ? [] : counts.slice(first, last + 1);
  const max = Math.max(1, ...shown.map(([, c]) => c));
  const bars = el("div", { class: "bars" }, ...shown.map(([le, c]) =>
    el("div", { class: "bar", title: `≤ ${le} s: ${c}`, style: `height:${Math.round((80 * c) / max)}px` })));
  return el("div", { class: "hist", id: "hist-" + name },
    el("b", {}, name), " ", el("span", { class: "count" }, h.count), " observed, p50 ",
    fmtSecs(quantile(h, 0.5)), ", p99 ", fmtSecs(quantile(h, 0.99)), bars);
}

// Boundaries fetched on demand (a read of the kernel's state per sandbox),
// kept across re-renders.
const boundaries = {};
function sandboxes(list, total) {
  $("#sbcount").textContent = `(${total})`;
  fill($("#sandboxes tbody"), list.map((s) => {
    let b = el("button", { class: "bnd" }, "show");
    b.onclick = () => boundary(s.id, b);
    if (boundaries[s.id] != null) b = el("pre", { class: "bnd-out" }, boundaries[s.id]);
    const t = el("button", { class: "term" }, "terminal");
    t.onclick = () => terminal(s.id);
    return el("tr", { "data-id": s.id }, el("td", { class: "mono" }, s.id), el("td", { class: "state" }, s.state),
      el("td", {}, s.runtimeClass), el("td", {}, s.template), el("td", {}, s.launch), el("td", {}, s.pool),
      el("td", { class: "boundary" }, b), el("td", {}, s.state === "Running" ? t : ""));
  }));
}

async function boundary(id, cell) {
  const r = await fetch(`/ui/sandboxes/${id}/boundary`);
  const j = await r.json();
  const text = r.ok ? Object.entries(j).map(([k, v]) => `${k}: ${typeof v === "object" ? JSON.stringify(v) : v}`).join("\n") : j.message;
  boundaries[id] = text;
  cell.replaceWith(el("pre", { class: "bnd-out" }, text));
}

function kv(sel, obj) {
  fill($(sel + " tbody"), Object.entries(obj || {}).map(([k, v]) => el("tr", { "data-key": k }, el("td", {}, k), el("td", {}, v))));
}

function render(s) {
  pools(s.pools);
  $("#latency").replaceChildren(...["claim", "create", "exec"].map((n) => histogram(n, s.latency[n])));
  kv("#queue", s.queue);
  kv("#denied", s.denied);
  $("#nodes").textContent = s.nodesAlive == null ? "" : `nodes alive: ${s.nodesAlive}`;
  nodes(s.nodes || []);
  $("#reports").replaceChildren(...s.reports.map((r) => el("li", {}, el("a", { href: "/ui/reports/" + encodeURIComponent(r) }, r))));
  sandboxes(s.sandboxes, s.sandboxesTotal);
}

let updates = 0;
function connect() {
  const es = new EventSource("/ui/events");
  es.addEventListener("snapshot", (e) => {
    render(JSON.parse(e.data));
    updates++;
    $("#status").textContent = `live (${updates} updates)`;
    $("#status").className = "status live";
    document.body.dataset.updates = updates;
  });
  es.onerror = () => { $("#status").textContent = "reconnecting…"; $("#status").className = "status down"; };
}

// The terminal: binary frames 0x01/0x02 are output, 0x03 a replay (8-byte
// offset first); keys go back as 0x00 + bytes.
let ws = null;
const ANSI = /\x1b\[[0-9;?]*[ -\/]*[@-~]|\x1b\][^\x07]*\x07|\x1b[()][0-9A-Za-z]|\r/g;
async function terminal(id) {
  if (ws) ws.close();
  const term = $("#term");
  term.textContent = "";
  $("#termbox").hidden = false;
  $("#termid").textContent = id;
  const r = await fetch(`/ui/sandboxes/${id}/pty`, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify({ command: "sh" }) });
  const j = await r.json();
  if (!r.ok) { term.textContent = j.message; return; }
  const proto = location.protocol === "https:" ? "wss:" : "ws:";
  ws = new WebSocket(`${proto}//${location.host}/ui/sandboxes/${id}/pty/${j.session_id}/ws?pty=1`);
  ws.binaryType = "arraybuffer";
  const dec = new TextDecoder();
  ws.onmessage = (m) => {
    if (typeof m.data === "string") {
      const f = JSON.parse(m.data);
      if (f.type === "connected") { term.dataset.connected = "1"; ws.send(JSON.stringify({ type: "resize", cols: 100, rows: 30 })); }
      if (f.type === "exit") term.append(`\n[exit ${f.exit_code}]\n`);
      return;
    }
    const b = new Uint8Array(m.data);
    const body = b[0] === 3 ? b.subarray(9) : b.subarray(1);
    term.append(dec.decode(body, { stream: true }).replace(ANSI, ""));
    term.scrollTop = term.scrollHeight;
  };
  term.focus();
}

function sendKeys(s) {
  if (!ws || ws.readyState !== WebSocket.OPEN) return;
  const bytes = new TextEncoder().encode(s);
  const f = new Uint8Array(bytes.length + 1);
  f.set(bytes, 1);
  ws.send(f);
}

$("#term").addEventListener("keydown", (e) => {
  const special = { Enter: "\r", Backspace: "\x7f", Tab: "\t", Escape: "\x1b", ArrowUp: "\x1b[A", ArrowDown: "\x1b[B", ArrowRight: "\x1b[C", ArrowLeft: "\x1b[D" };
  let s = special[e.key];
  if (!s && e.ctrlKey && e.key.length === 1) s = String.fromCharCode(e.key.toUpperCase().charCodeAt(0) - 64);
  if (!s && !e.ctrlKey && !e.metaKey && e.key.length === 1) s = e.key;
  if (s) { sendKeys(s); e.preventDefault(); }
});
$("#term").addEventListener("paste", (e) => { sendKeys(e.clipboardData.getData("text")); e.preventDefault(); });
$("#termclose").onclick = () => { if (ws) ws.close(); $("#termbox").hidden = true; };
connect();
