// vigil console page: reads the console's JSON API, follows /api/stream (SSE) and refetches
// what a change names. No build step, no library. Every value from the API goes into the DOM
// as text (textContent / setAttribute through el()), never as markup.
"use strict";

const ATTENTION_VERDICTS = ["STUCK_AFTER_DECISION", "ORPHANED_WAIT", "UNROUTABLE_WAIT", "STALE_REQUEST"];
const REVIEWABLE = ["UNKNOWN", "MANUAL_REVIEW"];
const SETTLED = ["VERIFIED", "FAILED", "CANCELLED"];
const PAGE_LIMIT = 500;
const MAX_PAGES = 10;
const LAG_EVERY_MS = 5000;

const state = {
  approvals: [],
  operations: [],
  workItems: [],
  alerts: [],
  summary: null,
  eventTime: null,
  freshAt: null,
  skewMs: 0,
  lag: null,
  filters: { owner: "", kind: "", text: "" },
  truncated: false,
  execution: null, // {id, detail, timeline} on an execution page
  reviewNotes: {}, // operation id -> {note, result, cls}: kept across re-renders
};

// ---------- DOM helpers (text only) ----------
function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k === "class") node.className = v;
    else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else if (k === "value") node.value = v;
    else node.setAttribute(k, String(v));
  }
  for (const c of children.flat(Infinity)) {
    if (c === null || c === undefined || c === false) continue;
    node.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return node;
}
const $ = (id) => document.getElementById(id);

// ---------- formatting ----------
function fmtTime(iso) {
  if (!iso) return "—";
  const d = new Date(iso);
  if (Number.isNaN(d.getTime())) return String(iso);
  return d.toISOString().replace("T", " ").replace(/\.000Z$/, "Z").replace(/\.(\d+)Z$/, ".$1Z");
}
function fmtDuration(ms) {
  if (ms === null || ms === undefined || Number.isNaN(ms)) return "—";
  const neg = ms < 0;
  let s = Math.round(Math.abs(ms) / 1000);
  const parts = [];
  for (const [unit, n] of [["d", 86400], ["h", 3600], ["m", 60]]) {
    if (s >= n) { parts.push(Math.floor(s / n) + unit); s %= n; }
  }
  if (s || !parts.length) parts.push(s + "s");
  return (neg ? "-" : "") + parts.slice(0, 2).join(" ");
}
function nowMs() {
  // Now on the server's wall clock (this browser's clock, corrected by the skew the last
  // answer showed): ages go on while the fleet is quiet.
  return Date.now() + state.skewMs;
}
function age(iso) {
  if (!iso) return null;
  const t = new Date(iso).getTime();
  return Number.isNaN(t) ? null : nowMs() - t;
}

// ---------- tokens ----------
function readToken() { return sessionStorage.getItem("vigil.readToken") || ""; }
function writeToken() { return sessionStorage.getItem("vigil.writeToken") || ""; }
function setStreamCookie(token) {
  // EventSource cannot send headers: the stream endpoint accepts this cookie instead. It is
  // sent to /api/ paths only, and never cross-site.
  const value = token ? encodeURIComponent(token) : "";
  const expiry = token ? "" : "; max-age=0";
  document.cookie = `vigil_console_token=${value}; path=/api/; SameSite=Strict${expiry}`;
}
function initTokens() {
  $("read-token").value = readToken();
  $("write-token").value = writeToken();
  $("reviewer-default").value = sessionStorage.getItem("vigil.reviewer") || "";
  setStreamCookie(readToken());
  $("token-form").addEventListener("submit", (e) => {
    e.preventDefault();
    sessionStorage.setItem("vigil.readToken", $("read-token").value.trim());
    sessionStorage.setItem("vigil.writeToken", $("write-token").value.trim());
    sessionStorage.setItem("vigil.reviewer", $("reviewer-default").value.trim());
    setStreamCookie(readToken());
    hideBanner();
    connectStream();
    refreshAll();
  });
}

function showBanner(text) { const b = $("banner"); b.textContent = text; b.hidden = false; }
function hideBanner() { $("banner").hidden = true; }

