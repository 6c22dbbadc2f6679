// The operator's console: every figure shown here comes from the service's API,
// called with the token the user gives (kept in this tab's sessionStorage only).
"use strict";

const TOKEN_KEY = "lmsp-console-token";
const POLL_MS = 2000;
const SLOW_EVERY = 15; // models, clients and history: every 15th poll (30 s)
const $ = (id) => document.getElementById(id);

let token = sessionStorage.getItem(TOKEN_KEY);
let scopes = new Set();
let timer = null;
let ticks = 0;

// -- calls --------------------------------------------------------------------

async function api(method, path, body) {
  const headers = { Authorization: "Bearer " + token };
  const init = { method, headers, cache: "no-store", credentials: "omit" };
  if (body !== undefined) {
    headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  const resp = await fetch(path, init);
  let json = null;
  try {
    json = await resp.json();
  } catch (e) {
    json = null;
  }
  if (resp.status === 401) {
    logout("The token was refused (401): " + errorText(json));
  }
  return { status: resp.status, json, headers: resp.headers };
}

function errorText(json) {
  return json && json.error ? json.error.code + ": " + json.error.message : "no answer";
}

function failed(where, answer) {
  $(where).textContent = answer.status + " " + errorText(answer.json);
}

// -- building the page ----------------------------------------------------------

function el(tag, text, cls) {
  const node = document.createElement(tag);
  if (text !== undefined && text !== null) node.textContent = String(text);
  if (cls) node.className = cls;
  return node;
}

function button(label, onclick) {
  const b = el("button", label);
  b.type = "button";
  b.addEventListener("click", onclick);
  return b;
}

function row(cells) {
  const tr = document.createElement("tr");
  for (const cell of cells) {
    if (cell instanceof Node) {
      const td = document.createElement("td");
      td.appendChild(cell);
      tr.appendChild(td);
    } else if (typeof cell === "number") {
      tr.appendChild(el("td", cell, "num"));
    } else {
      tr.appendChild(el("td", cell === null || cell === undefined ? "—" : cell));
    }
  }
  return tr;
}

function fill(tableId, rows, emptyText, width) {
  const body = $(tableId).tBodies[0];
  body.replaceChildren();
  if (rows.length === 0) {
    const td = el("td", emptyText, "empty");
    td.colSpan = width;
    const tr = document.createElement("tr");
    tr.appendChild(td);
    body.appendChild(tr);
  }
  for (const r of rows) body.appendChild(r);
}

function group(...nodes) {
  const span = document.createElement("span");
  for (const n of nodes) span.appendChild(n);
  return span;
}

function bytes(n) {
  if (n === null || n === undefined) return null;
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) {
    n /= 1024;
    i += 1;
  }
  return n.toFixed(i === 0 ? 0 : 1) + " " + units[i];
}

function age(seconds) {
  const s = Math.max(0, Math.round(Date.now() / 1000 - seconds));
  if (s < 60) return s + " s";
  if (s < 3600) return Math.floor(s / 60) + " min " + (s % 60) + " s";
  return Math.floor(s / 3600) + " h " + Math.floor((s % 3600) / 60) + " min";
}

function when(seconds) {
  return seconds ? new Date(seconds * 1000).toLocaleString() : null;
}

// -- the token and what it may do ------------------------------------------------

function logout(message) {
  sessionStorage.removeItem(TOKEN_KEY);
  token = null;
  if (timer) clearInterval(timer);
  timer = null;
  $("views").hidden = true;
  $("logout").hidden = true;
  $("scopes").textContent = "";
  $("login").hidden = false;
  $("login-error").textContent = message || "";
}

// A scope is held when its probe is not refused with 401 or 403. The probes
// change nothing: the service checks the scope before it looks an id up, so
// an id that cannot exist gets 404 (or 400) from a token that may act on it.
const PROBES = [
  ["models:read", "GET", "/v1/models"],
  ["responses:read", "GET", "/v1/tasks?limit=1"],
  ["responses:write", "POST", "/v1/tasks/task_0/cancel"],
  ["models:write", "POST", "/v1/models/~/load"],
];

async function readScopes() {
  const clients = await api("GET", "/v1/clients?limit=1");
  if (clients.status === 401) return null;
  if (clients.status === 200) return new Set(["admin", ...PROBES.map((p) => p[0])]);
  const held = new Set();
  for (const [scope, method, path] of PROBES) {
    const answer = await api(method, path);
    if (answer.status === 401) return null;
    if (answer.status !== 403) held.add(scope);
  }
  return held;
}

