// vigil console page: reads the console's JSON API, follows /api/stream (SSE) and refetches
// what a change names. No build step, no library. Every value from the API goes into the DOM
// as text (textContent / setAttribute through el()), never as markup.
//
// Table-first: every list is one page of rows the server filtered, sorted and counted
// (/api/<list>?filters&sort&limit&cursor answers with its total), so the page never holds
// more than a page, whatever the fleet's size. The URL's hash is the whole query
// (#/list/<name>?filter=value&sort=...&cursor=...): a link or a reload shows the same rows.
"use strict";

const PAGE_SIZE = 50;
const LAG_EVERY_MS = 5000;
// lists re-read on their own this often: a work item becomes overdue with no record applied
const LIST_EVERY_MS = 30000;
const SUMMARY_EVERY_MS = 1000; // the summary at most this often while changes stream in
const SEARCH_DEBOUNCE_MS = 80;
const SETTLED = ["VERIFIED", "FAILED", "CANCELLED"];
// attempt statuses a person settles; RECONCILING is the reconciler's, reviewable too
const REVIEWABLE = ["UNKNOWN", "MANUAL_REVIEW", "RECONCILING"];
const SEVERITY_CLASS = { CRITICAL: "sev-critical", WARNING: "sev-warning", INFO: "sev-info" };