// ---------- API ----------
class ApiError extends Error {
  constructor(status, message) { super(message); this.status = status; }
}
async function api(path, options = {}) {
  const headers = Object.assign({ Accept: "application/json" }, options.headers || {});
  if (!headers.Authorization && readToken()) headers.Authorization = `Bearer ${readToken()}`;
  const resp = await fetch(path, Object.assign({}, options, { headers, credentials: "same-origin" }));
  let body = null;
  try { body = await resp.json(); } catch (_) { body = null; }
  if (!resp.ok) {
    const msg = (body && (body.error || body.message)) || `${resp.status} ${resp.statusText}`;
    if (resp.status === 401 && !options.write) {
      $("tokens").open = true;
      showBanner("The console wants a read token: paste it under Tokens.");
    }
    throw new ApiError(resp.status, msg);
  }
  noteAsOf(body);
  return body;
}
function noteAsOf(body) {
  // event_time: the newest record's time (the stream time); fresh_at: when the view last
  // held every record the topics held (its freshness, what "as of" says); now: the
  // server's clock, ages are measured from it.
  const asOf = body && body.as_of;
  if (!asOf) return;
  const t = asOf.event_time;
  if (t && (!state.eventTime || new Date(t) > new Date(state.eventTime))) state.eventTime = t;
  if ("fresh_at" in asOf) state.freshAt = asOf.fresh_at;
  const now = asOf.now ? new Date(asOf.now).getTime() : NaN;
  if (!Number.isNaN(now)) state.skewMs = now - Date.now();
}
async function listAll(path) {
  const items = [];
  let cursor = null;
  for (let page = 0; page < MAX_PAGES; page++) {
    const sep = path.includes("?") ? "&" : "?";
    const url = `${path}${sep}limit=${PAGE_LIMIT}` + (cursor ? `&cursor=${encodeURIComponent(cursor)}` : "");
    const body = await api(url);
    items.push(...(body.items || []));
    cursor = body.next_cursor;
    if (!cursor) return items;
  }
  state.truncated = true;
  return items;
}
function totalLag(body) {
  // The answer's total "lag" (null while a partition's end is not known yet); without a
  // total, the sum of the rows' "lag".
  if (body === null || typeof body !== "object") return 0;
  if ("lag" in body) return typeof body.lag === "number" ? body.lag : null;
  let sum = 0;
  for (const v of Object.values(body)) if (v && typeof v === "object") sum += totalLag(v);
  return sum;
}

// ---------- fetching ----------
const fetchers = {
  async approvals() {
    const lists = await Promise.all(
      ATTENTION_VERDICTS.map((v) => listAll(`/api/approvals?verdict=${v}&open=true`)));
    state.approvals = lists.flat();
  },
  async operations() {
    const lists = await Promise.all(REVIEWABLE.map((s) => listAll(`/api/operations?status=${s}`)));
    state.operations = lists.flat();
  },
  async workItems() { state.workItems = await listAll("/api/work-items?open=true"); },
  async alerts() { state.alerts = await listAll("/api/alerts?status=FIRING"); },
  async summary() { state.summary = await api("/api/summary"); },
  async lag() { state.lag = totalLag(await api("/api/lag")); },
};
const KIND_FETCHERS = {
  approval: ["approvals", "alerts"],
  operation: ["operations", "workItems", "alerts"],
  work_item: ["workItems", "operations"],
  alert: ["alerts"],
  execution: [],
};

let inflight = Promise.resolve();
function run(names, alsoExecution) {
  // Serialised, so two refreshes never interleave their renders.
  inflight = inflight.then(async () => {
    state.truncated = false;
    const results = await Promise.allSettled(
      [...new Set([...names, "summary", "lag"])].map((n) => fetchers[n]()));
    if (alsoExecution && state.execution) await loadExecution(state.execution.id);
    const failed = results.find((r) => r.status === "rejected");
    if (failed && !(failed.reason instanceof ApiError && failed.reason.status === 401)) {
      showBanner(`Could not read the console: ${failed.reason.message}`);
    } else if (!failed) {
      hideBanner();
    }
    render();
  }).catch((e) => showBanner(`Page error: ${e.message}`));
  return inflight;
}
function refreshFreshness() {
  if (document.hidden) return;
  fetchers.lag().then(renderFreshness, () => {});
}
function refreshAll() { return run(Object.keys(fetchers), true); }