async function start() {
  $("login").hidden = true;
  const held = await readScopes();
  if (held === null) return;
  scopes = held;
  $("scopes").textContent = "scopes: " + ([...scopes].join(", ") || "none");
  $("logout").hidden = false;
  $("views").hidden = false;
  $("models-view").hidden = !scopes.has("models:read");
  $("queue-view").hidden = !scopes.has("responses:read");
  $("playground-view").hidden = !(scopes.has("responses:write") && scopes.has("models:read"));
  $("history-view").hidden = !scopes.has("models:read");
  $("clients-view").hidden = !scopes.has("admin");
  ticks = 0;
  await poll();
  timer = setInterval(poll, POLL_MS);
}

async function poll() {
  if (!token) return;
  const slow = ticks % SLOW_EVERY === 0;
  ticks += 1;
  const work = [];
  if (scopes.has("responses:read")) work.push(refreshQueue());
  if (slow && scopes.has("models:read")) work.push(refreshModels(), refreshHistory());
  if (slow && scopes.has("admin")) work.push(refreshClients());
  await Promise.all(work);
}

async function showService() {
  try {
    const resp = await fetch("/v1/service", { cache: "no-store", credentials: "omit" });
    const s = await resp.json();
    $("service").textContent = s.name + " · " + s.version + " · " + s.protocol;
  } catch (e) {
    $("service").textContent = "";
  }
}

// -- models ----------------------------------------------------------------------

async function refreshModels() {
  const answer = await api("GET", "/v1/models");
  if (answer.status !== 200) return failed("models-error", answer);
  $("models-error").textContent = "";
  const models = answer.json.data;
  const rows = models.map((m) => {
    const actions = scopes.has("models:write")
      ? group(button("load", () => modelAction(m.id, "load")), button("unload", () => modelAction(m.id, "unload")))
      : "";
    const kv = m.kv_files ? m.kv_files + " (" + bytes(m.kv_bytes) + ")" : "none";
    return row([m.id, m.state, m.file, bytes(m.size_bytes), m.memory_bytes == null ? "" : bytes(m.memory_bytes),
      kv, (m.capabilities || []).join(", "), m.context_length, m.quantization, actions]);
  });
  fill("models", rows, "no models registered", 10);
  fillModelChoice(models.filter((m) => (m.capabilities || []).includes("generation")));
}

async function modelAction(id, action) {
  $("models-error").textContent = action + " " + id + "…";
  const answer = await api("POST", "/v1/models/" + encodeURIComponent(id) + "/" + action);
  if (answer.status !== 200) return failed("models-error", answer);
  await refreshModels();
}

function fillModelChoice(models) {
  const select = $("play-model");
  const chosen = select.value;
  select.replaceChildren(...models.map((m) => el("option", m.id)));
  if (models.some((m) => m.id === chosen)) select.value = chosen;
}

// -- the queue -----------------------------------------------------------------

async function refreshQueue() {
  const [running, queued] = await Promise.all([
    api("GET", "/v1/tasks?status=running&limit=100"),
    api("GET", "/v1/tasks?status=queued&limit=100"),
  ]);
  for (const answer of [running, queued]) {
    if (answer.status !== 200) return failed("queue-error", answer);
  }
  $("queue-error").textContent = "";
  const tasks = [...running.json.data, ...queued.json.data];
  const rows = tasks.map((t) => {
    const cancel = scopes.has("responses:write") ? button("cancel", () => cancelTask(t.id)) : "";
    const tr = row([t.id, t.status, t.client_id, t.model, age(t.created_at),
      t.queue_position, t.queued_ahead, t.output_tokens, cancel]);
    tr.dataset.task = t.id;
    return tr;
  });
  fill("queue", rows, "nothing running or queued", 9);
  $("queue-when").textContent = "at " + new Date().toLocaleTimeString();
}

async function cancelTask(id) {
  const answer = await api("POST", "/v1/tasks/" + encodeURIComponent(id) + "/cancel");
  if (answer.status !== 200) return failed("queue-error", answer);
  await refreshQueue();
}

// -- clients (admin) -------------------------------------------------------------

const LIMITS = ["priority", "max_running", "max_queued", "tokens_per_hour"];

