// The memgate console: one more client of the REST API, with the caller's own token.
// Everything shown is written with textContent (memory text is untrusted, SPEC §3.7); the
// token lives in this tab's sessionStorage and travels only in the Authorization header.

const TOKEN_KEY = "memgate.console.token";
const PAGE = 100; // the self-service list's largest page
const POLL_MS = 500;

const $ = (id) => document.getElementById(id);
const state = { token: null, me: null, memories: [], request: null };

function el(tag, text, attrs = {}) {
  const node = document.createElement(tag);
  if (text !== undefined && text !== null) node.textContent = String(text);
  for (const [name, value] of Object.entries(attrs)) node.setAttribute(name, value);
  return node;
}

function row(...cells) {
  const tr = document.createElement("tr");
  for (const cell of cells) {
    const td = document.createElement("td");
    if (cell instanceof Node) td.append(cell); else td.textContent = cell ?? "";
    tr.append(td);
  }
  return tr;
}

function fill(tableId, rows) {
  const body = $(tableId).querySelector("tbody");
  body.replaceChildren(...rows);
}

function show(message) { $("error").textContent = message || ""; }

class ApiError extends Error {
  constructor(status, code, message) { super(message); this.status = status; this.code = code; }
}

async function api(method, path, body) {
  const headers = { Authorization: `Bearer ${state.token}` };
  if (body !== undefined) headers["Content-Type"] = "application/json";
  const response = await fetch(path, {
    method, headers, body: body === undefined ? undefined : JSON.stringify(body),
    credentials: "omit", cache: "no-store", referrerPolicy: "no-referrer",
  });
  const text = await response.text();
  const data = text && (response.headers.get("content-type") || "").includes("json")
    ? JSON.parse(text) : text;
  if (!response.ok) {
    const error = (data && data.error) || {};
    throw new ApiError(response.status, error.code || String(response.status),
      error.message || `request failed (${response.status})`);
  }
  return data;
}

// Run an action from a control; a failure is shown, never thrown away.
function action(fn) {
  return async (event) => {
    if (event && event.preventDefault) event.preventDefault();
    show("");
    try { await fn(event); } catch (error) {
      show(error instanceof ApiError ? `${error.code}: ${error.message}` : String(error));
    }
  };
}

// --- signing in ---

const SECTIONS = {
  member: [["memories", "My memories"]],
  owner: [["memories", "My memories"], ["workspace", "Workspace"]],
  operator: [["erasure", "Erasure requests"], ["operations", "Operations"]],
};

function open(id) {
  for (const section of document.querySelectorAll("main > section")) {
    section.hidden = section.id !== id;
  }
  for (const tab of $("tabs").querySelectorAll("button")) {
    tab.setAttribute("aria-current", tab.dataset.section === id ? "page" : "false");
  }
  const load = { memories: loadMemories, workspace: loadWorkspace, erasure: loadErasure,
                 operations: loadOperations }[id];
  if (load) action(load)();
}

async function signIn(token) {
  state.token = token;
  try {
    state.me = await api("GET", "/api/me");
  } catch (error) {
    state.token = null;
    sessionStorage.removeItem(TOKEN_KEY);
    throw error;
  }
  sessionStorage.setItem(TOKEN_KEY, token);
  const me = state.me;
  const kind = me.kind === "operator" ? "operator" : me.role === "owner" ? "owner" : "member";
  $("who").textContent = me.kind === "operator" ? "Signed in as the operator"
    : `Signed in as ${me.name} (${me.role}) in workspace ${me.workspaceId}`;
  $("sign-out").hidden = false;
  const tabs = $("tabs");
  tabs.replaceChildren(...SECTIONS[kind].map(([id, label]) => {
    const button = el("button", label, { type: "button" });
    button.dataset.section = id;
    button.addEventListener("click", () => open(id));
    return button;
  }));
  tabs.hidden = false;
  open(SECTIONS[kind][0][0]);
}

function signOut() {
  sessionStorage.removeItem(TOKEN_KEY);
  state.token = null; state.me = null; state.memories = [];
  $("who").textContent = "";
  $("sign-out").hidden = true;
  $("tabs").hidden = true;
  open("sign-in");
  $("token").value = "";
  $("token").focus();
}