let pendingKinds = new Set();
let pendingExecutions = new Set();
let debounce = null;
function onChanges(changes) {
  for (const c of changes) {
    pendingKinds.add(c.kind);
    if (c.execution_id) pendingExecutions.add(c.execution_id);
  }
  if (debounce) return;
  debounce = setTimeout(() => {
    debounce = null;
    const names = new Set();
    for (const k of pendingKinds) for (const n of KIND_FETCHERS[k] || Object.keys(fetchers)) names.add(n);
    const touchesExecution = state.execution && pendingExecutions.has(state.execution.id);
    pendingKinds = new Set();
    pendingExecutions = new Set();
    run([...names], touchesExecution);
  }, 200);
}

// ---------- live stream ----------
let source = null;
function connectStream() {
  if (source) source.close();
  source = new EventSource("/api/stream");
  source.addEventListener("hello", () => { setLive(true); refreshAll(); });
  source.addEventListener("change", (e) => {
    let changes = [];
    try { changes = JSON.parse(e.data); } catch (_) { changes = []; }
    onChanges(Array.isArray(changes) ? changes : [changes]);
  });
  source.onerror = () => setLive(false); // EventSource reconnects on its own
}
function setLive(on) {
  const l = $("live");
  l.className = "live " + (on ? "on" : "off");
  l.textContent = on ? "live" : "offline";
}

// ---------- needs attention ----------
// Operation and request ids repeat across executions: an alert is about a subject of one
// execution.
function alertFor(executionId, subjectId) {
  return state.alerts.filter((a) => a.subject_id === subjectId && a.execution_id === executionId);
}
function scopedKey(executionId, id) {
  return `${encodeURIComponent(executionId)}/${encodeURIComponent(id)}`;
}
function attentionItems() {
  const items = [];
  for (const a of state.approvals) {
    const id = a.request_id || a.id;
    const alerts = alertFor(a.execution_id, id);
    items.push({
      kind: "approval", id, executionId: a.execution_id, owner: a.owner || "UNRECOGNIZED",
      label: a.verdict, bad: true, since: a.started_at || a.requested_at || a.evaluated_at,
      nextStep: a.next_step, proofs: a.failed_proofs || [], thresholds: a.thresholds,
      evidence: alerts.flatMap((x) => x.evidence || []),
      facts: [["action", a.action], ["previous verdict", a.previous_verdict],
        ["evaluated", fmtTime(a.evaluated_at)]],
    });
  }
  const opOwner = {};
  for (const o of state.operations) {
    opOwner[scopedKey(o.execution_id, o.operation_id)] = o.owner;
    const alerts = alertFor(o.execution_id, o.operation_id);
    const alertStep = alerts.map((x) => x.next_step).find(Boolean);
    items.push({
      kind: "operation", id: o.operation_id, executionId: o.execution_id,
      owner: o.owner || "UNRECOGNIZED", label: o.status, bad: o.status === "UNKNOWN",
      since: o.since, op: o,
      nextStep: o.next_step || alertStep || defaultOperationStep(o.status),
      proofs: [],
      evidence: [o.reason, ...alerts.flatMap((x) => x.evidence || [])].filter(Boolean),
      facts: [["connector", o.connector], ["attempt", o.attempt], ["retry", o.retry],
        ["reply due", o.reply_due_at && fmtTime(o.reply_due_at)],
        ["verify due", o.verify_due_at && fmtTime(o.verify_due_at)],
        ["work item", o.open_work_item_id]],
    });
  }
  const now = nowMs();
  for (const w of state.workItems) {
    if (new Date(w.deadline).getTime() > now) continue; // only overdue ones
    items.push({
      kind: "work_item", id: w.work_item_id, executionId: w.execution_id,
      owner: w.owner || opOwner[scopedKey(w.execution_id, w.operation_id)] || "OPERATOR",
      label: `OVERDUE ${w.kind}`,
      bad: false, since: w.deadline,
      nextStep: w.next_step || "Reconcile the operation at its connector and record the outcome.",
      proofs: [], evidence: [],
      facts: [["operation", w.operation_id], ["connector", w.connector], ["attempt", w.attempt],
        ["deadline", fmtTime(w.deadline)], ["created", fmtTime(w.created_at)]],
    });
  }
  return items;
}
function defaultOperationStep(status) {
  if (status === "MANUAL_REVIEW") return "Check at the connector whether the effect happened, then record Verified or Failed.";
  return "Do not retry: check at the connector whether the effect happened, then take it into review.";
}
function applyFilters(items) {
  const f = state.filters;
  const text = f.text.trim().toLowerCase();
  return items.filter((i) =>
    (!f.owner || i.owner === f.owner) && (!f.kind || i.kind === f.kind) &&
    (!text || [i.id, i.executionId, i.label].some((s) => String(s || "").toLowerCase().includes(text))));
}
function byOwner(items) {
  const t = (i) => (i.since ? new Date(i.since).getTime() : Infinity);
  const groups = new Map();
  for (const i of [...items].sort((a, b) => t(a) - t(b))) {
    if (!groups.has(i.owner)) groups.set(i.owner, []);
    groups.get(i.owner).push(i);
  }
  return groups; // insertion order: the owner with the oldest item first
}