async function refreshClients() {
  const answer = await api("GET", "/v1/clients?limit=100");
  if (answer.status !== 200) return failed("clients-error", answer);
  $("clients-error").textContent = "";
  const rows = answer.json.data.map((c) => {
    const inputs = LIMITS.map((name) => {
      const input = el("input");
      input.type = "number";
      input.min = name === "priority" ? "1" : "0";
      input.name = name;
      input.placeholder = name === "priority" ? "" : "none";
      input.value = c[name] === null ? "" : String(c[name]);
      return input;
    });
    const save = button("save limits", () => saveLimits(c.id, inputs));
    const revoke = c.revoked_at ? "" : button("revoke", () => revokeClient(c.id, c.name));
    const tr = row([c.id, c.name, c.scopes.join(", "), when(c.created_at), when(c.revoked_at),
      when(c.last_seen_at), when(c.last_task_at), c.tokens_today, c.tokens_24h, ...inputs, group(save, revoke)]);
    tr.dataset.client = c.id;
    return tr;
  });
  fill("clients", rows, "no clients", 14);
}

async function saveLimits(id, inputs) {
  const body = {};
  for (const input of inputs) {
    const text = input.value.trim();
    if (input.name === "priority" && text === "") continue; // priority cannot be taken away
    body[input.name] = text === "" ? null : Number(text);
  }
  const answer = await api("PATCH", "/v1/clients/" + encodeURIComponent(id), body);
  if (answer.status !== 200) return failed("clients-error", answer);
  await refreshClients();
}

async function revokeClient(id, name) {
  if (!window.confirm("Revoke " + (name || id) + "? Its token stops working.")) return;
  const answer = await api("DELETE", "/v1/clients/" + encodeURIComponent(id));
  if (answer.status !== 200) return failed("clients-error", answer);
  await refreshClients();
}

async function makePairing(event) {
  event.preventDefault();
  const chosen = [...document.querySelectorAll("#pair-form input[name=scope]:checked")].map((i) => i.value);
  const body = { scopes: chosen };
  const name = $("pair-name").value.trim();
  if (name) body.name = name;
  const answer = await api("POST", "/v1/pairings", body);
  if (answer.status !== 201) return failed("pair-code", answer);
  const p = answer.json;
  $("pair-code").textContent = p.code + " (" + p.scopes.join(", ") + "; until " + when(p.expires_at) + ")";
}

// -- the playground ---------------------------------------------------------------

async function play(event) {
  event.preventDefault();
  const model = $("play-model").value;
  const input = $("play-input").value;
  if (!model || !input) return;
  $("play-output").textContent = "";
  $("play-meta").textContent = "";
  $("play-error").textContent = "";
  $("play-send").disabled = true;
  try {
    const body = { model, input, stream: true };
    const max = Number($("play-max").value);
    if (max >= 1) body.max_output_tokens = max;
    await stream(body);
  } catch (e) {
    $("play-error").textContent = String(e);
  } finally {
    $("play-send").disabled = false;
  }
}

async function stream(body) {
  const resp = await fetch("/v1/responses", {
    method: "POST",
    cache: "no-store",
    credentials: "omit",
    headers: { Authorization: "Bearer " + token, "Content-Type": "application/json", Accept: "text/event-stream" },
    body: JSON.stringify(body),
  });
  if (!resp.ok) {
    let json = null;
    try {
      json = await resp.json();
    } catch (e) {
      json = null;
    }
    const wait = resp.headers.get("Retry-After");
    $("play-error").textContent = resp.status + " " + errorText(json) + (wait ? " (retry after " + wait + " s)" : "");
    return;
  }
  const reader = resp.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer += decoder.decode(value, { stream: true }).replace(/\r\n/g, "\n");
    let cut;
    while ((cut = buffer.indexOf("\n\n")) >= 0) {
      onFrame(buffer.slice(0, cut));
      buffer = buffer.slice(cut + 2);
    }
  }
}