// --- a member's memories ---

async function loadMemories() {
  const ws = encodeURIComponent(state.me.workspaceId);
  const memories = [];
  let cursor = null;
  do {
    const query = new URLSearchParams({ limit: String(PAGE) });
    if (cursor) query.set("cursor", cursor);
    const page = await api("GET", `/api/w/${ws}/ask-history/agent-memories?${query}`);
    memories.push(...page.memories);
    cursor = page.nextCursor;
  } while (cursor);
  state.memories = memories;
  renderMemories();
  $("memories-status").textContent = `${memories.length} memories`;
}

function renderMemories() {
  const needle = $("memory-search").value.trim().toLowerCase();
  const shown = state.memories.filter((m) => !needle
    || m.text.toLowerCase().includes(needle) || m.namespace.toLowerCase().includes(needle));
  fill("memories-table", shown.map((m, i) => {
    const box = el("input", null, { type: "checkbox", "aria-label": `Select memory ${i + 1}` });
    box.dataset.memoryId = m.memoryId;
    const tr = row(box, m.namespace, new Date(m.createdAt).toLocaleString(),
      m.sourceState || "current", m.text);
    tr.dataset.memoryId = m.memoryId;
    return tr;
  }));
}

async function deleteMemories(ids) {
  const ws = encodeURIComponent(state.me.workspaceId);
  const body = ids === null ? {} : { memoryIds: ids };
  const result = await api("DELETE", `/api/w/${ws}/ask-history/agent-memories`, body);
  await loadMemories();
  $("memories-status").textContent = `Deleted ${result.deleted} `
    + `${result.deleted === 1 ? "memory" : "memories"}.`;
}

async function deleteSelected() {
  const ids = [...$("memories-table").querySelectorAll("input[type=checkbox]:checked")]
    .map((box) => box.dataset.memoryId);
  if (!ids.length) { $("memories-status").textContent = "Select memories to delete first."; return; }
  await deleteMemories(ids);
}

// --- an owner's workspace ---

function wsPath(rest) { return `/api/w/${encodeURIComponent(state.me.workspaceId)}${rest}`; }

async function loadWorkspace() {
  const [settings, members, credentials] = await Promise.all([
    api("GET", wsPath("/ask-history/settings")), api("GET", wsPath("/members")),
    api("GET", wsPath("/credentials"))]);
  $("agent-memories").checked = settings.agentMemoriesEnabled;
  $("retention-days").value = settings.retentionDays;
  $("non-retaining").textContent = settings.nonRetaining
    ? "This workspace is non-retaining: nothing is remembered." : "";
  fill("members-table", members.members.map((m) => {
    const flag = el("input", null, { type: "checkbox",
      "aria-label": `Memory spaces for ${m.name || m.memberId}` });
    flag.checked = m.memorySpacesEnabled;
    flag.addEventListener("change", action(async () => {
      await api("PATCH", wsPath(`/members/${encodeURIComponent(m.memberId)}`),
        { memorySpacesEnabled: flag.checked });
      $("workspace-status").textContent = `Memory spaces ${flag.checked ? "on" : "off"} `
        + `for ${m.name || m.memberId}.`;
    }));
    return row(m.name, m.memberId, m.role, flag);
  }));
  fill("credentials-table", credentials.credentials.map((c) => {
    const revoke = el("button", "Revoke", { type: "button",
      "aria-label": `Revoke credential ${c.name}` });
    revoke.addEventListener("click", action(async () => {
      await api("DELETE", wsPath(`/credentials/${encodeURIComponent(c.credentialId)}`));
      $("workspace-status").textContent = `Credential ${c.name} revoked.`;
      await loadWorkspace();
    }));
    return row(c.name, c.credentialId, c.scopes.join(", "), revoke);
  }));
  await loadSpaces();
}

async function loadSpaces() {
  if (!state.me.memorySpacesEnabled) {
    fill("spaces-table", [row("", "Memory spaces are off for you: turn them on above.", "")]);
    return;
  }
  const spaces = await api("GET", "/memory/spaces");
  fill("spaces-table", spaces.spaces.map((s) => row(s.id, s.description,
    s.permissions.join(", "))));
}

