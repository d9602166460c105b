// The Atmosphere console: one module, no framework, no build step, nothing loaded from elsewhere.
//
// Everything shown comes from the public API with the token typed in at sign-in; the page keeps
// no state of its own beyond this browser tab (sessionStorage). Text from runs is always set as
// text (textContent), never parsed as HTML: a model's answer cannot script the page.

const $ = (selector, root = document) => root.querySelector(selector);

/** An element with attributes, properties (`on*` listeners, `text`) and children. */
function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (value === undefined || value === null || value === false) continue;
    if (key === "text") node.textContent = String(value);
    else if (key === "class") node.className = value;
    else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else node.setAttribute(key, value === true ? "" : String(value));
  }
  for (const child of children.flat()) {
    if (child === undefined || child === null || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

const pretty = (value) => (typeof value === "string" ? value : JSON.stringify(value, null, 2));
const when = (ms) => (ms ? new Date(Number(ms)).toLocaleString() : "");
const short = (id) => (id && id.length > 14 ? `${id.slice(0, 8)}…${id.slice(-4)}` : id || "");

// ---- session and API ------------------------------------------------------------------------

const session = {
  token: sessionStorage.getItem("atmo.token") || "",
  adminToken: sessionStorage.getItem("atmo.adminToken") || "",
  signedIn: sessionStorage.getItem("atmo.signedIn") === "1",
  me: null,
  info: {},
  agents: [],
  admin: false,
};

class ApiError extends Error {
  constructor(status, body) {
    super(describeError(status, body));
    this.status = status;
    this.body = body;
  }
}

function describeError(status, body) {
  let message = body;
  let code = "";
  if (body && typeof body === "object") {
    const error = body.error;
    message = (error && typeof error === "object" ? error.message : error) || body.detail || body.message || JSON.stringify(body);
    code = body.code || (error && typeof error === "object" && error.code) || "";
  }
  return `${status}: ${typeof message === "string" ? message : JSON.stringify(message)}${code ? ` (${code})` : ""}`;
}

/** JSON from the API; `admin` presents the admin token (the user's when none was given). */
async function api(path, { admin = false, method = "GET", body, text } = {}) {
  const token = admin ? session.adminToken || session.token : session.token;
  const headers = {};
  if (token) headers.Authorization = `Bearer ${token}`;
  let payload;
  if (body !== undefined) {
    headers["Content-Type"] = "application/json";
    payload = JSON.stringify(body);
  } else if (text !== undefined) {
    headers["Content-Type"] = "text/plain; charset=utf-8";
    payload = text;
  }
  const response = await fetch(path, { method, headers, body: payload, cache: "no-store" });
  const raw = await response.text();
  let data = raw;
  try {
    data = raw ? JSON.parse(raw) : null;
  } catch {
    /* not JSON: keep the text */
  }
  if (!response.ok) throw new ApiError(response.status, data);
  return data;
}

function query(params) {
  const search = new URLSearchParams();
  for (const [key, value] of Object.entries(params)) if (value !== "" && value !== undefined && value !== null) search.set(key, value);
  const text = search.toString();
  return text ? `?${text}` : "";
}

function say(message, bad = false) {
  const status = $("#status");
  status.textContent = message;
  status.classList.toggle("bad", bad);
}

function failed(error) {
  say(error instanceof Error ? error.message : String(error), true);
}

// ---- sign-in and the tabs -------------------------------------------------------------------

async function signIn(event) {
  event?.preventDefault();
  const token = $("#login-token").value.trim();
  const adminToken = $("#login-admin").value.trim();
  session.token = token;
  session.adminToken = adminToken;
  const error = $("#login-error");
  error.hidden = true;
  try {
    await enter();
    sessionStorage.setItem("atmo.token", token);
    sessionStorage.setItem("atmo.adminToken", adminToken);
    sessionStorage.setItem("atmo.signedIn", "1");
    $("#login-form").reset();
  } catch (problem) {
    error.textContent = problem instanceof ApiError && problem.status === 401 ? "Unknown token: the server refused it." : String(problem.message || problem);
    error.hidden = false;
    session.token = session.adminToken = "";
  }
}

function signOut() {
  for (const key of ["atmo.token", "atmo.adminToken", "atmo.signedIn"]) sessionStorage.removeItem(key);
  location.reload();
}

/** Who is signed in, what runs here, and which tabs that makes real. Throws when the token is refused. */
async function enter() {
  try {
    session.me = await api("/api/me");
  } catch (problem) {
    // An admin without a user token: the admin tabs only, no chat.
    if (!(problem instanceof ApiError && problem.status === 401 && session.adminToken && !session.token)) throw problem;
    session.me = { authenticated: false, authRequired: true, userId: "", adminOnly: true };
  }
  session.admin = await isAdmin();
  if (session.adminToken && !session.admin) throw new Error("The admin token was refused.");
  await refreshInfo();
  session.agents = session.me.adminOnly ? [] : await api("/api/agents");
  $("#login").hidden = true;
  $("#app").hidden = false;
  $("#sign-out").hidden = false;
  const who = session.me.authenticated ? `Signed in as ${session.me.name || session.me.userId}` : session.me.authRequired ? "Admin" : "No sign-in required here";
  $("#who").textContent = `${who}${session.admin ? " · admin" : ""}`;
  for (const node of document.querySelectorAll(".admin-only")) node.hidden = !session.admin;
  fillAgents();
  showTabs();
}

async function isAdmin() {
  if (!session.adminToken && session.me.authRequired) return false;
  try {
    await api("/api/admin/agents", { admin: true });
    return true;
  } catch (problem) {
    if (problem instanceof ApiError && (problem.status === 401 || problem.status === 403)) return false;
    return Boolean(session.adminToken); // the gate passed, the read failed for another reason
  }
}

async function refreshInfo() {
  session.info = (await api("/api/console/info")) || {};
  renderInfo();
}

/** A tab appears only when what it needs is really running (runtime truth), and for whom it is. */
function visibleTabs() {
  const services = new Set(session.info.services || []);
  return {
    // An agent whose pool has no model runtime may still answer (a @prompt agent such as echo needs
    // none): it is listed with its state, and a run it cannot make ends with the server's own error.
    chat: services.has("dispatch") && session.agents.length > 0,
    workspace: session.admin && services.has("memory") && Boolean(session.info.hasWorkspace),
    tape: services.has("tape") && (session.admin || !session.me.adminOnly),
    governance: session.admin && services.has("governance"),
    info: true,
  };
}

function showTabs() {
  const visible = visibleTabs();
  let first = null;
  for (const tab of document.querySelectorAll('[role="tab"]')) {
    tab.hidden = !visible[tab.dataset.tab];
    if (!tab.hidden && !first) first = tab.dataset.tab;
  }
  const wanted = location.hash.slice(1);
  select(visible[wanted] ? wanted : first);
}

const opened = {
  chat: () => $("#chat-input").focus({ preventScroll: true }),
  workspace: () => loadWorkspace(),
  tape: () => loadRuns(),
  governance: () => loadGovernance(),
  info: () => refreshInfo().catch(failed),
};

function select(name) {
  for (const tab of document.querySelectorAll('[role="tab"]')) {
    const on = tab.dataset.tab === name;
    tab.setAttribute("aria-selected", String(on));
    tab.tabIndex = on ? 0 : -1;
    $(`#panel-${tab.dataset.tab}`).hidden = !on;
  }
  if (location.hash.slice(1) !== name) history.replaceState(null, "", `#${name}`);
  say("");
  opened[name]?.();
}

function onTabKey(event) {
  const tabs = [...document.querySelectorAll('[role="tab"]')].filter((tab) => !tab.hidden);
  const index = tabs.indexOf(document.activeElement);
  if (index < 0) return;
  const moves = { ArrowRight: 1, ArrowLeft: -1, Home: -index, End: tabs.length - 1 - index };
  if (!(event.key in moves)) return;
  event.preventDefault();
  const next = tabs[(index + moves[event.key] + tabs.length) % tabs.length];
  next.focus();
  select(next.dataset.tab);
}

function fillAgents() {
  const choices = session.agents.map((agent) => {
    const state = String(agent.runtimeState || "");
    const runtime = [agent.runtime, state.startsWith("INACTIVE") ? "inactive" : ""].filter(Boolean).join(", ");
    return el("option", { value: agent.name, text: `${agent.name}${runtime ? ` (${runtime})` : ""}` });
  });
  $("#chat-agent").replaceChildren(...choices);
  const tapeAgent = $("#tape-agent");
  tapeAgent.replaceChildren(el("option", { value: "", text: "any" }), ...session.agents.map((agent) => el("option", { value: agent.name, text: agent.name })));
  describeAgent();
}

// ---- chat -----------------------------------------------------------------------------------

const chat = { socket: null, key: "", run: null, pending: [], retries: 0, plan: null };

function newConversationId() {
  const bytes = crypto.getRandomValues(new Uint8Array(6));
  return `console-${[...bytes].map((b) => b.toString(16).padStart(2, "0")).join("")}`;
}

function describeAgent() {
  const agent = session.agents.find((a) => a.name === $("#chat-agent").value);
  const state = String(agent?.runtimeState || "");
  $("#chat-agent-about").textContent = agent ? [agent.description, agent.tools?.length ? `tools: ${agent.tools.join(", ")}` : "", state.startsWith("INACTIVE") ? `runtime ${state}` : ""].filter(Boolean).join(" — ") : "";
}

function socketUrl(agent, resume) {
  const scheme = location.protocol === "https:" ? "wss:" : "ws:";
  const params = { conversationId: $("#chat-conversation").value.trim() };
  if (session.token) params.access_token = session.token; // browsers cannot set a header on a WebSocket
  if (resume) Object.assign(params, { runId: resume.id, lastSeq: resume.lastSeq });
  return `${scheme}//${location.host}/atmosphere/agent/${encodeURIComponent(agent)}${query(params)}`;
}

/** The socket of the chosen agent and conversation, opened (resuming `resume` when given). */
function connect(resume) {
  const agent = $("#chat-agent").value;
  const key = `${agent}\u0000${$("#chat-conversation").value.trim()}`;
  if (chat.socket && chat.key === key && chat.socket.readyState <= WebSocket.OPEN && !resume) return chat.socket;
  closeSocket();
  const socket = new WebSocket(socketUrl(agent, resume));
  chat.socket = socket;
  chat.key = key;
  socket.addEventListener("open", () => {
    if (resume && chat.run?.id === resume.id) chat.run.connection(`resumed from seq ${resume.lastSeq}`);
    for (const message of chat.pending.splice(0)) socket.send(message);
  });
  socket.addEventListener("message", (event) => {
    let frame;
    try {
      frame = JSON.parse(event.data);
    } catch {
      return;
    }
    chat.retries = 0; // the connection works again (an accept that closes at once does not count)
    onFrame(frame);
  });
  socket.addEventListener("close", (event) => onSocketClosed(socket, event));
  return socket;
}

function closeSocket() {
  if (chat.socket) {
    const socket = chat.socket;
    chat.socket = null;
    socket.close(1000);
  }
}

/** A socket that ends with a run still going is reopened on that run, from the last frame seen. */
function onSocketClosed(socket, event) {
  if (socket !== chat.socket) return; // replaced on purpose
  chat.socket = null;
  const run = chat.run;
  if (event.code === 4401 || event.code === 4403 || event.code === 4404 || event.code === 1008) {
    run?.fail(`The server closed the connection: ${event.reason || event.code}`);
    finishRun();
    return;
  }
  if (!run || run.done) return;
  if (!run.id) {
    run.fail(`The connection closed before the run started (${event.code}${event.reason ? `: ${event.reason}` : ""}); send it again.`);
    finishRun();
    return;
  }
  chat.retries += 1;
  if (chat.retries > 8) {
    run.fail("The connection keeps dropping; the run goes on on the server (see the Tape tab).");
    finishRun();
    return;
  }
  const delay = Math.min(8000, 250 * 2 ** (chat.retries - 1));
  run.connection(`connection lost (${event.code}); resuming from seq ${run.lastSeq}…`);
  setTimeout(() => {
    if (chat.run === run && !run.done) connect({ id: run.id, lastSeq: run.lastSeq });
  }, delay);
}

function onFrame(frame) {
  const run = chat.run;
  if (!run) return;
  if (frame.seq && frame.seq <= run.lastSeq && !frame.runId) return; // already shown (a resume overlaps)
  if (frame.seq > run.lastSeq) run.lastSeq = frame.seq;
  if (frame.runId && frame.parentRunId) {
    run.child(frame).handle(frame);
    return;
  }
  run.handle(frame);
  if (run.done) finishRun();
}

/** While a run streams, its agent and conversation stay put: closing their socket cleanly would cancel it. */
function streaming(on) {
  for (const id of ["#chat-send", "#chat-agent", "#chat-conversation", "#chat-new"]) $(id).disabled = on;
  $("#chat-cancel").hidden = !on;
}

function finishRun() {
  streaming(false);
  chat.run = null;
}

function send(event) {
  event?.preventDefault();
  const input = $("#chat-input");
  const prompt = input.value;
  if (!prompt.trim() || chat.run) return;
  const conversation = $("#chat-conversation");
  if (!conversation.checkValidity()) {
    say("A conversation id is letters, digits and _-:@ only (at most 128).", true);
    return;
  }
  input.value = "";
  const turn = el("article", { class: "turn" }, el("div", { class: "msg user", text: prompt }));
  const view = new RunView($("#chat-agent").value, turn);
  $("#chat-log").append(turn);
  chat.run = view;
  streaming(true);
  const socket = connect();
  if (socket.readyState === WebSocket.OPEN) socket.send(prompt);
  else chat.pending.push(prompt);
  scrollChat();
}

async function cancelRun() {
  const run = chat.run;
  if (!run?.id) return;
  try {
    const answer = await api(`/atmosphere/runs/${encodeURIComponent(run.id)}/cancel`, { method: "POST" });
    run.note(answer?.detail || "Cancel asked.");
  } catch (problem) {
    failed(problem);
  }
}

function scrollChat() {
  const log = $("#chat-log");
  log.scrollTop = log.scrollHeight;
}

/** One run as it streams: its answer, tool cards, approvals, sub-agents, artifacts and errors. */
class RunView {
  constructor(agent, parent, { sub = false } = {}) {
    this.agent = agent;
    this.sub = sub;
    this.id = "";
    this.lastSeq = 0;
    this.done = false;
    this.tokens = { input: 0, output: 0, total: 0 };
    this.tools = [];
    this.children = new Map();
    this.segment = null;
    this.segments = [];
    this.meta = el("div", { class: "run-meta" }, el("span", { text: sub ? `sub-agent ${agent}` : agent }));
    this.state = el("span", { class: "badge wait", text: "running" });
    this.meta.append(this.state);
    this.body = el("div", { class: sub ? "sub" : "msg agent" }, this.meta);
    parent.append(this.body);
  }

  text(chunk) {
    if (!this.segment) {
      this.segment = el("div", { class: "answer" });
      this.segments.push(this.segment);
      this.body.append(this.segment);
    }
    this.segment.textContent += chunk;
    if (!this.sub) scrollChat();
  }

  /** `ai.run.answer_rewound`: drop the answer's last `count` characters (code points), then go on. */
  rewind(count) {
    let left = count;
    for (let i = this.segments.length - 1; i >= 0 && left > 0; i--) {
      const chars = [...this.segments[i].textContent];
      const cut = Math.min(left, chars.length);
      this.segments[i].textContent = chars.slice(0, chars.length - cut).join("");
      left -= cut;
    }
    this.note("The run resumed and its answer was rewound.");
  }

  add(node) {
    this.segment = null; // text after a card goes below it
    this.body.append(node);
    if (!this.sub) scrollChat();
    return node;
  }

  note(message) {
    this.add(el("p", { class: "note", text: message }));
  }

  /** The connection's state, in the run's header (not between its words). */
  connection(message) {
    if (!this.link) {
      this.link = el("span", { class: "link-state" });
      this.meta.append(this.link);
    }
    this.link.textContent = message;
  }

  fail(message, code = "") {
    this.add(el("div", { class: "frame-error", role: "alert", text: `${message}${code ? `\n(${code})` : ""}` }));
    this.finish("error", "bad");
  }

  finish(label, tone) {
    this.done = true;
    this.state.textContent = label;
    this.state.className = `badge ${tone}`;
  }

  /** The sub-run a frame belongs to, nested under its parent's tool call. */
  child(frame) {
    let view = this.children.get(frame.runId);
    if (!view) {
      const host = [...this.tools].reverse().find((card) => !card.done && /^(task|delegate_task|delegate)/.test(card.name)) || this.tools.at(-1);
      view = new RunView(frame.agent || "sub-agent", host ? host.body : this.body, { sub: true });
      view.id = frame.runId;
      view.meta.append(el("span", { class: "mono", text: short(frame.runId) }));
      this.children.set(frame.runId, view);
    }
    return view;
  }

  handle(frame) {
    const kind = frame.event || frame.type;
    const data = frame.data;
    switch (kind) {
      case "metadata":
        return this.metadata(frame.key, frame.value);
      case "streaming-text":
        return this.text(String(data ?? ""));
      case "text-delta":
        return this.text(String(data?.text ?? ""));
      case "tool-start":
        return this.toolStart(data);
      case "tool-result":
        return this.toolEnd(data, data?.result, false);
      case "tool-error":
        return this.toolEnd(data, data?.error, true);
      case "approval-required":
        return this.approval(data);
      case "plan-update":
        if (this.sub) {
          // A sub-agent's own plan, shown where it works (the side panel is the conversation's).
          if (!this.plan) this.plan = this.add(el("div", { class: "plan" }));
          return renderPlan(this.plan, data, "");
        }
        this.note(`Plan updated (${(data?.steps || []).length} steps).`);
        return showLivePlan(data);
      case "usage":
        return this.usage(data);
      case "content":
        return this.artifact(frame);
      case "progress":
        return this.note(typeof data === "object" ? `${data.message}${data.percentage !== undefined ? ` (${data.percentage}%)` : ""}` : String(data));
      case "error":
        this.fail(String(data ?? "error"), frame.code);
        if (frame.recoverable && frame.runId && !this.id) this.note("Recoverable: send it again.");
        return;
      case "complete":
        if (data) this.note(String(data));
        return this.finish(frame.finishReason && frame.finishReason !== "stop" ? `done (${frame.finishReason})` : "done", "ok");
      case "reasoning-delta":
        return this.reasoning(data);
      default:
        if (frame.event) this.add(el("details", { class: "card" }, el("summary", { text: frame.event }), el("pre", { text: pretty(data) })));
    }
  }

  metadata(key, value) {
    if (key === "X-Atmosphere-Run-Id") {
      this.id = String(value);
      this.meta.append(el("span", { class: "mono", title: this.id, text: `run ${short(this.id)}` }));
      return;
    }
    if (key === "ai.run.answer_rewound") return this.rewind(Number(value?.discard || 0));
    if (key === "ai.run.resumed") return this.note(`The run resumed on another worker (from seq ${value?.fromSeq}).`);
    if (key === "ai.run.event_lost") return this.note("An event of this run was lost with its worker.");
    if (String(key).startsWith("ai.toolCall.delta.")) return; // the whole call follows as tool-start
    this.add(el("p", { class: "note", text: `${key}: ${pretty(value)}` }));
  }

  toolStart(data) {
    const card = { name: data?.toolName || "tool", started: performance.now(), done: false };
    card.status = el("span", { class: "badge wait", text: "running" });
    card.body = el("details", { class: "card wait", open: true }, el("summary", {}, el("span", { class: "hint", text: "tool " }), `${card.name} `, card.status), el("div", { class: "note", text: "arguments" }), el("pre", { text: pretty(data?.arguments ?? {}) }));
    card.body.dataset.tool = card.name;
    this.tools.push(card);
    this.add(card.body);
  }

  toolEnd(data, value, error) {
    const name = data?.toolName || "tool";
    let card = this.tools.find((c) => !c.done && c.name === name);
    if (!card) {
      this.toolStart({ toolName: name, arguments: {} });
      card = this.tools.at(-1);
    }
    card.done = true;
    const ms = Math.round(performance.now() - card.started);
    card.status.textContent = error ? `error · ${ms} ms` : `ok · ${ms} ms`;
    card.status.className = `badge ${error ? "bad" : "ok"}`;
    card.body.className = `card ${error ? "bad" : "ok"}`;
    card.body.append(el("div", { class: "note", text: error ? "error" : "result" }), el("pre", { text: pretty(value ?? "") }));
    this.segment = null;
  }

  approval(data) {
    const id = data?.approvalId;
    const answer = el("p", { class: "note", "aria-live": "polite" });
    const decide = async (verb, buttons) => {
      for (const button of buttons) button.disabled = true;
      try {
        const reply = await api(`/atmosphere/runs/${encodeURIComponent(chat.run?.id || this.id)}/approval`, { method: "POST", text: `/__approval/${id}/${verb}` });
        answer.textContent = reply?.accepted === false ? `Not accepted: ${reply.detail || ""}` : verb === "approve" ? "Approved." : "Denied.";
      } catch (problem) {
        answer.textContent = problem.message;
        for (const button of buttons) button.disabled = false;
      }
    };
    const approve = el("button", { type: "button", text: "Approve" });
    const deny = el("button", { type: "button", class: "danger", text: "Deny" });
    approve.addEventListener("click", () => decide("approve", [approve, deny]));
    deny.addEventListener("click", () => decide("deny", [approve, deny]));
    const pending = [...this.tools].reverse().find((card) => !card.done && card.name === data?.toolName);
    const box = pending ? pending.body : this.body;
    if (!pending) this.segment = null;
    box.append(
      el(
        "div",
        { class: "card wait approval", role: "group", "aria-label": `Approval for ${data?.toolName}` },
        el("strong", { text: `Approval needed: ${data?.toolName}` }),
        el("p", { text: data?.message || "" }),
        pending ? null : el("pre", { text: pretty(data?.arguments ?? {}) }),
        data?.expiresIn ? el("p", { class: "note", text: `Expires in ${data.expiresIn} s` }) : null,
        el("div", { class: "row" }, approve, deny),
        answer,
      ),
    );
    approve.focus({ preventScroll: true });
  }

  usage(data) {
    const input = Number(data?.input || 0);
    const output = Number(data?.output || 0);
    this.tokens.input += input;
    this.tokens.output += output;
    this.tokens.total += Number(data?.total || 0);
    const model = data?.model || session.info.runtime?.model || "";
    const price = priceOf(model);
    if (price) {
      const cached = Math.min(Number(data?.cachedInput || 0), input);
      this.cost = (this.cost || 0) + ((input - cached) * price.input + cached * price.cachedInput + output * price.output) / 1e6;
    } else if (session.info.governance?.pricing) {
      this.unpriced = model || "an unnamed model";
    }
    if (!this.usageLine) {
      this.usageLine = el("span");
      this.meta.append(this.usageLine);
    }
    const cost = this.unpriced ? ` · no price for ${this.unpriced}` : this.cost !== undefined ? ` · ≈ $${this.cost.toFixed(6)}` : "";
    this.usageLine.textContent = `tokens in ${this.tokens.input} · out ${this.tokens.output} · total ${this.tokens.total}${data?.model ? ` · ${data.model}` : ""}${cost}`;
  }

  artifact(frame) {
    const mime = frame.mimeType || "application/octet-stream";
    const name = frame.fileName || `artifact.${mime.split("/")[1] || "bin"}`;
    const box = el("figure", { class: "card artifact" });
    if (mime.startsWith("image/") && mime !== "image/svg+xml") {
      box.append(el("img", { src: `data:${mime};base64,${frame.data}`, alt: frame.fileName ? `Image ${frame.fileName}` : "Image from the run" }));
    }
    const bytes = Uint8Array.from(atob(frame.data || ""), (c) => c.charCodeAt(0));
    const link = el("a", { href: URL.createObjectURL(new Blob([bytes], { type: mime })), download: name, text: `Download ${name} (${bytes.length} bytes)` });
    box.append(el("figcaption", {}, link));
    this.add(box);
  }

  reasoning(data) {
    if (!this.thoughts) {
      this.thoughts = el("pre");
      this.add(el("details", { class: "card" }, el("summary", { text: "reasoning" }), this.thoughts));
    }
    this.thoughts.textContent += data?.redacted ? "[redacted]" : data?.text || "";
  }
}

/** The price governance charges `model` at (its pricing table, in the info): exact name, else the longest prefix. */
function priceOf(model) {
  const table = session.info.governance?.pricing?.models;
  if (!table || !model) return null;
  const name = model.trim().toLowerCase().split("/").pop();
  if (table[name]) return table[name];
  const prefix = Object.keys(table)
    .sort((a, b) => b.length - a.length)
    .find((candidate) => name.startsWith(candidate));
  return prefix ? table[prefix] : null;
}

function renderPlan(target, plan, empty) {
  if (!plan || !plan.steps?.length) {
    target.replaceChildren(el("p", { class: "hint", text: empty }));
    return;
  }
  const marks = { completed: "✓", in_progress: "▸", pending: "○" };
  target.replaceChildren(
    plan.goal ? el("p", {}, el("strong", { text: "Goal: " }), plan.goal) : "",
    el("ol", {}, ...plan.steps.map((step) => el("li", { class: step.status }, el("span", { "aria-hidden": "true", text: `${marks[step.status] || "•"} ` }), step.status === "in_progress" && step.activeForm ? step.activeForm : step.content, el("span", { class: "visually-hidden", text: ` (${step.status})` })))),
  );
}

function showLivePlan(plan) {
  chat.plan = { ...plan, agent: plan.agentId || $("#chat-agent").value };
  renderPlan($("#chat-plan"), plan, "No plan yet in this conversation.");
  if (!$("#panel-workspace").hidden) renderLivePlan();
}

// ---- workspace ------------------------------------------------------------------------------

const workspace = { path: "" };

async function loadWorkspace(event) {
  event?.preventDefault();
  try {
    const owners = await api("/api/admin/workspace/owners", { admin: true });
    const agentSelect = $("#ws-agent");
    const chosen = agentSelect.value || chat.plan?.agent || $("#chat-agent").value;
    agentSelect.replaceChildren(...owners.map((owner) => el("option", { value: owner.owner, text: owner.owner })));
    if (owners.some((owner) => owner.owner === chosen)) agentSelect.value = chosen;
    const sessionInput = $("#ws-session");
    if (!sessionInput.value && chat.plan?.conversationId) sessionInput.value = chat.plan.conversationId;
    renderLivePlan();
    if (!sessionInput.value.trim()) {
      renderPlan($("#ws-plan"), null, "Choose a conversation (the chat's fills in once it has a plan).");
      return;
    }
    if (event) workspace.path = ""; // a new agent or conversation starts at its root
    await Promise.all([loadStoredPlan(), listFiles(workspace.path)]);
  } catch (problem) {
    failed(problem);
  }
}

function renderLivePlan() {
  const plan = chat.plan;
  const same = plan && plan.agent === $("#ws-agent").value && (!$("#ws-session").value || plan.conversationId === $("#ws-session").value.trim());
  renderPlan($("#ws-live-plan"), same ? plan : null, "No live plan from the chat for this conversation.");
}

function workspaceQuery(extra = {}) {
  return query({ sessionId: $("#ws-session").value.trim(), ...extra });
}

async function loadStoredPlan() {
  const agent = encodeURIComponent($("#ws-agent").value);
  try {
    renderPlan($("#ws-plan"), await api(`/api/admin/agents/${agent}/plan${workspaceQuery()}`, { admin: true }), "The stored plan is empty.");
  } catch (problem) {
    if (problem instanceof ApiError && problem.status === 404) renderPlan($("#ws-plan"), null, "No plan stored for this conversation.");
    else throw problem;
  }
}

async function listFiles(path) {
  const agent = encodeURIComponent($("#ws-agent").value);
  workspace.path = path;
  const crumbs = [el("button", { type: "button", text: "/", onclick: () => listFiles("").catch(failed) })];
  let walked = "";
  for (const part of path.split("/").filter(Boolean)) {
    walked = walked ? `${walked}/${part}` : part;
    const target = walked;
    crumbs.push(el("button", { type: "button", text: `${part}/`, onclick: () => listFiles(target).catch(failed) }));
  }
  $("#ws-crumbs").replaceChildren(...crumbs);
  let listing;
  try {
    listing = await api(`/api/admin/agents/${agent}/files${workspaceQuery(path ? { path } : {})}`, { admin: true });
  } catch (problem) {
    if (problem instanceof ApiError && problem.status === 404) {
      $("#ws-files").replaceChildren(el("li", { class: "hint", text: "No files in this conversation yet." }));
      return;
    }
    throw problem;
  }
  const entries = listing.entries || [];
  $("#ws-files").replaceChildren(
    ...(entries.length ? entries : [null]).map((entry) =>
      entry
        ? el("li", {}, el("button", { type: "button", text: `${entry.path.split("/").pop()}${entry.directory ? "/" : ""}`, "aria-label": `${entry.directory ? "Folder" : "File"} ${entry.path.split("/").pop()}`, onclick: () => (entry.directory ? listFiles(entry.path) : showFile(entry.path)).catch(failed) }), entry.directory ? "" : el("span", { class: "hint", text: ` ${entry.size} bytes` }))
        : el("li", { class: "hint", text: "Empty folder." }),
    ),
  );
}

async function showFile(path) {
  const agent = encodeURIComponent($("#ws-agent").value);
  const file = await api(`/api/admin/agents/${agent}/files/content${workspaceQuery({ path })}`, { admin: true });
  $("#ws-file-name").textContent = path;
  $("#ws-file-name").hidden = false;
  const view = $("#ws-file");
  view.textContent = file.content ?? "";
  view.hidden = false;
}

// ---- tape -----------------------------------------------------------------------------------

const tape = { run: null, nextFromSeq: 0, steps: [] };
const tapeBase = () => (session.admin ? "/api/admin/tape/runs" : "/api/runs");

async function loadRuns(event) {
  event?.preventDefault();
  const since = $("#tape-since").value;
  const params = { agent: $("#tape-agent").value, status: $("#tape-status").value, since: since ? String(new Date(since).getTime()) : "", limit: "100" };
  if (session.admin) params.user = $("#tape-user").value.trim();
  try {
    const runs = await api(`${tapeBase()}${query(params)}`, { admin: session.admin });
    const rows = runs.map((run) =>
      el(
        "tr",
        { "data-run": run.runId },
        el("td", { text: when(run.startedAt) }),
        el("td", { text: run.agent }),
        el("td", {}, el("span", { class: `badge ${run.status === "COMPLETED" ? "ok" : run.status === "OPEN" ? "wait" : "bad"}`, text: run.status })),
        session.admin ? el("td", { text: run.owner || "" }) : null,
        el("td", { text: run.stepCount }),
        el("td", {}, el("button", { type: "button", title: run.runId, text: `${short(run.runId)}${run.parentRunId ? " (sub-run)" : ""}`, onclick: () => openRun(run.runId).catch(failed) })),
      ),
    );
    $("#tape-runs tbody").replaceChildren(...(rows.length ? rows : [el("tr", {}, el("td", { colspan: "6", class: "hint", text: "No recorded runs match." }))]));
  } catch (problem) {
    failed(problem);
  }
}

async function openRun(runId) {
  tape.run = runId;
  tape.steps = [];
  tape.nextFromSeq = 0;
  for (const row of document.querySelectorAll("#tape-runs tr")) row.classList.toggle("selected", row.dataset.run === runId);
  $("#tape-run").hidden = false;
  $("#tape-replayed").hidden = true;
  $("#tape-steps").replaceChildren();
  $("#tape-tree").replaceChildren();
  await moreSteps();
  const first = tape.runInfo;
  $("#tape-run-title").textContent = `Run ${short(runId)} · ${first?.agent || ""} · ${first?.status || ""}`;
  await drawTree(runId);
  $("#tape-run-title").scrollIntoView({ block: "nearest" });
}

async function moreSteps() {
  const page = await api(`${tapeBase()}/${encodeURIComponent(tape.run)}/steps${query({ fromSeq: tape.nextFromSeq || "", max: "500" })}`, { admin: session.admin });
  tape.runInfo = page.run;
  tape.steps.push(...page.steps);
  const start = tape.steps[0]?.ts || 0;
  $("#tape-steps").append(
    ...page.steps.map((step) => {
      let payload = step.payload;
      try {
        payload = JSON.stringify(JSON.parse(step.payload), null, 2);
      } catch {
        /* shown as stored */
      }
      const preview = step.payload.length > 110 ? `${step.payload.slice(0, 110)}…` : step.payload;
      return el("li", { value: step.seq }, el("strong", { text: step.kind }), el("span", { class: "hint", text: ` +${Math.max(0, step.ts - start)} ms ` }), step.payloadTruncated ? el("span", { class: "badge bad", text: "truncated" }) : "", el("details", {}, el("summary", { class: "mono", text: preview }), el("pre", { text: payload })));
    }),
  );
  tape.nextFromSeq = page.nextFromSeq || 0;
  $("#tape-more").hidden = !tape.nextFromSeq;
}

async function replayOf(runId) {
  return api(`${tapeBase()}/${encodeURIComponent(runId)}/replay`, { admin: session.admin });
}

/** The coordination tree: the run's parent (when it has one), the run, the runs it started. */
async function drawTree(runId) {
  const tree = await replayOf(runId);
  if (!tree.present) {
    $("#tape-tree").replaceChildren(el("p", { class: "hint", text: "The tape has not rebuilt this run." }));
    return;
  }
  const node = (run, current) => el("li", {}, current ? el("strong", { text: `${run.runId === runId ? "▶ " : ""}${short(run.runId)} · ${run.status}` }) : el("button", { type: "button", title: run.runId, text: `${short(run.runId)} · ${run.status}`, onclick: () => openRun(run.runId).catch(failed) }));
  const root = node(tree.root, true);
  if (tree.children.length) root.append(el("ul", {}, ...tree.children.map((child) => node(child, false))));
  const top = tree.root.parentRunId ? el("li", {}, el("button", { type: "button", text: `parent ${short(tree.root.parentRunId)}`, onclick: () => openRun(tree.root.parentRunId).catch(failed) }), el("ul", {}, root)) : root;
  $("#tape-tree").replaceChildren(el("ul", {}, top), tree.childrenOmitted ? el("p", { class: "hint", text: `${tree.childrenOmitted} more sub-runs not shown` }) : "");
}

async function replay() {
  const tree = await replayOf(tape.run);
  const body = $("#tape-replay-body");
  if (!tree.present) {
    body.replaceChildren(el("p", { class: "hint", text: "Nothing to replay." }));
  } else {
    const block = (run) =>
      el(
        "div",
        { class: "card" },
        el("p", { class: "run-meta", text: `${short(run.runId)} · ${run.status}${run.model ? ` · ${run.model}` : ""}${run.runtime ? ` · ${run.runtime}` : ""}` }),
        ...run.input.map((message) => el("div", { class: `msg ${message.role === "user" ? "user" : "agent"}`, text: `${message.role}: ${message.content}` })),
        ...run.tools.map((tool) => el("details", { class: "card" }, el("summary", {}, el("span", { class: "hint", text: "tool " }), tool.name), el("pre", { text: pretty(tool.arguments) }))),
        el("div", { class: "msg agent replayed-output", text: run.output || "(no text)" }),
      );
    body.replaceChildren(block(tree.root), ...tree.children.map((child) => el("div", { class: "sub" }, block(child))));
  }
  $("#tape-replayed").hidden = false;
}

async function exportRun() {
  while (tape.nextFromSeq) await moreSteps();
  const document_ = { run: tape.runInfo, steps: tape.steps, replay: await replayOf(tape.run) };
  const link = el("a", { href: URL.createObjectURL(new Blob([JSON.stringify(document_, null, 2)], { type: "application/json" })), download: `run-${tape.run}.json` });
  document.body.append(link);
  link.click();
  link.remove();
  say(`Exported run-${tape.run}.json (${tape.steps.length} steps).`);
}

// ---- governance -----------------------------------------------------------------------------

const governance = { timer: 0 };

async function loadGovernance() {
  try {
    await Promise.all([loadHealth(), loadPolicies(), loadDecisions()]);
  } catch (problem) {
    failed(problem);
  }
  live();
}

async function loadHealth() {
  const health = await api("/api/admin/governance/health", { admin: true });
  const kill = health.killSwitch || {};
  const state = $("#gov-kill-state");
  state.textContent = kill.armed ? `ARMED by ${kill.operator || "?"}: ${kill.reason || ""}` : `Disarmed · ${health.policyCount} policies in force`;
  state.classList.toggle("armed", Boolean(kill.armed));
}

async function loadPolicies() {
  const policies = await api("/api/admin/governance/policies", { admin: true });
  $("#gov-policies tbody").replaceChildren(
    ...policies.map((policy) => {
      const shadow = Object.entries(policy).filter(([key]) => key.startsWith("shadow"));
      return el(
        "tr",
        {},
        el("td", { text: policy.name }),
        el("td", { text: policy.type || policy.className || "" }),
        el("td", { text: policy.source || "" }),
        el("td", { text: policy.version || "" }),
        el("td", { class: "mono", title: policy.digest || "", text: (policy.digest || "").slice(0, 12) }),
        el("td", { text: policy.dryRun || shadow.length ? shadow.map(([key, value]) => `${key.replace(/^shadow/, "")}: ${value}`).join(", ") || "dry-run" : "" }),
      );
    }),
  );
}

async function loadDecisions(event) {
  event?.preventDefault();
  const runId = $("#gov-dec-run").value.trim();
  const rows = await api(`/api/admin/governance/decisions${query({ runId, limit: "200" })}`, { admin: true });
  const wanted = $("#gov-dec-decision").value;
  const text = $("#gov-dec-text").value.trim().toLowerCase();
  const shown = rows.filter((row) => (!wanted || (wanted === "deny" ? !row.allowed : row.allowed)) && (!text || JSON.stringify(row).toLowerCase().includes(text)));
  $("#gov-decisions tbody").replaceChildren(
    ...(shown.length ? shown : [null]).map((row) =>
      row
        ? el(
            "tr",
            {},
            el("td", { text: new Date(row.timestamp).toLocaleString() }),
            el("td", {}, el("span", { class: `badge ${row.allowed ? "ok" : "bad"}`, text: row.decision })),
            el("td", { text: row.policy_name }),
            el("td", { text: row.operation }),
            el("td", { text: row.subject }),
            el("td", { text: row.reason }),
            el("td", { class: "mono", title: row.run_id, text: short(row.run_id) }),
          )
        : el("tr", {}, el("td", { colspan: "7", class: "hint", text: "No decisions match." })),
    ),
  );
}

/** While the Governance tab is open and Live is on, the log and the switch refresh every 2 s. */
function live() {
  clearInterval(governance.timer);
  if (!$("#gov-dec-live").checked) return;
  governance.timer = setInterval(() => {
    if ($("#panel-governance").hidden || !$("#gov-dec-live").checked) return clearInterval(governance.timer);
    Promise.all([loadDecisions(), loadHealth()]).catch(failed);
  }, 2000);
}

async function killSwitch(verb) {
  const reason = $("#gov-kill-reason").value.trim();
  const operator = $("#gov-kill-operator").value.trim() || "console";
  if (verb === "arm" && !reason) {
    say("Arming needs a reason.", true);
    $("#gov-kill-reason").focus();
    return;
  }
  try {
    await api(`/api/admin/governance/kill-switch/${verb}`, { admin: true, method: "POST", body: verb === "arm" ? { reason, operator } : { operator } });
    await loadHealth();
    say(verb === "arm" ? "Kill switch armed: every admission and tool call is denied." : "Kill switch disarmed.");
  } catch (problem) {
    failed(problem);
  }
}

async function check(event) {
  event.preventDefault();
  const out = $("#gov-check-result");
  let context;
  try {
    context = JSON.parse($("#gov-check-context").value || "{}");
  } catch {
    say("The context must be a JSON object.", true);
    return;
  }
  try {
    const result = await api("/api/admin/governance/check", { admin: true, method: "POST", body: { agent_id: $("#gov-check-agent").value.trim(), action: $("#gov-check-action").value, context } });
    out.textContent = pretty(result);
  } catch (problem) {
    out.textContent = problem.message;
  }
  out.hidden = false;
}

async function reload(event) {
  event.preventDefault();
  const out = $("#gov-reload-result");
  const swapName = $("#gov-reload-name").value.trim();
  const body = swapName ? { swapName, yaml: $("#gov-reload-yaml").value } : {};
  try {
    out.textContent = pretty(await api("/api/admin/governance/reload", { admin: true, method: "POST", body }));
    await loadPolicies();
  } catch (problem) {
    out.textContent = problem.message;
  }
  out.hidden = false;
}

// ---- runtime truth --------------------------------------------------------------------------

const TITLES = { runtime: "Default runtime", harness: "Harness primitives", sandbox: "Sandbox", governance: "Governance", memorySafety: "Memory safety", ragSafety: "Retrieval safety" };

/** One line for a value of the info: lists joined, small objects inline, large ones counted. */
function summary(key, value) {
  if (value === null || value === undefined) return "none";
  if (Array.isArray(value)) {
    if (value.every((item) => typeof item !== "object" || item === null)) return value.join(", ") || "none";
    return value.map((item) => item.name || item.id || JSON.stringify(item)).join(", ");
  }
  if (typeof value === "object") {
    if (key === "pricing") return `${Object.keys(value.models || {}).length} models priced (${value.unit || ""})`;
    const entries = Object.entries(value);
    if (entries.length <= 6 && entries.every(([, item]) => typeof item !== "object" || item === null)) return entries.map(([k, item]) => `${k}: ${item}`).join(", ") || "none";
    return `${entries.length} entries (in the whole document below)`;
  }
  return String(value);
}

function facts(object) {
  return el("dl", { class: "facts" }, ...Object.entries(object).flatMap(([key, value]) => [el("dt", { text: key }), el("dd", { text: summary(key, value) })]));
}

/** Every block the services report, as they report it: a block is there only when its service says so. */
function renderInfo() {
  const info = session.info;
  const parts = [el("h2", { text: "Services answering" }), el("p", { text: (info.services || []).join(", ") || "none" })];
  if (info.pools) {
    parts.push(el("h2", { text: "Runtime pools" }));
    parts.push(
      el(
        "div",
        { class: "table-wrap" },
        el(
          "table",
          {},
          el("thead", {}, el("tr", {}, ...["Pool", "Runtime", "State", "Agents", "Capabilities"].map((h) => el("th", { scope: "col", text: h })))),
          el("tbody", {}, ...Object.entries(info.pools).map(([pool, p]) => el("tr", {}, el("td", { text: pool }), el("td", { text: p.runtime || "" }), el("td", {}, el("span", { class: `badge ${String(p.state).startsWith("ACTIVE") ? "ok" : "bad"}`, text: p.state })), el("td", { text: (p.agents || []).join(", ") }), el("td", { text: (p.capabilities || []).join(", ") })))),
        ),
      ),
    );
  }
  const plain = {};
  for (const [key, value] of Object.entries(info)) {
    if (key === "services" || key === "pools") continue;
    if (value && typeof value === "object" && !Array.isArray(value)) parts.push(el("h2", { text: TITLES[key] || key }), facts(value));
    else plain[key] = value;
  }
  if (Object.keys(plain).length) parts.push(el("h2", { text: "This stack" }), facts(plain));
  $("#info-body").replaceChildren(...parts);
  $("#info-raw").textContent = pretty(info);
}

// ---- wiring ---------------------------------------------------------------------------------

function wire() {
  $("#login-form").addEventListener("submit", signIn);
  $("#sign-out").addEventListener("click", signOut);
  $("#tabs").addEventListener("click", (event) => {
    const tab = event.target.closest('[role="tab"]');
    if (tab) select(tab.dataset.tab);
  });
  $("#tabs").addEventListener("keydown", onTabKey);
  $("#chat-form").addEventListener("submit", send);
  $("#chat-input").addEventListener("keydown", (event) => {
    if (event.key === "Enter" && !event.shiftKey && !event.isComposing) send(event);
  });
  $("#chat-cancel").addEventListener("click", cancelRun);
  $("#chat-agent").addEventListener("change", () => {
    describeAgent();
    closeSocket();
  });
  $("#chat-conversation").addEventListener("change", closeSocket);
  $("#chat-new").addEventListener("click", () => {
    closeSocket();
    $("#chat-conversation").value = newConversationId();
    $("#chat-log").replaceChildren();
    chat.plan = null;
    renderPlan($("#chat-plan"), null, "No plan yet in this conversation.");
  });
  $("#chat-setup").addEventListener("submit", (event) => event.preventDefault());
  $("#ws-form").addEventListener("submit", (event) => loadWorkspace(event));
  $("#tape-form").addEventListener("submit", loadRuns);
  $("#tape-more").addEventListener("click", () => moreSteps().catch(failed));
  $("#tape-replay").addEventListener("click", () => replay().catch(failed));
  $("#tape-export").addEventListener("click", () => exportRun().catch(failed));
  $("#gov-arm").addEventListener("click", () => killSwitch("arm"));
  $("#gov-disarm").addEventListener("click", () => killSwitch("disarm"));
  $("#gov-check-form").addEventListener("submit", check);
  $("#gov-reload-form").addEventListener("submit", reload);
  $("#gov-dec-form").addEventListener("submit", (event) => loadDecisions(event).catch(failed));
  $("#gov-dec-live").addEventListener("change", live);
  $("#chat-conversation").value = newConversationId();
}

async function start() {
  wire();
  if (session.signedIn) {
    try {
      await enter();
      return;
    } catch {
      for (const key of ["atmo.token", "atmo.adminToken", "atmo.signedIn"]) sessionStorage.removeItem(key);
    }
  }
  $("#login").hidden = false;
  $("#login-token").focus();
}

start();