function renderFilters(all) {
  const owners = [...new Set(all.map((i) => i.owner))].sort();
  const sel = (id, label, options, value, key) => el("label", {}, label + " ",
    el("select", { id, onchange: (e) => { state.filters[key] = e.target.value; render(); } },
      options.map(([v, text]) => el("option", v === value ? { value: v, selected: "selected" } : { value: v }, text))));
  return el("div", { class: "filters" },
    sel("filter-owner", "Owner", [["", "all"], ...owners.map((o) => [o, o])], state.filters.owner, "owner"),
    sel("filter-kind", "Kind", [["", "all"], ["approval", "approval waits"], ["operation", "operations"], ["work_item", "overdue work items"]], state.filters.kind, "kind"),
    el("label", {}, "Contains ", el("input", {
      id: "filter-text", value: state.filters.text, placeholder: "id or status",
      oninput: (e) => { state.filters.text = e.target.value; renderAttentionList(); },
    })),
    el("span", { class: "muted", id: "attention-count" }));
}

function renderAttention(main) {
  const all = attentionItems();
  main.append(renderFilters(all), el("div", { id: "attention" }));
  renderAttentionList();
}
function renderAttentionList() {
  const box = $("attention");
  if (!box) return;
  const all = attentionItems();
  const shown = applyFilters(all);
  $("attention-count").textContent = `${shown.length} of ${all.length} need attention` +
    (state.truncated ? " (lists truncated)" : "");
  box.replaceChildren();
  if (!shown.length) { box.append(el("p", { class: "empty" }, "Nothing needs attention.")); return; }
  for (const [owner, items] of byOwner(shown)) {
    box.append(el("section", { class: "owner-group", "data-owner": owner },
      el("h2", {}, owner, " ", el("span", { class: "muted" }, `(${items.length})`)),
      items.map(renderItem)));
  }
}