function showSecret(label, value) {
  $("secret-label").textContent = label;
  $("secret-value").textContent = value;
  $("secret").hidden = false;
  $("secret-done").focus();
}

function hideSecret() {
  $("secret-value").textContent = "";
  $("secret-label").textContent = "";
  $("secret").hidden = true;
}

async function saveSettings() {
  await api("PUT", wsPath("/ask-history/settings"), {
    agentMemoriesEnabled: $("agent-memories").checked,
    retentionDays: Number($("retention-days").value),
  });
  $("workspace-status").textContent = "Settings saved.";
}

async function addMember() {
  const added = await api("POST", wsPath("/members"),
    { name: $("member-name").value, role: $("member-role").value });
  $("member-name").value = "";
  await loadWorkspace();
  showSecret(`Member ${added.memberId} added. Their member token, shown this once:`,
    added.memberToken);
}

async function createCredential() {
  const scopes = [["scope-read", "memory:read"], ["scope-write", "memory:write"]]
    .filter(([id]) => $(id).checked).map(([, scope]) => scope);
  const created = await api("POST", wsPath("/credentials"),
    { name: $("credential-name").value, scopes });
  $("credential-name").value = "";
  await loadWorkspace();
  showSecret(`Credential ${created.credentialId} created. Its token, shown this once:`,
    created.token);
}

async function createSpace() {
  const created = await api("POST", "/memory/spaces",
    { description: $("space-description").value });
  $("space-description").value = "";
  await loadSpaces();
  $("workspace-status").textContent = `Space ${created.id} created.`;
}

async function share(remove) {
  const path = `/memory/spaces/${encodeURIComponent($("share-space").value)}/shares/`
    + encodeURIComponent($("share-member").value);
  if (remove) await api("DELETE", path); else await api("PUT", path, { role: $("share-role").value });
  $("workspace-status").textContent = remove ? "Share removed." : "Space shared.";
}

// --- the operator: erasure requests ---

const NEXT = { received: "verify identity", verified: "discover", discovered: "decide",
               decided: "execute", executing: "wait", failed: "execute again", completed: "none" };

async function loadErasure() {
  const [list, kpis] = await Promise.all([api("GET", "/api/admin/erasure-requests"),
    api("GET", "/api/admin/erasure-requests/metrics")]);
  $("erasure-kpis").textContent = `${kpis.open} open, ${kpis.overdue} overdue, `
    + `${kpis.completed} completed; longest in process ${kpis.daysInProcessMax} days`;
  fill("erasure-table", list.requests.map((r) => {
    const pick = el("button", r.requestId, { type: "button",
      "aria-label": `Open erasure request ${r.requestId}` });
    pick.addEventListener("click", action(() => openRequest(r.requestId)));
    return row(pick, r.workspaceId, r.status, new Date(r.dueAt).toLocaleDateString(),
      NEXT[r.status] || "");
  }));
}

function renderRequest(r) {
  state.request = r;
  $("erasure-detail").hidden = false;
  $("erasure-detail-title").textContent = `Request ${r.requestId}`;
  $("erasure-progress").textContent = `Status: ${r.status}`
    + (r.failure ? ` (${r.failure})` : "")
    + (r.completedAt ? `, completed ${new Date(r.completedAt).toLocaleString()}` : "")
    + ` — ${r.evidence.length} of 6 layers done`;
  $("verify-form").hidden = r.status !== "received";
  $("discover").hidden = r.status !== "verified";
  $("decide-form").hidden = r.status !== "discovered";
  $("execute").hidden = !["decided", "failed"].includes(r.status);
  const found = r.discovery || {};
  const layers = Object.keys(found);
  for (const e of r.evidence) if (!layers.includes(e.layer)) layers.push(e.layer);
  fill("evidence-table", layers.map((layer) => {
    const e = r.evidence.find((x) => x.layer === layer);
    return row(layer, found[layer] ?? "", e ? e.erased : "", e ? e.how : "",
      e ? new Date(e.at).toLocaleString() : "");
  }));
}

