// Affinity Gateway dashboard: polls the admin routes once a second and redraws. Hand-written, no build
// step, no dependencies. Everything shown is set as text (ids and names come from clients and configs).
"use strict";

const KEY = "affinity-gateway-admin-key";
const POLL_MS = 1000;
const MAX_POINTS = 300;
const points = new Map(); // request id -> {at, ttft, total}: the chart's history, as decisions arrive
let busy = false;

function takeKeyFromFragment() {
  // #key=... never reaches a server; it is moved to this tab's sessionStorage and dropped from the URL
  const match = location.hash.match(/(?:^#|&)key=([^&]+)/);
  if (match) {
    sessionStorage.setItem(KEY, decodeURIComponent(match[1]));
    history.replaceState(null, "", location.pathname + location.search);
  }
}

class AuthNeeded extends Error {}

async function get(path) {
  const key = sessionStorage.getItem(KEY);
  const answer = await fetch(path, { headers: key ? { Authorization: "Bearer " + key } : {} });
  if (answer.status === 401 || answer.status === 403) throw new AuthNeeded(path);
  if (!answer.ok) throw new Error(path + ": " + answer.status);
  return answer.json();
}

function cell(value, cls) {
  const td = document.createElement("td");
  if (value instanceof Node) td.append(value);
  else td.textContent = value === null || value === undefined ? "–" : String(value);
  if (cls) td.className = cls;
  return td;
}

function fill(tableId, rows) {
  const body = document.querySelector("#" + tableId + " tbody");
  body.replaceChildren(...rows);
}

function tr(cells, attrs) {
  const row = document.createElement("tr");
  row.append(...cells);
  Object.assign(row.dataset, attrs || {});
  return row;
}

const secs = (v) => (v === null || v === undefined ? null : v.toFixed(3));
const pct = (v) => (v === null || v === undefined ? null : (100 * v).toFixed(1) + " %");
const money = (v) => (v === null || v === undefined ? null : v.toFixed(6));

function span(text, cls) {
  const s = document.createElement("span");
  s.textContent = text;
  if (cls) s.className = cls;
  return s;
}

function renderReplicas(pools) {
  const rows = [];
  for (const [model, pool] of Object.entries(pools)) {
    for (const r of pool.replicas) {
      const health = r.available ? span("up", "ok") : span(r.healthy ? "not ready" : "down", "bad");
      const breaker = span(r.breaker, r.breaker === "closed" ? "ok" : r.breaker === "open" ? "bad" : "warn");
      rows.push(tr([cell(model), cell(r.id), cell(health), cell(breaker), cell(r.in_flight, "num"),
        cell(r.running, "num"), cell(r.waiting, "num"), cell(pct(r.kv_usage), "num")], { replica: r.id }));
    }
  }
  fill("replicas", rows);
}

function renderDecisions(decisions) {
  fill("decisions", decisions.slice(0, 20).map((d) => {
    const candidates = document.createElement("span");
    d.candidates.forEach((c, i) => {
      if (i) candidates.append(" · ");
      candidates.append(span(`${c.replica} ${c.score.toFixed(4)}, ${c.cached_tokens}, ${c.wait_s.toFixed(4)}`,
        c.replica === d.replica ? "chosen" : ""));
    });
    return tr([cell(new Date(d.at * 1000).toLocaleTimeString()), cell(d.request_id), cell(d.model),
      cell(d.replica), cell(d.reason), cell(d.status, d.status === 200 ? "ok" : "bad"), cell(secs(d.ttft_s), "num"),
      cell(secs(d.total_s), "num"), cell(`${d.predicted_cached_tokens ?? "–"} / ${d.reported_cached_tokens ?? "–"}`),
      cell(candidates)], { request: d.request_id });
  }).map((row) => { row.className = "decision"; return row; }));
  for (const d of decisions) {
    if (d.ttft_s !== null && !points.has(d.request_id)) points.set(d.request_id, { at: d.at, ttft: d.ttft_s, total: d.total_s });
  }
  while (points.size > MAX_POINTS) points.delete(points.keys().next().value);
}

function renderCache(usage, decisions) {
  const t = usage.total;
  const both = decisions.filter((d) => d.predicted_cached_tokens !== null && d.reported_cached_tokens !== null);
  const predicted = both.reduce((n, d) => n + d.predicted_cached_tokens, 0);
  const reported = both.reduce((n, d) => n + d.reported_cached_tokens, 0);
  const items = [
    ["requests", t.requests], ["prompt tokens", t.prompt_tokens], ["cached tokens", t.cached_tokens],
    ["cache hit share", t.prompt_tokens ? pct(t.cached_tokens / t.prompt_tokens) : null],
    [`predicted / reported cached (last ${both.length} decisions)`, `${predicted} / ${reported}`],
    ["cost", money(t.cost)], ["saved by the cache", money(t.saved_by_cache)],
  ];
  const dl = document.getElementById("cache");
  dl.replaceChildren(...items.flatMap(([name, value]) => {
    const dt = document.createElement("dt");
    dt.textContent = name;
    const dd = document.createElement("dd");
    dd.textContent = value === null || value === undefined ? "–" : String(value);
    return [dt, dd];
  }));
}

function renderChart() {
  const svg = document.getElementById("chart");
  const data = [...points.values()].sort((a, b) => a.at - b.at);
  svg.replaceChildren();
  if (!data.length) return;
  const t0 = data[0].at, t1 = Math.max(data[data.length - 1].at, t0 + 1);
  const top = Math.max(...data.map((p) => p.total), 1e-3);
  const xy = (p, v) => `${(600 * (p.at - t0) / (t1 - t0)).toFixed(1)},${(195 - 190 * v / top).toFixed(1)}`;
  for (const [field, color] of [["total", "#e07b00"], ["ttft", "#2f6fdf"]]) {
    const line = document.createElementNS("http://www.w3.org/2000/svg", "polyline");
    line.setAttribute("points", data.map((p) => xy(p, p[field])).join(" "));
    line.setAttribute("fill", "none");
    line.setAttribute("stroke", color);
    line.setAttribute("stroke-width", "1.5");
    line.setAttribute("vector-effect", "non-scaling-stroke");
    svg.append(line);
  }
  document.getElementById("chart-scale").textContent = ` 0 – ${top.toFixed(3)} s over ${(t1 - t0).toFixed(0)} s`;
}

function renderPrefix(report) {
  fill("prefix", report.families.map((f) => tr([cell(f.tenant), cell(f.model), cell(f.family),
    cell(`${f.affected_requests}/${f.requests_seen}`, "num"), cell(f.divergence.block, "num"),
    cell(f.divergence.token_offset, "num"), cell(f.recoverable_tokens, "num"), cell(f.lost.tokens, "num"),
    cell(secs(f.lost.prefill_s), "num"), cell(money(f.lost.cost), "num")])));
}

function renderSessions(sessions) {
  fill("sessions", sessions.map((s) => tr([cell(s.id), cell(s.source), cell(s.tenant), cell(s.hops, "num"),
    cell(secs(s.ttft_s), "num"), cell(secs(s.queue_s), "num"), cell(pct(s.prefill_share), "num"),
    cell(secs(s.total_s), "num"), cell(s.ended ? "yes" : "no")], { session: s.id })));
}

function askForKey() {
  const status = document.getElementById("status");
  if (document.getElementById("key-form")) return;
  const form = document.createElement("form");
  form.id = "key-form";
  const input = document.createElement("input");
  input.type = "password";
  input.placeholder = "admin API key";
  const button = document.createElement("button");
  button.textContent = "use";
  form.append(input, button);
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    sessionStorage.setItem(KEY, input.value);
    form.remove();
    poll();
  });
  status.textContent = "this gateway needs an admin key: ";
  status.append(form);
}

async function poll() {
  if (busy) return;
  busy = true;
  try {
    const [pools, decisions, usage, prefix, sessions] = await Promise.all([
      get("/admin/replicas"), get("/admin/decisions?limit=200"), get("/admin/usage?window_s=3600"),
      get("/admin/prefix-report"), get("/admin/sessions?limit=20")]);
    renderReplicas(pools);
    renderDecisions(decisions.decisions);
    renderCache(usage, decisions.decisions);
    renderChart();
    renderPrefix(prefix);
    renderSessions(sessions.sessions);
    document.getElementById("status").textContent = "updated " + new Date().toLocaleTimeString();
  } catch (error) {
    if (error instanceof AuthNeeded) askForKey();
    else document.getElementById("status").textContent = "error: " + error.message;
  } finally {
    busy = false;
  }
}

takeKeyFromFragment();
poll();
setInterval(poll, POLL_MS);