function renderItem(i) {
  const ago = age(i.since);
  return el("article", { class: "item" + (i.bad ? " sev-bad" : ""), "data-kind": i.kind, "data-id": i.id },
    el("div", { class: "head" },
      el("span", { class: "badge" + (i.bad ? " bad" : "") }, i.label),
      el("span", { class: "id" }, i.id),
      el("a", { href: `#/executions/${encodeURIComponent(i.executionId)}` }, i.executionId),
      el("span", { class: "muted" }, `since ${fmtTime(i.since)} `,
        el("span", { class: "age", "data-since": i.since }, ago !== null ? `(${fmtDuration(ago)} ago)` : ""))),
    el("dl", {},
      el("dt", {}, "next step"), el("dd", { class: "next-step" }, i.nextStep || "—"),
      i.proofs.length ? [el("dt", {}, "failed proofs"), el("dd", {}, el("ul", { class: "proofs" },
        i.proofs.map((p) => el("li", {}, el("b", {}, p.proof), ` ${p.state}: ${p.reason}`))))] : null,
      i.evidence.length ? [el("dt", {}, "evidence"), el("dd", {}, el("ul", { class: "proofs" },
        i.evidence.map((e) => el("li", {}, e))))] : null,
      i.thresholds ? [el("dt", {}, "thresholds"), el("dd", {}, thresholdText(i.thresholds))] : null,
      i.facts.filter(([, v]) => v !== null && v !== undefined && v !== "").map(([k, v]) =>
        [el("dt", {}, k), el("dd", {}, String(v))])),
    i.op && REVIEWABLE.includes(i.op.status) ? reviewControls(i.op) : null);
}
function thresholdText(t) {
  return Object.entries(t).map(([k, v]) =>
    k.endsWith("_ms") ? `${k.slice(0, -3).replaceAll("_", " ")} ${fmtDuration(v)}`
      : `${k.replaceAll("_", " ")} ${k.endsWith("_at") ? fmtTime(v) : v}`).join(" · ");
}

// ---------- manual review ----------
function reviewControls(op) {
  const key = scopedKey(op.execution_id, op.operation_id);
  const saved = state.reviewNotes[key] || {};
  const note = el("input", { class: "note", placeholder: "what the source says", "aria-label": "review note",
    value: saved.note || "", oninput: (e) => { (state.reviewNotes[key] ||= {}).note = e.target.value; } });
  const reviewer = el("input", { class: "reviewer", placeholder: "reviewer", "aria-label": "reviewer",
    value: sessionStorage.getItem("vigil.reviewer") || "" });
  const result = el("span", { class: "review-result " + (saved.cls || ""), role: "status" }, saved.result || "");
  const act = (action) => async (e) => {
    const buttons = e.target.parentElement.querySelectorAll("button");
    buttons.forEach((b) => { b.disabled = true; });
    const who = reviewer.value.trim();
    if (who) sessionStorage.setItem("vigil.reviewer", who);
    const outcome = await review(op, action, note.value, who);
    state.reviewNotes[key] = Object.assign(state.reviewNotes[key] || {}, outcome);
    result.className = "review-result " + outcome.cls;
    result.textContent = outcome.result;
    buttons.forEach((b) => { b.disabled = false; });
  };
  return el("div", { class: "review" },
    note, reviewer,
    el("button", { type: "button", class: "take", onclick: act("take"), disabled: op.status !== "UNKNOWN" }, "Take into review"),
    el("button", { type: "button", class: "verified", onclick: act("verified") }, "Verified"),
    el("button", { type: "button", class: "failed", onclick: act("failed") }, "Failed"),
    result);
}
async function review(op, action, note, reviewer) {
  if (!writeToken()) {
    $("tokens").open = true;
    return { result: "Paste the write token under Tokens first.", cls: "refused" };
  }
  try {
    const path = `/api/executions/${encodeURIComponent(op.execution_id)}` +
      `/operations/${encodeURIComponent(op.operation_id)}/review`;
    const body = await api(path, {
      method: "POST", write: true,
      headers: { "Content-Type": "application/json", Authorization: `Bearer ${writeToken()}` },
      body: JSON.stringify({ action, note, reviewer, attempt: op.attempt ?? null }),
    });
    const msg = (body && (body.message || body.status)) || "published";
    return { result: `${msg} — the page shows the outcome once the pipeline applies it.`, cls: "sent" };
  } catch (e) {
    return { result: `Refused: ${e.message}`, cls: "refused" };
  }
}