function requestPath(rest = "") {
  return `/api/admin/erasure-requests/${encodeURIComponent(state.request.requestId)}${rest}`;
}

async function openRequest(id) {
  renderRequest(await api("GET", `/api/admin/erasure-requests/${encodeURIComponent(id)}`));
}

async function step(rest, body) {
  renderRequest(await api("POST", requestPath(rest), body));
  await loadErasure();
}

async function execute() {
  await step("/execute");
  while (state.request && state.request.status === "executing") {
    await new Promise((done) => setTimeout(done, POLL_MS));
    renderRequest(await api("GET", requestPath()));
  }
  await loadErasure();
}

async function receiveRequest() {
  const subject = { [$("erasure-kind").value]: $("erasure-subject").value };
  const created = await api("POST", "/api/admin/erasure-requests",
    { workspaceId: $("erasure-workspace").value, subject });
  await loadErasure();
  renderRequest(created);
}

// --- the operator: audit, health, bus ---

async function loadOperations() {
  const response = await fetch("/healthz", { cache: "no-store", credentials: "omit" });
  const health = await response.json();
  fill("health-table", Object.entries(health.actors || {}).map(([name, s]) => row(name, s)));
  let series = [];
  try {
    const text = await api("GET", "/metrics");
    series = String(text).split("\n").filter((line) => line && !line.startsWith("#")
      && /(pending|redeliver|dead_letter|lag|backlog)/.test(line.split(/[{ ]/)[0]));
  } catch (error) {
    series = [`metrics not available (${error.code || error})`];
  }
  fill("bus-table", series.map((line) => {
    const cut = line.lastIndexOf(" ");
    return cut < 0 ? row(line, "") : row(line.slice(0, cut), line.slice(cut + 1));
  }));
  const cluster = await api("GET", "/api/admin/cluster");
  fill("cluster-table", cluster.stores.map((s) =>
    row(s.name, s.home || "none", s.servedBy || "nobody", s.epoch === null ? "-" : String(s.epoch))));
}

async function verifyAudit() {
  const result = await api("POST", "/api/admin/audit/verify");
  $("audit-result").textContent = result.ok
    ? `The audit log's chain holds: ${result.entries} entries.`
    : `The chain is broken at line ${result.brokenLine}: ${result.brokenReason}`;
}

// --- wiring ---

function wire() {
  $("sign-in-form").addEventListener("submit", action(() => signIn($("token").value.trim())));
  $("sign-out").addEventListener("click", signOut);
  $("memory-search").addEventListener("input", renderMemories);
  $("memories-refresh").addEventListener("click", action(loadMemories));
  $("delete-selected").addEventListener("click", action(deleteSelected));
  $("delete-all").addEventListener("click", () => {
    $("delete-all-confirm").hidden = false;
    $("delete-all-confirm").focus();
  });
  $("delete-all-confirm").addEventListener("click", action(async () => {
    $("delete-all-confirm").hidden = true;
    await deleteMemories(null);
  }));
  $("settings-form").addEventListener("submit", action(saveSettings));
  $("member-form").addEventListener("submit", action(addMember));
  $("credential-form").addEventListener("submit", action(createCredential));
  $("secret-done").addEventListener("click", hideSecret);
  $("space-form").addEventListener("submit", action(createSpace));
  $("share-form").addEventListener("submit", action(() => share(false)));
  $("unshare").addEventListener("click", action(() => share(true)));
  $("erasure-form").addEventListener("submit", action(receiveRequest));
  $("verify-form").addEventListener("submit", action(() => step("/verify",
    { method: $("verify-method").value, verifiedBy: $("verify-by").value })));
  $("discover").addEventListener("click", action(() => step("/discover")));
  $("decide-form").addEventListener("submit", action(() => step("/decide",
    { holds: [], reason: $("decide-reason").value })));
  $("execute").addEventListener("click", action(execute));
  $("audit-verify").addEventListener("click", action(verifyAudit));
  $("health-refresh").addEventListener("click", action(loadOperations));
  const kept = sessionStorage.getItem(TOKEN_KEY);
  if (kept) action(() => signIn(kept))();
}

wire();
