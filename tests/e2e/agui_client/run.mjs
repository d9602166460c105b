// Drive an AG-UI server once with the official @ag-ui/client HttpAgent.
//
// stdin : ONE JSON object
//   {url, token?, threadId, runId, messages?, state?, resume?, forwardedProps?, tools?, context?}
// stdout: one JSON line per event, as the client delivered it to its subscriber
//   (after the client's schema enforcement and event-order verification):
//     {"event": {...}}
//   then exactly one final line:
//     {"done": true, "state": ..., "messages": [...], "error": null | "...",
//      "result": ..., "pendingInterrupts": [...], "httpStatus": null | <int>, "warnings": [...]}
//   optional extra stdin field: pendingInterrupts (see below).
// exit  : 0 whenever the run was attempted (failures go in "error");
//         2 for bad stdin, 1 for any other harness bug.
//
// `resume` is a first-class field of RunAgentParameters in @ag-ui/client 1.0.0
// (AbstractAgent.prepareRunAgentInput copies parameters.resume into RunAgentInput.resume),
// so no subclassing is needed.

import { HttpAgent } from "@ag-ui/client";

// Keep stdout pure JSON lines: anything the library (or debug logging) prints goes to stderr.
for (const name of ["log", "info", "debug"]) {
  console[name] = (...args) => console.error(...args);
}
// The client reports non-fatal problems only via console.warn (dropped unknown events, stripped
// unknown fields, null->absent compat conversions, a STATE_DELTA patch that failed to apply).
// Collect them for the final line; still echo them to stderr.
const warnings = [];
const origWarn = console.warn.bind(console);
console.warn = (...args) => {
  warnings.push(args.map((a) => (typeof a === "string" ? a : String(a))).join(" "));
  origWarn(...args);
};

const out = (obj) => process.stdout.write(JSON.stringify(obj) + "\n");

async function readStdin() {
  const chunks = [];
  for await (const chunk of process.stdin) chunks.push(chunk);
  return Buffer.concat(chunks).toString("utf8");
}

function usage(msg) {
  process.stderr.write(`run.mjs: ${msg}\n`);
  process.exit(2);
}

const raw = await readStdin();
let spec;
try {
  spec = JSON.parse(raw);
} catch (e) {
  usage(`stdin is not JSON: ${e.message}`);
}
if (!spec || typeof spec !== "object" || Array.isArray(spec)) usage("stdin must be one JSON object");
if (typeof spec.url !== "string" || !spec.url) usage('"url" (string) is required');

const headers = {};
if (spec.token) headers.Authorization = `Bearer ${spec.token}`;

const agent = new HttpAgent({
  url: spec.url,
  headers,
  threadId: spec.threadId,
  initialMessages: spec.messages ?? [],
  initialState: spec.state ?? {},
});

// Optional: interrupts left open by a previous run of "the same" agent. The client then checks,
// before sending, that `resume` addresses every one of them (AbstractAgent.onInitialize).
if (Array.isArray(spec.pendingInterrupts)) agent.pendingInterrupts = spec.pendingInterrupts;

const params = {};
if (spec.runId !== undefined) params.runId = spec.runId;
if (spec.forwardedProps !== undefined) params.forwardedProps = spec.forwardedProps;
if (spec.resume !== undefined) params.resume = spec.resume;
if (spec.tools !== undefined) params.tools = spec.tools;
if (spec.context !== undefined) params.context = spec.context;

let error = null;
let httpStatus = null;
let terminal = null; // "RUN_FINISHED" | "RUN_ERROR"
let result;

const subscriber = {
  onEvent({ event }) {
    out({ event });
    if (event.type === "RUN_FINISHED") terminal = "RUN_FINISHED";
    if (event.type === "RUN_ERROR") {
      terminal = "RUN_ERROR";
      error ??= `RUN_ERROR: ${event.message}${event.code ? ` (code=${event.code})` : ""}`;
    }
  },
};

try {
  const res = await agent.runAgent(params, subscriber);
  result = res?.result;
  if (error === null && terminal === null) {
    error = "harness: stream ended without RUN_FINISHED or RUN_ERROR";
  }
} catch (e) {
  // HTTP errors: the client throws Error("HTTP <status>: <body>") with .status and .payload.
  // Verification / schema errors: AGUIError / ZodError with a message.
  if (e && typeof e === "object" && typeof e.status === "number") httpStatus = e.status;
  const name = e?.name && e.name !== "Error" ? `${e.name}: ` : "";
  let msg;
  if (Array.isArray(e?.issues)) {
    // zod schema failure on an incoming event (or on the outgoing RunAgentInput)
    msg = `${name}${e.issues.map((i) => `${(i.path ?? []).join(".") || "<root>"}: ${i.message}`).join("; ")}`;
  } else {
    msg = `${name}${e?.message ?? String(e)}`;
  }
  // undici's "fetch failed" hides the reason (ECONNREFUSED, ...) in .cause
  if (e?.cause) msg += ` (cause: ${[e.cause.code, e.cause.message ?? String(e.cause)].filter(Boolean).join(" ")})`;
  error = error === null ? msg : `${error}; then ${msg}`;
}

out({
  done: true,
  state: agent.state ?? null,
  messages: agent.messages ?? [],
  error,
  result: result ?? null,
  pendingInterrupts: agent.pendingInterrupts ?? [],
  httpStatus,
  warnings,
});
process.exitCode = 0;