const state = {
  lists: null, // /api/lists: every list's filters, allowed values, defaults and sorts
  list: null, // {name, query, body} of the list shown
  summary: null,
  eventTime: null,
  freshAt: null,
  skewMs: 0,
  lag: null,
  cursors: {}, // list query without its cursor -> the cursors of the pages before this one
  execution: null, // {id, detail, timeline} on an execution page
  drawer: null, // {target, detail} of the details drawer
  reviewNotes: {}, // review target key -> {note, result, cls}: kept across re-renders
  firstRowsMarked: false,
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
function fmtCount(n) { return typeof n === "number" ? n.toLocaleString("en-US") : "—"; }
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
function ageText(iso) {
  const ago = age(iso);
  return ago === null ? "—" : `${fmtDuration(ago)} ago`;
}
// an age that runs on between renders (renderFreshness measures it from now again)
function ageNode(iso) {
  return el("span", { class: "age", "data-since": iso || null, title: fmtTime(iso) }, ageText(iso));
}
function badge(text, cls) { return el("span", { class: "badge" + (cls ? " " + cls : "") }, text); }
function severityBadge(sev) {
  return el("span", { class: "sev " + (SEVERITY_CLASS[sev] || "sev-other"), "data-severity": sev || "" }, sev || "—");
}
function statusClass(v) {
  if (v === "UNKNOWN" || v === "FIRING") return "bad";
  if (SETTLED.includes(v) || v === "RESOLVED" || v === "CLOSED") return "ok";
  return "";
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
function totalLag(body) {
  // The answer's total "lag" (null while a partition's end is not known yet); without a
  // total, the sum of the rows' "lag".
  if (body === null || typeof body !== "object") return 0;
  if ("lag" in body) return typeof body.lag === "number" ? body.lag : null;
  let sum = 0;
  for (const v of Object.values(body)) if (v && typeof v === "object") sum += totalLag(v);
  return sum;
}
function scopedKey(executionId, id) {
  return `${encodeURIComponent(executionId)}/${encodeURIComponent(id)}`;
}

// ---------- routes: the hash is the whole query ----------
// #/ (or #/attention), #/alerts, #/list/<name>: a list, with its filters, sort and cursor as
// the hash's query string; #/executions/<id>: one execution.
function route() {
  const hash = location.hash.replace(/^#/, "") || "/";
  const q = hash.indexOf("?");
  const path = q < 0 ? hash : hash.slice(0, q);
  const params = new URLSearchParams(q < 0 ? "" : hash.slice(q + 1));
  let m = path.match(/^\/executions\/(.+)$/);
  if (m) return { name: "execution", id: decodeURIComponent(m[1]) };
  if (path === "/" || path === "/attention" || path === "") return { name: "list", list: "attention", params };
  if (path === "/alerts") return { name: "list", list: "alerts", params };
  m = path.match(/^\/list\/([a-z-]+)$/);
  if (m && LIST_VIEWS[m[1]]) return { name: "list", list: m[1], params };
  if (path === "/fleet") return { name: "list", list: "executions", params };
  return { name: "list", list: "attention", params };
}
function listPath(name) {
  if (name === "attention") return "#/";
  if (name === "alerts") return "#/alerts";
  return `#/list/${name}`;
}
function listHref(name, params) {
  const p = new URLSearchParams();
  for (const [k, v] of Object.entries(params || {})) if (v !== null && v !== undefined && v !== "") p.set(k, v);
  const q = p.toString();
  return listPath(name) + (q ? `?${q}` : "");
}
function executionHref(id) { return `#/executions/${encodeURIComponent(id)}`; }

// ---------- the lists: columns of each table ----------
function execLink(id) {
  return id ? el("a", { class: "mono", href: executionHref(id), onclick: (e) => e.stopPropagation() }, id) : "—";
}
function attemptText(id, attempt) { return attempt ? `${id} #${attempt}` : id; }
function reviewButton(target) {
  return el("button", {
    type: "button", class: "open-review",
    onclick: (e) => { e.stopPropagation(); openDrawer(target, true); },
  }, "Review");
}
// What a row of each list opens in the drawer, and whether it carries a review action.
function operationTargets(op) {
  // Every attempt of the operation a person may settle: when the row lists every attempt
  // the view knows of (attempts), each one needing reconciliation or with an open work item;
  // else from its state: the latest while it is not settled and needs reconciliation (or
  // has an open work item), and the older attempt that holds its retry verdict while that
  // one is open too.
  const out = [];
  if (Array.isArray(op.attempts) && op.attempts.length) {
    for (const a of op.attempts) {
      if (SETTLED.includes(a.status) || !(REVIEWABLE.includes(a.status) || a.open_work_item_id)) continue;
      out.push({ kind: "operation", executionId: op.execution_id, operationId: op.operation_id,
        id: op.operation_id, attempt: a.attempt, status: a.status, holds: a.attempt !== op.attempt, item: op });
    }
    return out;
  }
  // (open_work_item_id names the operation's open work item, of whichever attempt)
  if (!SETTLED.includes(op.status) && (REVIEWABLE.includes(op.status) || op.open_work_item_id)) {
    out.push({ kind: "operation", executionId: op.execution_id, operationId: op.operation_id,
      id: op.operation_id, attempt: op.attempt, status: op.status, item: op });
  }
  const sameExecution = !op.held_by_execution_id || op.held_by_execution_id === op.execution_id;
  if (op.held_by_operation_id === op.operation_id && sameExecution && op.held_by_attempt &&
      op.held_by_attempt !== op.attempt && op.held_by_status && !SETTLED.includes(op.held_by_status)) {
    out.push({ kind: "operation", executionId: op.execution_id, operationId: op.operation_id,
      id: op.operation_id, attempt: op.held_by_attempt, status: op.held_by_status, holds: true, item: op });
  }
  return out;
}
function openAttempts(detail, operationId) {
  // Every open attempt of an operation the execution's detail knows: those of its state
  // (operationTargets), and the attempt of each open work item of it (an older attempt the
  // state no longer describes).
  const op = ((detail && detail.operations) || []).find((o) => o.operation_id === operationId);
  const out = op ? operationTargets(op) : [];
  for (const w of (detail && detail.work_items) || []) {
    if (w.operation_id !== operationId || !w.open || out.some((t) => t.attempt === w.attempt)) continue;
    out.push({ kind: "operation", executionId: w.execution_id, operationId, id: operationId,
      attempt: w.attempt, status: null, workItem: w.work_item_id, item: op || w });
  }
  return out;
}
function workItemTarget(w) {
  return { kind: "work_item", executionId: w.execution_id, operationId: w.operation_id,
    id: w.work_item_id, attempt: w.attempt, status: null, item: w, open: !!w.open };
}

const LIST_VIEWS = {
  attention: {
    title: "Needs attention",
    sort: "severity",
    empty: "Nothing needs attention.",
    kinds: ["approval", "operation", "work_item"],
    target: (i) => ({
      kind: i.kind, executionId: i.execution_id, operationId: i.operation_id, id: i.subject_id,
      attempt: i.attempt, status: i.kind === "operation" ? i.label : null, item: i.record,
      attention: i, holds: !!(i.record && i.record.holds_retry), open: true,
    }),
    rowKey: (i) => `${i.kind}|${scopedKey(i.execution_id, i.subject_id)}|${i.attempt || ""}`,
    columns: [
      ["severity", (i) => severityBadge(i.severity)],
      ["verdict", (i) => badge(i.label, statusClass(i.label) || (i.kind === "approval" ? "bad" : ""))],
      ["what", (i) => el("span", {}, el("span", { class: "muted" }, i.kind.replace("_", " "), " "),
        el("span", { class: "id" }, i.kind === "work_item" ? i.subject_id : attemptText(i.subject_id, i.attempt)),
        i.kind === "work_item" ? el("span", { class: "muted" }, ` for ${attemptText(i.operation_id, i.attempt)}`) : null)],
      ["execution", (i) => execLink(i.execution_id)],
      ["owner", (i) => i.owner],
      ["age", (i) => ageNode(i.since)],
      ["next step", (i) => el("span", { class: "next-step" }, i.next_step || "—")],
      ["", (i, t) => (t.kind === "operation" || t.kind === "work_item" ? reviewButton(t) : null)],
    ],
  },
  alerts: {
    title: "Alerts and anomalies",
    sort: "severity",
    empty: "No alert matches.",
    target: (a) => ({ kind: "alert", executionId: a.execution_id, id: a.alert_id, item: a }),
    rowKey: (a) => a.alert_id,
    columns: [
      ["severity", (a) => severityBadge(a.severity)],
      ["status", (a) => badge(a.firing ? "FIRING" : "RESOLVED", a.firing ? "bad" : "ok")],
      ["kind", (a) => a.kind],
      ["subject", (a) => el("span", { class: "id" }, a.subject_id)],
      ["verdict", (a) => a.verdict || "—"],
      ["execution", (a) => execLink(a.execution_id)],
      ["owner", (a) => a.owner],
      ["age", (a) => ageNode(a.occurred_at)],
      ["next step", (a) => el("span", { class: "next-step" }, a.next_step || "—")],
    ],
  },
  executions: {
    title: "Executions",
    empty: "No execution matches.",
    target: (x) => ({ kind: "execution", executionId: x.execution_id, id: x.execution_id, item: x }),
    rowKey: (x) => x.execution_id,
    columns: [
      ["status", (x) => badge(x.status, x.terminal ? "ok" : "")],
      ["execution", (x) => execLink(x.execution_id)],
      ["age", (x) => ageNode(x.since)],
      ["last event", (x) => fmtTime(x.last_event_at)],
      ["open operations", (x) => (x.open_operation_ids || []).length],
      ["open approvals", (x) => (x.open_approval_ids || []).length],
      ["terminal", (x) => (x.terminal ? "yes" : "no")],
    ],
  },
  operations: {
    title: "Operations",
    empty: "No operation matches.",
    target: (o) => operationTargets(o)[0] ||
      { kind: "operation", executionId: o.execution_id, operationId: o.operation_id, id: o.operation_id, attempt: o.attempt, status: o.status, item: o },
    rowKey: (o) => scopedKey(o.execution_id, o.operation_id),
    columns: [
      ["status", (o) => badge(o.status, statusClass(o.status))],
      ["operation", (o) => el("span", { class: "id" }, attemptText(o.operation_id, o.attempt))],
      ["execution", (o) => execLink(o.execution_id)],
      ["connector", (o) => o.connector],
      ["owner", (o) => o.owner || "—"],
      ["retry", (o) => o.retry + (o.held_by_attempt ? ` (held by #${o.held_by_attempt} ${o.held_by_status || ""})` : "")],
      ["age", (o) => ageNode(o.since)],
      ["", (o) => (operationTargets(o).length ? reviewButton(operationTargets(o)[0]) : null)],
    ],
  },
  approvals: {
    title: "Approvals",
    empty: "No approval matches.",
    target: (a) => ({ kind: "approval", executionId: a.execution_id, id: a.request_id, item: a }),
    rowKey: (a) => scopedKey(a.execution_id, a.request_id),
    columns: [
      ["verdict", (a) => badge(a.verdict, a.open ? "" : "ok")],
      ["request", (a) => el("span", { class: "id" }, a.request_id)],
      ["execution", (a) => execLink(a.execution_id)],
      ["owner", (a) => a.owner],
      ["action", (a) => a.action || "—"],
      ["age", (a) => ageNode(a.started_at)],
      ["next step", (a) => el("span", { class: "next-step" }, a.next_step || "—")],
      ["open", (a) => (a.open ? "open" : "closed")],
    ],
  },
  "work-items": {
    title: "Work items",
    empty: "No work item matches.",
    target: (w) => workItemTarget(w),
    rowKey: (w) => scopedKey(w.execution_id, w.work_item_id),
    columns: [
      ["state", (w) => workItemState(w)],
      ["kind", (w) => w.kind],
      ["work item", (w) => el("span", { class: "id" }, w.work_item_id)],
      ["operation", (w) => el("span", { class: "id" }, attemptText(w.operation_id, w.attempt))],
      ["execution", (w) => execLink(w.execution_id)],
      ["connector", (w) => w.connector],
      ["deadline", (w) => deadlineNode(w)],
      ["next step", (w) => el("span", { class: "next-step" }, w.next_step || "—")],
      ["", (w) => (w.open ? reviewButton(workItemTarget(w)) : null)],
    ],
  },
};
function workItemState(w) {
  if (w.open) {
    const overdue = new Date(w.deadline).getTime() <= nowMs();
    return badge(overdue ? "OPEN · OVERDUE" : "OPEN", overdue ? "bad" : "");
  }
  const r = w.resolution;
  return badge(r ? `CLOSED · ${r.outcome}` : "CLOSED", "ok");
}
function deadlineNode(w) {
  const left = new Date(w.deadline).getTime() - nowMs();
  const rel = Number.isNaN(left) ? "" : left <= 0 ? ` (${fmtDuration(-left)} overdue)` : ` (in ${fmtDuration(left)})`;
  return el("span", { title: fmtTime(w.deadline) }, fmtTime(w.deadline), w.open ? rel : "");
}
const SORT_NAMES = {
  severity: "severity, then age", age: "oldest first", "-age": "newest first", since: "oldest first",
  "-since": "newest first", occurred_at: "oldest first", "-occurred_at": "newest first",
  deadline: "deadline", created_at: "created", evaluated_at: "evaluated",
};
const APPROVAL_SORT_NAMES = { "-age": "oldest first", age: "newest first", evaluated_at: "evaluated" };
function sortName(list, sort) {
  if (list === "approvals" && APPROVAL_SORT_NAMES[sort]) return APPROVAL_SORT_NAMES[sort];
  return SORT_NAMES[sort] || sort;
}

// ---------- fetching ----------
function listQuery(r) {
  // the API query of a list route: its params as given, the page's own default sort
  const view = LIST_VIEWS[r.list];
  const p = new URLSearchParams(r.params);
  if (!p.has("sort") && view.sort) p.set("sort", view.sort);
  if (!p.has("limit")) p.set("limit", String(PAGE_SIZE));
  return p;
}
function withoutCursor(params) {
  const p = new URLSearchParams(params);
  p.delete("cursor");
  p.sort();
  return p.toString();
}
let listSeq = 0;
async function loadList(r) {
  const seq = ++listSeq;
  const query = listQuery(r);
  const body = await api(`/api/${r.list}?${query}`);
  if (seq !== listSeq) return false; // a newer query was asked for: its answer shows
  state.list = { name: r.list, query: query.toString(), params: r.params, body };
  return true;
}
async function loadSpecs() {
  if (!state.lists) state.lists = await api("/api/lists");
}
let summaryAt = 0;
async function loadSummary(force) {
  if (!force && Date.now() - summaryAt < SUMMARY_EVERY_MS) return;
  summaryAt = Date.now();
  state.summary = await api("/api/summary");
}
async function loadLag() { state.lag = totalLag(await api("/api/lag")); }

// Which lists a change of each kind can alter.
const KIND_LISTS = {
  approval: ["attention", "approvals"],
  operation: ["attention", "operations"],
  work_item: ["attention", "work-items"],
  alert: ["attention", "alerts"],
  execution: ["executions"],
};

let inflight = Promise.resolve();
function run(task) {
  // Serialised, so two refreshes never interleave their renders.
  inflight = inflight.then(task).catch((e) => {
    if (!(e instanceof ApiError && e.status === 401)) showBanner(`Could not read the console: ${e.message}`);
  });
  return inflight;
}
async function refresh({ list = true, summary = true, execution = true, drawer = true, force = false } = {}) {
  const r = route();
  const tasks = [loadLag()];
  if (summary) tasks.push(loadSummary(force));
  if (r.name === "list") {
    tasks.push(loadSpecs());
    if (list) tasks.push(loadList(r).then((shown) => { if (shown) renderList(); }));
  }
  if (execution && r.name === "execution") tasks.push(loadExecution(r.id).then(renderExecutionPage));
  if (drawer && state.drawer) tasks.push(loadDrawer());
  const results = await Promise.allSettled(tasks);
  const failed = results.find((x) => x.status === "rejected");
  if (failed && !(failed.reason instanceof ApiError && failed.reason.status === 401)) {
    showBanner(`Could not read the console: ${failed.reason.message}`);
  } else if (!failed) {
    hideBanner();
  }
  renderChrome();
}
function refreshAll() { return run(() => refresh({ force: true })); }
function refreshFreshness() {
  if (document.hidden) return;
  loadLag().then(renderFreshness, () => {});
}
function refreshListOnItsOwn() {
  if (document.hidden || route().name !== "list") return;
  run(() => refresh({ summary: false, execution: false, drawer: false }));
}

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
    const kinds = pendingKinds;
    const executions = pendingExecutions;
    pendingKinds = new Set();
    pendingExecutions = new Set();
    const r = route();
    const touches = (name) => [...kinds].some((k) => (KIND_LISTS[k] || Object.keys(LIST_VIEWS)).includes(name));
    run(() => refresh({
      list: r.name === "list" && touches(r.list),
      execution: r.name === "execution" && executions.has(r.id),
      drawer: !!(state.drawer && executions.has(state.drawer.target.executionId)),
    }));
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
  const live = $("live");
  live.className = "live " + (on ? "on" : "off");
  live.textContent = on ? "live" : "offline";
}

// ---------- a list page ----------
function navigate(name, params, replace) {
  const href = listHref(name, params);
  if (replace) {
    history.replaceState(null, "", href);
    onRoute();
  } else if (location.hash !== href) {
    location.hash = href;
  } else {
    onRoute();
  }
}
function setFilter(key, value, replace) {
  const r = route();
  const p = Object.fromEntries(r.params);
  if (value === "" || value === null || value === undefined) delete p[key];
  else p[key] = value;
  delete p.cursor; // a new query starts at its first page
  navigate(r.list, p, replace);
}
let searchTimer = null;
function renderFilters(box, r) {
  // Controls built from /api/lists: one select per filter with allowed values, a search
  // field for "q", the sort; text filters given in the URL show as removable chips.
  const spec = state.lists && state.lists[r.list];
  box.replaceChildren();
  box.dataset.list = r.list;
  if (!spec) return;
  const allowed = spec.allowed || {};
  const params = r.params;
  for (const name of Object.keys(allowed)) {
    if (["params", "sort", "limit", "cursor", "q"].includes(name)) continue;
    const values = allowed[name];
    if (!Array.isArray(values)) continue;
    const current = params.get(name) ?? "";
    const hasDefault = name in (spec.defaults || {});
    const options = hasDefault ? [] : [["", "any"]];
    for (const v of values) options.push([v, v.replaceAll("_", " ").toLowerCase()]);
    const selected = current || (hasDefault ? spec.defaults[name] : "");
    box.append(el("label", { class: "filter" }, name.replaceAll("_", " ") + " ",
      el("select", { id: `filter-${name}`, "data-filter": name, onchange: (e) => setFilter(name, e.target.value) },
        options.map(([v, text]) => el("option", v === selected ? { value: v, selected: "selected" } : { value: v }, text)))));
  }
  if ("q" in allowed) {
    box.append(el("label", { class: "filter search" }, "search ",
      el("input", {
        id: "filter-q", type: "search", value: params.get("q") || "", placeholder: "id, connector, action",
        "aria-label": "search", autocomplete: "off",
        oninput: (e) => {
          clearTimeout(searchTimer);
          const value = e.target.value;
          searchTimer = setTimeout(() => setFilter("q", value.trim(), true), SEARCH_DEBOUNCE_MS);
        },
      })));
  }
  const sorts = spec.sorts || [];
  const sort = params.get("sort") || LIST_VIEWS[r.list].sort || spec.default_sort;
  box.append(el("label", { class: "filter" }, "sort ",
    el("select", { id: "filter-sort", onchange: (e) => setFilter("sort", e.target.value) },
      sorts.map((s) => el("option", s === sort ? { value: s, selected: "selected" } : { value: s }, sortName(r.list, s))))));
  for (const [k, v] of params) {
    if (["sort", "cursor", "limit", "q"].includes(k) || Array.isArray(allowed[k])) continue;
    box.append(el("span", { class: "chip", "data-filter": k }, `${k.replaceAll("_", " ")}: `, el("b", {}, v), " ",
      el("button", { type: "button", class: "remove", "aria-label": `remove the ${k} filter`, onclick: () => setFilter(k, "") }, "×")));
  }
}
function syncFilters(box, r) {
  // the same list again (another filter, a live refresh): set the controls' values, keep
  // the focus and the caret of the field being typed in
  for (const sel of box.querySelectorAll("select[data-filter]")) {
    const spec = state.lists[r.list];
    const name = sel.dataset.filter;
    const value = r.params.get(name) ?? ((spec.defaults || {})[name] || "");
    if (sel.value !== value) sel.value = value;
  }
  const q = $("filter-q");
  if (q && document.activeElement !== q) q.value = r.params.get("q") || "";
}
function renderListPage(main, r) {
  // The page's frame for a list: built once per list; its filter controls built again when
  // the list's spec arrives or the text filters in the URL change, otherwise only set to
  // the URL's values (the search field keeps its focus and caret while the rows change).
  const view = LIST_VIEWS[r.list];
  let page = $("list-page");
  if (!page || page.dataset.list !== r.list) {
    page = el("section", { id: "list-page", class: "list-page", "data-list": r.list },
      el("h2", {}, view.title),
      el("div", { class: "filters", id: "filters" }),
      el("div", { class: "list-status", id: "list-status" }),
      el("div", { class: "table-wrap", id: "list-rows" }, el("p", { class: "empty" }, "Loading…")),
      el("div", { class: "pager", id: "pager" }));
    main.replaceChildren(page);
  }
  const filters = $("filters");
  const chips = [...r.params.keys()].filter((k) => !["sort", "cursor", "limit", "q"].includes(k)).sort().join(",");
  const key = `${r.list}|${state.lists ? "spec" : ""}|${chips}`;
  if (filters.dataset.key !== key) {
    renderFilters(filters, r);
    filters.dataset.key = key;
  }
  syncFilters(filters, r);
}
function renderList() {
  const r = route();
  if (r.name !== "list" || !state.list || state.list.name !== r.list) return;
  const main = $("main");
  renderListPage(main, r);
  const view = LIST_VIEWS[r.list];
  const body = state.list.body;
  const items = body.items || [];
  const total = typeof body.total === "number" ? body.total : null;
  const params = listQuery(r);
  const limit = Number(params.get("limit")) || PAGE_SIZE;
  // the cursors of the pages visited, in order: page k + 1 is read with stack[k]
  const stackKey = `${r.list}?${withoutCursor(params)}`;
  const stack = state.cursors[stackKey] || [];
  const cursor = params.get("cursor");
  const idx = cursor ? stack.indexOf(cursor) : -1;
  const start = cursor ? (idx >= 0 ? (idx + 1) * limit : null) : 0;
  const sort = params.get("sort");
  $("list-status").replaceChildren(
    el("span", { id: "list-count", "data-total": total ?? "", "data-shown": items.length, "data-start": start ?? "" },
      items.length
        ? (start !== null ? `${fmtCount(start + 1)}–${fmtCount(start + items.length)}` : `${fmtCount(items.length)} (a later page)`)
        : "0",
      ` of ${fmtCount(total)}`),
    el("span", { class: "muted" }, ` · sorted by ${sortName(r.list, sort)}`));
  const rows = $("list-rows");
  rows.dataset.query = state.list.query;
  if (!items.length) {
    rows.replaceChildren(el("p", { class: "empty" }, view.empty));
  } else {
    rows.replaceChildren(el("table", { class: "list", id: "list-table" },
      el("thead", {}, el("tr", {}, view.columns.map(([title]) => el("th", { scope: "col" }, title)))),
      el("tbody", {}, items.map((item) => listRow(view, item)))));
  }
  const next = body.next_cursor;
  $("pager").replaceChildren(
    el("button", { type: "button", id: "page-first", disabled: !cursor, onclick: () => goPage(r, null) }, "First"),
    el("button", { type: "button", id: "page-prev", disabled: !cursor,
      onclick: () => goPage(r, idx > 0 ? stack[idx - 1] : null) }, "Previous"),
    el("button", { type: "button", id: "page-next", disabled: !next, onclick: () => {
      const before = cursor ? (idx >= 0 ? stack.slice(0, idx + 1) : [cursor]) : [];
      state.cursors[stackKey] = [...before, next];
      goPage(r, next);
    } }, "Next"));
  if (items.length && !state.firstRowsMarked) {
    state.firstRowsMarked = true;
    performance.mark("vigil:first-rows");
  }
  document.dispatchEvent(new CustomEvent("vigil:rendered", { detail: { list: r.list, query: state.list.query } }));
}
function goPage(r, cursor) {
  const p = Object.fromEntries(r.params);
  if (cursor) p.cursor = cursor; else delete p.cursor;
  navigate(r.list, p);
}
function listRow(view, item) {
  const target = view.target(item);
  const open = () => openDrawer(target);
  const tr = el("tr", {
    class: "row" + (target.holds ? " holds" : ""), tabindex: "0",
    "data-kind": target.kind, "data-id": target.id, "data-execution": target.executionId,
    "data-attempt": target.attempt || null, "data-key": view.rowKey(item),
    onclick: open, onkeydown: (e) => { if (e.key === "Enter" && e.target === tr) open(); },
  }, view.columns.map(([title, cell]) => el("td", { "data-label": title || null }, el("div", { class: "cell" }, cell(item, target)))));
  return tr;
}

// ---------- the details drawer ----------
function targetKey(t) { return `${t.kind}|${scopedKey(t.executionId, t.id)}|${t.attempt || ""}`; }
function openDrawer(target, focusReview) {
  const same = state.drawer && targetKey(state.drawer.target) === targetKey(target);
  state.drawer = { target, detail: same ? state.drawer.detail : null };
  $("drawer").hidden = false;
  $("drawer").dataset.key = targetKey(target);
  document.body.classList.add("drawer-open");
  renderDrawer();
  renderDrawerReview(true);
  if (focusReview) { const n = $("drawer-review").querySelector("input.note"); if (n) n.focus(); }
  run(() => loadDrawer().then(renderDrawer, (e) => { state.drawer.error = e.message; renderDrawer(); }));
}
function closeDrawer() {
  state.drawer = null;
  $("drawer").hidden = true;
  document.body.classList.remove("drawer-open");
}
async function loadDrawer() {
  const d = state.drawer;
  if (!d) return;
  const key = targetKey(d.target);
  const detail = await api(`/api/executions/${encodeURIComponent(d.target.executionId)}`);
  if (state.drawer && targetKey(state.drawer.target) === key) {
    state.drawer.detail = detail;
    state.drawer.error = null;
    renderDrawer();
    renderDrawerReview(false);
  }
}
function alertsAbout(detail, subjectId) {
  return ((detail && detail.alerts) || []).filter((a) => a.subject_id === subjectId);
}
function proofText(p) { return `${p.proof}:${p.state}:${p.reason}`; }
function evidenceOf(alerts, shown) {
  // the distinct evidence lines of alerts, less those in ``shown``
  const seen = new Set(shown);
  const out = [];
  for (const a of alerts) for (const e of a.evidence || []) if (!seen.has(e)) { seen.add(e); out.push(e); }
  return out;
}
function facts(pairs) {
  const shown = pairs.filter(([, v]) => v !== null && v !== undefined && v !== "");
  return el("dl", { class: "facts" }, shown.map(([k, v]) => [el("dt", {}, k), el("dd", {}, v instanceof Node ? v : String(v))]));
}
function currentOf(target, detail) {
  // the target's own row in the execution's detail (fresher than the row it was opened from)
  if (!detail) return target.item;
  const ex = detail;
  if (target.kind === "approval") return (ex.approvals || []).find((a) => a.request_id === target.id) || target.item;
  if (target.kind === "operation") return (ex.operations || []).find((o) => o.operation_id === target.operationId) || target.item;
  if (target.kind === "work_item") return (ex.work_items || []).find((w) => w.work_item_id === target.id) || target.item;
  if (target.kind === "alert") return (ex.alerts || []).find((a) => a.alert_id === target.id) || target.item;
  if (target.kind === "execution") return ex.execution || target.item;
  return target.item;
}
function renderDrawer() {
  const d = state.drawer;
  if (!d) return;
  const t = d.target;
  const item = currentOf(t, d.detail) || {};
  const title = {
    approval: "Approval", operation: "Attempt", work_item: "Work item", alert: "Alert", execution: "Execution",
  }[t.kind] || t.kind;
  $("drawer-title").replaceChildren(title, " ", el("span", { class: "id" }, t.kind === "operation" ? attemptText(t.id, t.attempt) : t.id));
  const body = $("drawer-body");
  const parts = [];
  const a = t.attention;
  const head = [];
  if (a) head.push(severityBadge(a.severity), " ", badge(a.label, statusClass(a.label)));
  else if (t.kind === "alert") head.push(severityBadge(item.severity), " ", badge(item.firing ? "FIRING" : "RESOLVED", item.firing ? "bad" : "ok"));
  else if (t.kind === "work_item") head.push(workItemState(item));
  else if (t.kind === "operation") head.push(badge(attemptStatus(t, item) || "—", statusClass(attemptStatus(t, item))));
  else if (t.kind === "approval") head.push(badge(item.verdict, item.open ? "bad" : "ok"));
  else if (t.kind === "execution") head.push(badge(item.status, item.terminal ? "ok" : ""));
  parts.push(el("p", { class: "drawer-status" }, head, " ", el("a", { href: executionHref(t.executionId), class: "mono" }, t.executionId)));
  const step = (a && a.next_step) || item.next_step ||
    (t.kind === "work_item" && item.next_step) || null;
  if (step) parts.push(el("p", {}, el("b", {}, "next step: "), el("span", { class: "next-step" }, step)));
  const proofs = t.kind === "approval" ? item.failed_proofs || [] : [];
  if (proofs.length) {
    parts.push(el("h3", {}, "Failed proofs"), el("ul", { class: "proofs", id: "drawer-proofs" },
      proofs.map((p) => el("li", {}, el("b", {}, p.proof), ` ${p.state}: ${p.reason}`))));
  }
  const subject = t.kind === "work_item" ? t.operationId : t.kind === "alert" ? item.subject_id : t.kind === "execution" ? null : t.id;
  const alerts = t.kind === "alert" ? [item] : subject ? alertsAbout(d.detail, subject) : [];
  // each alert about it with the evidence it carries, less what was shown before (the
  // failed proofs above, another alert's same line)
  const seen = new Set(proofs.map(proofText));
  const evidence = alerts.map((x) => [x, evidenceOf([x], seen)]).filter(([x, lines]) => {
    for (const line of lines) seen.add(line);
    return lines.length || t.kind !== "alert";
  });
  if (evidence.length) {
    parts.push(el("h3", {}, t.kind === "alert" ? "Evidence" : "Evidence (the alerts about it)"),
      el("ul", { class: "evidence", id: "drawer-evidence" }, evidence.map(([x, lines]) =>
        el("li", { "data-alert": x.alert_id }, t.kind === "alert" ? null : el("span", {}, severityBadge(x.severity), " ",
          badge(x.firing ? "FIRING" : "RESOLVED", x.firing ? "bad" : "ok"), ` ${x.kind} · ${fmtTime(x.occurred_at)}`),
        lines.length ? el("ul", { class: "proofs" }, lines.map((e) => el("li", { class: "evidence-line" }, e))) : null))));
  }
  if (item.thresholds) parts.push(el("h3", {}, "Thresholds"), el("p", {}, thresholdText(item.thresholds)));
  parts.push(el("h3", {}, "Facts"), facts(factsOf(t, item)));
  if (t.kind === "work_item" && item.reconciler) parts.push(el("h3", {}, "Reconciler"), reconcilerCell(item.reconciler));
  if (d.error) parts.push(el("p", { class: "muted" }, `Could not read the execution: ${d.error}`));
  parts.push(el("details", { class: "record" }, el("summary", {}, "record"), el("pre", {}, JSON.stringify(item, null, 2))));
  body.replaceChildren(...parts);
}
function attemptStatus(t, op) {
  // the status of the attempt a target is about: the state's own, or the one it holds
  if (!op) return t.status;
  if (t.attempt && op.attempt === t.attempt) return op.status;
  if (t.attempt && op.held_by_attempt === t.attempt) return op.held_by_status;
  return t.status;
}
function factsOf(t, item) {
  switch (t.kind) {
    case "approval":
      return [["request", item.request_id], ["action", item.action], ["owner", item.owner],
        ["waiting since", item.started_at && `${fmtTime(item.started_at)} (${ageText(item.started_at)})`],
        ["previous verdict", item.previous_verdict], ["evaluated", fmtTime(item.evaluated_at)]];
    case "operation":
      return [["attempt", t.attempt], ["latest attempt", item.attempt], ["connector", item.connector],
        ["retry", item.retry], ["held by", item.held_by_attempt ? `${item.held_by_operation_id} #${item.held_by_attempt} ${item.held_by_status || ""}` : null],
        ["reason", item.reason], ["idempotency key", item.idempotency_key],
        ["since", item.since && `${fmtTime(item.since)} (${ageText(item.since)})`],
        ["reply due", item.reply_due_at && fmtTime(item.reply_due_at)],
        ["verify due", item.verify_due_at && fmtTime(item.verify_due_at)],
        ["open work item", item.open_work_item_id], ["effect ref", item.effect_ref]];
    case "work_item":
      return [["operation", attemptText(item.operation_id, item.attempt)], ["kind", item.kind],
        ["connector", item.connector], ["deadline", deadlineNode(item)],
        ["created", fmtTime(item.created_at)], ["idempotency key", item.idempotency_key],
        ["resolution", item.resolution && `${item.resolution.outcome} (${item.resolution.evidence_source}) ${fmtTime(item.resolution.resolved_at)}`]];
    case "alert":
      return [["kind", item.kind], ["subject", item.subject_id], ["verdict", item.verdict], ["owner", item.owner],
        ["occurred", item.occurred_at && `${fmtTime(item.occurred_at)} (${ageText(item.occurred_at)})`],
        ["resolved by", item.resolved_by], ["alert", item.alert_id]];
    case "execution":
      return [["status", item.status], ["since", fmtTime(item.since)], ["last event", fmtTime(item.last_event_at)],
        ["open operations", (item.open_operation_ids || []).join(", ")],
        ["open approvals", (item.open_approval_ids || []).join(", ")], ["terminal", item.terminal ? "yes" : "no"]];
  }
  return [];
}
function thresholdText(t) {
  return Object.entries(t).map(([k, v]) =>
    k.endsWith("_ms") ? `${k.slice(0, -3).replaceAll("_", " ")} ${fmtDuration(v)}`
      : `${k.replaceAll("_", " ")} ${k.endsWith("_at") ? fmtTime(v) : v}`).join(" · ");
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

// ---------- manual review ----------
function reviewTargetsOf(t, detail) {
  // The attempts a drawer reviews: the one it was opened on, and for an operation every
  // other open attempt the execution's detail knows (an older attempt holding the retry
  // verdict, an attempt with an open work item).
  if (t.kind !== "operation" && t.kind !== "work_item") return [];
  if (t.kind === "work_item" && !(currentOf(t, detail) || {}).open) return [];
  const out = [t];
  if (t.kind === "operation" && detail) {
    for (const x of openAttempts(detail, t.operationId)) if (x.attempt !== t.attempt) out.push(x);
  }
  return out;
}
let reviewRendered = null;
function renderDrawerReview(force) {
  const d = state.drawer;
  const box = $("drawer-review");
  if (!d) return;
  const targets = reviewTargetsOf(d.target, d.detail);
  const key = targets.map(targetKey).join(",");
  // the form is kept while the same attempts are shown: a live update never eats a note
  if (!force && reviewRendered === key) {
    for (const t of targets) {
      const op = currentOf({ ...t, kind: "operation" }, d.detail);
      const status = t.kind === "operation" ? attemptStatus(t, op) : null;
      const n = box.querySelector(`[data-review-key="${CSS.escape(targetKey(t))}"] .attempt-status`);
      if (n && status) n.textContent = status;
    }
    return;
  }
  reviewRendered = key;
  box.replaceChildren();
  if (!targets.length) return;
  box.append(el("h3", {}, "Review"));
  for (const t of targets) {
    const op = d.detail ? (d.detail.operations || []).find((o) => o.operation_id === t.operationId) : null;
    const status = t.kind === "operation" ? attemptStatus(t, op) : null;
    box.append(reviewControls(t, status));
  }
}
function reviewControls(t, status) {
  const key = targetKey(t);
  const saved = state.reviewNotes[key] || {};
  const note = el("input", { class: "note", placeholder: "what the source says", "aria-label": "review note",
    value: saved.note || "", oninput: (e) => { (state.reviewNotes[key] ||= {}).note = e.target.value; } });
  const reviewer = el("input", { class: "reviewer", placeholder: "reviewer", "aria-label": "reviewer",
    value: sessionStorage.getItem("vigil.reviewer") || "" });
  const result = el("span", { class: "review-result " + (saved.cls || ""), role: "status" }, saved.result || "");
  const act = (action) => async (e) => {
    const buttons = e.target.closest(".review").querySelectorAll("button");
    buttons.forEach((b) => { b.disabled = true; });
    const who = reviewer.value.trim();
    if (who) sessionStorage.setItem("vigil.reviewer", who);
    const outcome = await review(t, action, note.value, who);
    state.reviewNotes[key] = Object.assign(state.reviewNotes[key] || {}, outcome);
    result.className = "review-result " + outcome.cls;
    result.textContent = outcome.result;
    buttons.forEach((b) => { b.disabled = false; });
  };
  const what = t.kind === "work_item"
    ? [`work item ${t.id} · attempt `, el("b", {}, attemptText(t.operationId, t.attempt))]
    : ["attempt ", el("b", {}, attemptText(t.operationId, t.attempt)), " ", el("span", { class: "attempt-status" }, status || ""),
      t.holds ? el("span", { class: "muted" }, " (an older attempt, still blocking a retry)") : null,
      t.workItem ? el("span", { class: "muted" }, ` (open work item ${t.workItem})`) : null];
  return el("div", { class: "review", "data-review-key": key, "data-attempt": t.attempt },
    el("p", { class: "review-what" }, what),
    note, reviewer,
    el("span", { class: "buttons" },
      el("button", { type: "button", class: "take", onclick: act("take"), disabled: status === "MANUAL_REVIEW" }, "Take into review"),
      el("button", { type: "button", class: "verified", onclick: act("verified") }, "Verified"),
      el("button", { type: "button", class: "failed", onclick: act("failed") }, "Failed")),
    result);
}
async function review(t, action, note, reviewer) {
  if (!writeToken()) {
    $("tokens").open = true;
    return { result: "Paste the write token under Tokens first.", cls: "refused" };
  }
  try {
    const path = `/api/executions/${encodeURIComponent(t.executionId)}` +
      `/operations/${encodeURIComponent(t.operationId)}/review`;
    const body = await api(path, {
      method: "POST", write: true,
      headers: { "Content-Type": "application/json", Authorization: `Bearer ${writeToken()}` },
      body: JSON.stringify({ action, note, reviewer, attempt: t.attempt ?? null }),
    });
    const msg = (body && (body.message || body.status)) || "published";
    return { result: `${msg} — the page shows the outcome once the pipeline applies it.`, cls: "sent" };
  } catch (e) {
    return { result: `Refused: ${e.message}`, cls: "refused" };
  }
}

// ---------- fleet summary: each count opens its list ----------
function chipHref(group, key) {
  switch (group) {
    case "approvals_open_by_verdict": return listHref("approvals", { verdict: key, open: "true" });
    case "operations_by_status": return listHref("operations", { status: key });
    case "executions_by_status": return listHref("executions", { status: key });
    case "alerts_firing_by_severity": return listHref("alerts", { severity: key });
    case "executions_in_flight": return listHref("executions", { terminal: "false" });
    // the operations with an attempt still blocking a retry, and those in a status
    case "operations_blocking": return listHref("operations", { blocking: "true" });
    case "attempts_blocking_by_status": return listHref("operations", { status: key, blocking: "true" });
    case "work_items_open": return listHref("work-items", {});
  }
  return null;
}
function chip(group, key, n) {
  const href = chipHref(group, key);
  const content = [key !== null ? `${key} ` : null, el("b", {}, fmtCount(n))];
  return href
    ? el("a", { class: "count", href, "data-key": key, title: `open the list: ${group.replaceAll("_", " ")}${key ? " " + key : ""}` }, content)
    : el("span", { class: "count", "data-key": key }, content);
}
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
        entries.map(([k, n]) => chip(key, k, n))));
    } else if (typeof value === "number") {
      box.append(el("div", { class: "group", "data-summary": key }, el("h3", {}, title), chip(key, null, value)));
    }
  }
}