// ---------- fleet summary ----------
function renderSummaryBar() {
  const box = $("summary");
  box.replaceChildren();
  const s = state.summary;
  if (!s) return;
  for (const [key, value] of Object.entries(s)) {
    if (key === "as_of") continue;
    const title = key.replaceAll("_", " ");
    if (value && typeof value === "object") {
      const entries = Object.entries(value).filter(([, n]) => typeof n === "number");
      if (!entries.length) continue;
      box.append(el("div", { class: "group", "data-summary": key }, el("h3", {}, title),
        entries.map(([k, n]) => el("span", { class: "count", "data-key": k }, `${k} `, el("b", {}, n)))));
    } else if (typeof value === "number") {
      box.append(el("div", { class: "group", "data-summary": key }, el("h3", {}, title),
        el("span", { class: "count" }, el("b", {}, value))));
    }
  }
}
function renderFleet(main) {
  const s = state.summary || {};
  main.append(el("h2", {}, "Fleet"));
  for (const [key, value] of Object.entries(s)) {
    if (key === "as_of" || !value || typeof value !== "object") continue;
    main.append(el("h3", {}, key.replaceAll("_", " ")), el("table", {},
      el("thead", {}, el("tr", {}, el("th", {}, "value"), el("th", {}, "count"))),
      el("tbody", {}, Object.entries(value).map(([k, n]) =>
        el("tr", {}, el("td", { class: "mono" }, k), el("td", {}, typeof n === "object" ? JSON.stringify(n) : n))))));
  }
}

function renderFreshness() {
  const f = $("freshness");
  const lag = state.lag === null ? "—" : state.lag;
  const asOf = state.freshAt ? fmtTime(state.freshAt) : "— (catching up)";
  f.textContent = `as of ${asOf} · lag ${lag} · stream time ${fmtTime(state.eventTime)}`;
  // ages go on between renders: each is measured from now again
  for (const span of document.querySelectorAll(".age[data-since]")) {
    const ago = age(span.dataset.since);
    span.textContent = ago !== null ? `(${fmtDuration(ago)} ago)` : "";
  }
  f.classList.toggle("behind", typeof state.lag === "number" && state.lag > 0);
}

// ---------- one execution ----------
async function loadExecution(id) {
  const path = `/api/executions/${encodeURIComponent(id)}`;
  try {
    const [detail, timeline] = await Promise.all([api(path), api(`${path}/timeline`)]);
    state.execution = { id, detail, timeline: timeline.items || timeline.timeline || [] };
  } catch (e) {
    state.execution = { id, error: e.status === 404 ? `No execution ${id} in the view.` : e.message };
  }
}
function table(columns, rows) {
  if (!rows || !rows.length) return el("p", { class: "empty" }, "none");
  return el("table", {},
    el("thead", {}, el("tr", {}, columns.map(([, title]) => el("th", {}, title)))),
    el("tbody", {}, rows.map((r) => el("tr", {}, columns.map(([k, , f]) =>
      el("td", { class: k.endsWith("_id") ? "mono" : null }, f ? f(r[k], r) : (r[k] ?? "—")))))));
}
// vigil reconcile's progress on a work item: its state, every check with its finding, and
// when the next one is due
function reconcilerCell(r) {
  if (!r) return "—";
  const next = r.next_check_at ? ` · next check ${fmtTime(r.next_check_at)}` : "";
  return el("div", { class: "reconciler" },
    el("span", { class: "badge" }, r.state), next, r.note ? ` · ${r.note}` : "",
    el("ol", {}, (r.checks || []).map((c) =>
      el("li", {}, `${fmtTime(c.at)} ${c.finding}${c.detail ? ` (${c.detail})` : ""}` +
        `${c.effect_ref ? ` ref ${c.effect_ref}` : ""} · ${c.latency_ms} ms`))));
}
function renderExecution(main) {
  const ex = state.execution;
  if (!ex) return;
  main.append(el("h2", {}, "Execution ", el("span", { class: "mono" }, ex.id)));
  if (!ex.detail && !ex.error) { main.append(el("p", { class: "empty" }, "Loading…")); return; }
  if (ex.error) { main.append(el("p", { class: "empty" }, ex.error)); return; }
  const d = ex.detail || {};
  const row = d.execution || d;
  main.append(el("p", { id: "execution-status" },
    el("span", { class: "badge" + (row.terminal ? " ok" : "") }, row.status || "—"),
    ` since ${fmtTime(row.since)} · last event ${fmtTime(row.last_event_at)}`,
    row.terminal ? " · terminal" : ""));
  const ops = d.operations || [];
  main.append(el("h3", {}, "Operations"), table([
    ["operation_id", "operation"], ["attempt", "attempt"], ["connector", "connector"],
    ["status", "status", (v) => el("span", { class: "badge" + (v === "UNKNOWN" ? " bad" : SETTLED.includes(v) ? " ok" : "") }, v)],
    ["retry", "retry"], ["since", "since", fmtTime], ["owner", "owner"],
    ["reason", "reason"],
  ], ops));
  for (const op of ops.filter((o) => REVIEWABLE.includes(o.status))) {
    main.append(el("div", { class: "item", "data-kind": "operation", "data-id": op.operation_id },
      el("span", { class: "id" }, op.operation_id), reviewControls(op)));
  }
  main.append(el("h3", {}, "Approvals"), table([
    ["request_id", "request"], ["verdict", "verdict"], ["owner", "owner"],
    ["next_step", "next step"], ["evaluated_at", "evaluated", fmtTime],
  ], d.approvals));
  main.append(el("h3", {}, "Work items"), table([
    ["work_item_id", "work item"], ["kind", "kind"], ["operation_id", "operation"],
    ["deadline", "deadline", fmtTime], ["next_step", "next step"],
    ["reconciler", "reconciler", reconcilerCell],
  ], d.work_items));
  main.append(el("h3", {}, "Alerts"), table([
    ["alert_id", "alert"], ["kind", "kind"], ["status", "status"], ["severity", "severity"],
    ["owner", "owner"], ["next_step", "next step"], ["occurred_at", "at", fmtTime],
  ], d.alerts));
  main.append(el("h3", {}, "Timeline"), table([
    ["at", "at", fmtTime], ["kind", "kind"], ["id", "id"], ["summary", "summary"],
  ], ex.timeline));
}