function onFrame(frame) {
  const data = frame
    .split("\n")
    .filter((line) => line.startsWith("data:"))
    .map((line) => line.slice(5).replace(/^ /, ""))
    .join("\n");
  if (!data) return; // a keep-alive comment
  const event = JSON.parse(data);
  if (event.type === "response.output_text.delta") {
    $("play-output").textContent += event.delta;
  } else if (event.type === "response.created") {
    $("play-meta").textContent = "response " + event.response.id + " · task " + event.response.task.id;
  } else if (["response.completed", "response.incomplete", "response.failed"].includes(event.type)) {
    const r = event.response;
    const u = r.usage;
    const usage = u ? " · input " + u.input_tokens + " tokens, output " + u.output_tokens + " tokens" : "";
    $("play-meta").textContent = "response " + r.id + " · task " + r.task.id + " · " + r.status + usage;
    if (r.error) $("play-error").textContent = r.error.code + ": " + r.error.message;
  } else if (event.type === "error") {
    $("play-error").textContent = event.code + ": " + event.message;
  }
}

// -- the last hour -----------------------------------------------------------------

// [name, title, fields, how the scale's top is written]
const PLOTS = [
  ["tokens", "tokens/s", ["tokens_per_second"], String],
  ["queue", "queued and running", ["queued", "running"], String],
  ["ttft", "time to first token p50 and p99 (ms)", ["ttft_p50_ms", "ttft_p99_ms"], String],
  ["errors", "errors", ["errors"], String],
  ["disk", "disk: database, KV files, models", ["db_bytes", "kv_bytes", "model_bytes"], bytes],
];
const LINE_CLASSES = ["line", "line second", "line third"];

async function refreshHistory() {
  const answer = await api("GET", "/v1/service/history?minutes=60");
  const plots = $("plots");
  if (answer.status !== 200 || !answer.json || !Array.isArray(answer.json.data)) {
    plots.replaceChildren(el("p", "no history", "empty"));
    return;
  }
  const points = answer.json.data;
  plots.replaceChildren(...PLOTS.map(([name, title, fields, format]) => plot(name, title, points, fields, format)));
}

const SVG = "http://www.w3.org/2000/svg";

function svg(tag, attrs) {
  const node = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, String(v));
  return node;
}

function plot(name, title, points, fields, format) {
  const W = 320, H = 120, PAD = 24;
  const figure = el("figure");
  figure.dataset.plot = name;
  const box = svg("svg", { class: "plot", width: W, height: H, viewBox: `0 0 ${W} ${H}`, role: "img" });
  const times = points.map((p) => p.at);
  const values = points.flatMap((p) => fields.map((f) => p[f])).filter((v) => typeof v === "number");
  const t0 = Math.min(...times), t1 = Math.max(...times);
  const top = Math.max(1, ...values);
  const x = (t) => PAD + (t1 > t0 ? ((t - t0) / (t1 - t0)) * (W - 2 * PAD) : 0);
  const y = (v) => H - PAD - (v / top) * (H - 2 * PAD);
  fields.forEach((field, i) => {
    let d = "";
    let pen = "M";
    let drawn = 0;
    for (const p of points) {
      if (typeof p[field] !== "number") {
        pen = "M"; // a gap where there is no value
        continue;
      }
      d += `${pen}${x(p.at).toFixed(1)},${y(p[field]).toFixed(1)} `;
      pen = "L";
      drawn += 1;
    }
    if (d) box.appendChild(svg("path", { d, class: LINE_CLASSES[i], "data-field": field, "data-points": drawn }));
  });
  const label = svg("text", { x: 2, y: 12 });
  label.textContent = format(Math.round(top * 100) / 100);
  box.appendChild(label);
  box.appendChild(svg("line", { x1: PAD, y1: H - PAD, x2: W - PAD, y2: H - PAD, stroke: "#ccd" }));
  figure.appendChild(box);
  const last = points.length ? points[points.length - 1] : {};
  const now = fields.map((f) => f + " " + (last[f] === null || last[f] === undefined ? "—" : format(last[f])))
    .join(", ");
  figure.appendChild(el("figcaption", title + (points.length ? " · last: " + now : " · no points")));
  return figure;
}

// -- start ------------------------------------------------------------------------

document.addEventListener("DOMContentLoaded", () => {
  $("login-form").addEventListener("submit", (event) => {
    event.preventDefault();
    const value = $("token").value.trim();
    if (!value) return;
    token = value;
    sessionStorage.setItem(TOKEN_KEY, token);
    $("token").value = "";
    start();
  });
  $("logout").addEventListener("click", () => logout(""));
  $("play-form").addEventListener("submit", play);
  $("pair-form").addEventListener("submit", makePairing);
  showService();
  if (token) start();
  else logout("");
});