function renderFreshness() {
  const f = $("freshness");
  const lag = state.lag === null ? "—" : state.lag;
  const asOf = state.freshAt ? fmtTime(state.freshAt) : "— (catching up)";
  f.textContent = `as of ${asOf} · lag ${lag} · stream time ${fmtTime(state.eventTime)}`;
  // ages go on between renders: each is measured from now again
  for (const span of document.querySelectorAll(".age[data-since]")) span.textContent = ageText(span.dataset.since);
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
function table(id, columns, rows, rowAttrs) {
  if (!rows || !rows.length) return el("p", { class: "empty", id }, "none");
  return el("div", { class: "table-wrap" }, el("table", { class: "list", id },
    el("thead", {}, el("tr", {}, columns.map(([, title]) => el("th", { scope: "col" }, title)))),
    el("tbody", {}, rows.map((r) => el("tr", rowAttrs ? rowAttrs(r) : {}, columns.map(([k, title, f]) =>
      el("td", { class: k.endsWith("_id") ? "mono" : null, "data-label": title || null },
        el("div", { class: "cell" }, f ? f(r[k], r) : (r[k] ?? "—")))))))));
}
function attemptRows(detail) {
  // one row per attempt the view knows: the latest of each operation, the older one that
  // holds its retry verdict, and an older one with an open work item
  const out = [];
  for (const o of detail.operations || []) {
    const open = openAttempts(detail, o.operation_id);
    out.push({ ...o, _target: open.find((t) => t.attempt === o.attempt) || null, _holds: false });
    // the settled older attempts the view knows of, for the record (nothing to review)
    for (const a of Array.isArray(o.attempts) ? o.attempts : []) {
      if (a.attempt === o.attempt || open.some((t) => t.attempt === a.attempt)) continue;
      out.push({ operation_id: o.operation_id, attempt: a.attempt, connector: o.connector,
        status: a.status, retry: "", since: null, owner: o.owner, execution_id: o.execution_id,
        reason: "an older attempt", _target: null, _holds: false });
    }
    for (const t of open) {
      if (t.attempt === o.attempt) continue;
      out.push({ operation_id: o.operation_id, attempt: t.attempt, connector: o.connector,
        status: t.status || "—", retry: "", since: null, owner: o.owner, execution_id: o.execution_id,
        reason: t.workItem ? `open work item ${t.workItem}` : "an older attempt, still blocking a retry",
        _target: t, _holds: !!t.holds });
    }
  }
  return out;
}
function renderExecutionPage() {
  if (route().name !== "execution") return;
  const main = $("main");
  main.replaceChildren();
  renderExecution(main);
}
function renderExecution(main) {
  const ex = state.execution;
  if (!ex) return;
  main.append(el("h2", {}, "Execution ", el("span", { class: "mono" }, ex.id)));
  if (!ex.detail && !ex.error) { main.append(el("p", { class: "empty" }, "Loading…")); return; }
  if (ex.error) { main.append(el("p", { class: "empty" }, ex.error)); return; }
  const d = ex.detail || {};
  const row = d.execution || {};
  // Known only by what is open in it (an approval, an attempt, a work item): in flight, its
  // status unknown, never shown as closed.
  const openThere = (d.approvals || []).some((a) => a.open) ||
    (d.operations || []).some((o) => !SETTLED.includes(o.status)) ||
    (d.work_items || []).some((w) => w.open);
  const inFlight = row.status ? !row.terminal : openThere;
  main.append(el("p", { id: "execution-status", "data-in-flight": String(inFlight) },
    row.status ? badge(row.status, row.terminal ? "ok" : "") : badge("status unknown"),
    row.since ? ` since ${fmtTime(row.since)} · last event ${fmtTime(row.last_event_at)}` : " (no status event seen)",
    row.terminal ? " · terminal" : (inFlight ? " · in flight" : "")));
  const review = (t) => (t ? reviewButton(t) : null);
  main.append(el("h3", {}, "Operations"), table("execution-operations", [
    ["operation_id", "operation"], ["attempt", "attempt"], ["connector", "connector"],
    ["status", "status", (v) => badge(v, statusClass(v))],
    ["retry", "retry"], ["since", "since", fmtTime], ["owner", "owner"],
    ["reason", "reason"], ["_target", "", (t) => review(t)],
  ], attemptRows(d), (r) => ({
    class: "attempt" + (r._holds ? " holds" : "") + (SETTLED.includes(r.status) ? " closed" : ""),
    "data-id": r.operation_id, "data-attempt": r.attempt, "data-status": r.status,
  })));
  main.append(el("h3", {}, "Approvals"), table("execution-approvals", [
    ["request_id", "request"], ["verdict", "verdict", (v, a) => badge(v, a.open ? "" : "ok")], ["owner", "owner"],
    ["next_step", "next step"], ["evaluated_at", "evaluated", fmtTime], ["open", "", (v) => (v ? "open" : "closed")],
  ], d.approvals, (a) => ({ class: a.open ? "open" : "closed", "data-id": a.request_id })));
  main.append(el("h3", {}, "Work items"), table("execution-work-items", [
    ["open", "state", (_, w) => workItemState(w)],
    ["work_item_id", "work item"], ["kind", "kind"], ["operation_id", "operation", (v, w) => attemptText(v, w.attempt)],
    ["deadline", "deadline", (_, w) => deadlineNode(w)], ["next_step", "next step"],
    ["reconciler", "reconciler", reconcilerCell],
    ["work_item_id", "", (_, w) => (w.open ? reviewButton(workItemTarget(w)) : null)],
  ], d.work_items, (w) => ({ class: w.open ? "open" : "closed", "data-id": w.work_item_id, "data-state": w.open ? "open" : "closed" })));
  main.append(el("h3", {}, "Alerts"), table("execution-alerts", [
    ["severity", "severity", (v) => severityBadge(v)],
    ["firing", "status", (v, a) => [badge(v ? "FIRING" : "RESOLVED", v ? "bad" : "ok"),
      a.resolved_by ? el("span", { class: "muted" }, ` by ${a.resolved_by}`) : null]],
    ["kind", "kind"], ["subject_id", "subject"], ["owner", "owner"], ["next_step", "next step"],
    ["occurred_at", "at", fmtTime],
  ], d.alerts, (a) => ({ class: a.firing ? "firing" : "closed", "data-id": a.alert_id, "data-status": a.firing ? "FIRING" : "RESOLVED" })));
  main.append(el("h3", {}, "Timeline"), table("execution-timeline", [
    ["at", "at", fmtTime], ["kind", "kind"], ["id", "id"], ["summary", "summary"],
  ], ex.timeline));
}

// ---------- routing ----------
function renderChrome() {
  renderFreshness();
  renderSummaryBar();
  const r = route();
  const current = r.name === "list" ? r.list : null;
  for (const name of Object.keys(LIST_VIEWS)) {
    const a = $(`nav-${name}`);
    if (a) a.classList.toggle("current", name === current);
  }
}
let shownPath = null;
async function onRoute() {
  const r = route();
  // another list or page: the drawer belonged to the one left (a filter keeps it open)
  const path = r.name === "list" ? `list:${r.list}` : `${r.name}:${r.id}`;
  if (shownPath !== null && path !== shownPath && state.drawer) closeDrawer();
  shownPath = path;
  renderChrome();
  if (r.name === "execution") {
    state.execution = { id: r.id };
    renderExecutionPage();
    run(async () => { await loadExecution(r.id); renderExecutionPage(); });
    return;
  }
  state.execution = null;
  renderListPage($("main"), r);
  run(async () => {
    const [, shown] = await Promise.all([loadSpecs(), loadList(r)]);
    renderListPage($("main"), r);
    if (shown) renderList();
  });
}

document.addEventListener("DOMContentLoaded", () => {
  initTokens();
  $("open-execution").addEventListener("submit", (e) => {
    e.preventDefault();
    const id = $("execution-input").value.trim();
    if (id) location.hash = executionHref(id);
  });
  $("drawer-close").addEventListener("click", closeDrawer);
  document.addEventListener("keydown", (e) => { if (e.key === "Escape" && state.drawer) closeDrawer(); });
  window.addEventListener("hashchange", onRoute);
  onRoute();
  run(() => Promise.allSettled([loadSummary(true), loadLag()]).then(renderChrome));
  connectStream();
  // The view can catch up on records that change nothing the page shows (no SSE change):
  // the freshness indicator is re-read on its own every few seconds, the list every 30.
  setInterval(refreshFreshness, LAG_EVERY_MS);
  setInterval(refreshListOnItsOwn, LIST_EVERY_MS);
});