// ---------- routing ----------
function route() {
  const m = location.hash.match(/^#\/executions\/(.+)$/);
  if (m) return { name: "execution", id: decodeURIComponent(m[1]) };
  if (location.hash === "#/fleet") return { name: "fleet" };
  return { name: "attention" };
}
function render() {
  renderFreshness();
  renderSummaryBar();
  const r = route();
  $("nav-attention").classList.toggle("current", r.name === "attention");
  $("nav-fleet").classList.toggle("current", r.name === "fleet");
  // keep the focus and caret of a field being typed in across a live re-render
  const active = document.activeElement;
  const activeKey = active && active.closest && active.closest("[data-id]") ?
    [active.closest("[data-id]").getAttribute("data-id"), active.className] : null;
  const main = $("main");
  main.replaceChildren();
  if (r.name === "execution") renderExecution(main);
  else if (r.name === "fleet") renderFleet(main);
  else renderAttention(main);
  if (activeKey) {
    const box = [...main.querySelectorAll("[data-id]")].find((n) => n.getAttribute("data-id") === activeKey[0]);
    const field = box && [...box.querySelectorAll("input")].find((n) => n.className === activeKey[1]);
    if (field) field.focus();
  } else if (active && active.id) {
    const same = document.getElementById(active.id);
    if (same && same !== active) same.focus();
  }
}
async function onRoute() {
  const r = route();
  if (r.name === "execution") {
    state.execution = { id: r.id };
    render();
    await loadExecution(r.id);
  } else {
    state.execution = null;
  }
  render();
}

document.addEventListener("DOMContentLoaded", () => {
  initTokens();
  $("open-execution").addEventListener("submit", (e) => {
    e.preventDefault();
    const id = $("execution-input").value.trim();
    if (id) location.hash = `#/executions/${encodeURIComponent(id)}`;
  });
  window.addEventListener("hashchange", onRoute);
  onRoute();
  connectStream();
  // The view can catch up on records that change nothing the page shows (no SSE change):
  // the freshness indicator is re-read on its own every few seconds.
  setInterval(refreshFreshness, LAG_EVERY_MS);
});
