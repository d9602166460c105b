"""Every NATS subject, stream and bucket name of the system, built in one place.

Code elsewhere never spells a subject as a string literal: it calls these functions, so a
layout change is one edit here (and in `libs/bus/tests/unit/test_subjects.py`). The stream,
bucket and consumer settings are `atmosphere.bus._jetstream`'s; who may use which subject is
`atmosphere.bus.permissions`'s; docs/subjects.md describes every name for operators.

Layout (logical names; a bus with a namespace prefixes every subject with `<namespace>.`, and
every stream and bucket name with the namespace in capitals, `team.dev` → `TEAM_DEV_ATMO_EVENTS`):

| subject                      | kind                                   |
|------------------------------|----------------------------------------|
| `atmo.submit.<agent>`        | a `RunSubmission`, captured by `ATMO_RUNS` (a work queue) |
| `atmo.submit.nested.<n>.<agent>` | a sub-run's `RunSubmission`, `n` levels below a top-level run |
| `atmo.submit[.nested.<n>].pool.<pool>.<agent>` | the same for an agent pinned to a runtime: its pool's queue |
| `atmo.run.<run_id>.evt`      | every `RunEvent`, captured by `ATMO_EVENTS` |
| `atmo.run.<run_id>.probe`    | a run's event writer checking what `ATMO_EVENTS` stored (no event) |
| `atmo.run.<run_id>.ctl`      | request/reply `Control` to the owning worker |
| `atmo.journal.<run_id>`      | a durable run's `JournalRecord`s, in `ATMO_JOURNAL` (one writer per run) |
| `atmo.tool.<tool>`           | request/reply `ToolCall` → `ToolReply` |
| `atmo.sandbox.<instance>.tool.<tool>` | a run's further calls of a tool whose session that sandbox holds |
| `atmo.sandbox.<instance>.release` | a `ToolCall` naming a run that ended: its sessions are torn down |
| `atmo.gov.<op>`              | request/reply to governance (`admin.<op>` for the admin surface) |
| `atmo.govlog.<kind>`         | governance's log of record, in `ATMO_GOVERNANCE` |
| `atmo.mem.<op>`              | request/reply to memory |
| `atmo.mem.tool.<tool>`       | the harness tools memory serves (`write_todos`, files) |
| `atmo.memlog.write`          | memory's log of record (`MemoryWrite`), in `ATMO_MEMORY` |
| `atmo.conv.closed`           | a `ConversationClosed` event (fact extraction) |
| `atmo.tape.<op>`             | request/reply to tape |
| `atmo.svc.<service>.health`  | request/reply health |
| `atmo.svc.<service>.info`    | request/reply runtime-truth fragment |

Harness tools have a subject of their own (not `atmo.tool.<tool>`) so that a user tool with
the same name, served by the sandbox, never shares a subject with the built-in one.

A sub-run (delegation) is queued by its nesting level, and each level has its own worker
consumer: a parent holding a worker slot while it waits for its child can never take the slot
the child needs.

Submissions live under `atmo.submit.*` rather than `atmo.run.submit.*`: JetStream refuses two
streams whose subject filters overlap, and `atmo.run.submit.>` overlaps `atmo.run.*.evt`.
"""

from __future__ import annotations

import re

ROOT = "atmo"

RUNS_STREAM = "ATMO_RUNS"
EVENTS_STREAM = "ATMO_EVENTS"
JOURNAL_STREAM = "ATMO_JOURNAL"
"""The effect journal of durable runs: one subject per run, one writer at a time."""
MEMORY_LOG_STREAM = "ATMO_MEMORY"
"""Every write to memory, in order: the store of record each memory replica applies to its own store."""
GOVERNANCE_LOG_STREAM = "ATMO_GOVERNANCE"
"""Every decision and state change of governance, in order: each governance replica applies all of it."""
AGENTS_BUCKET = "ATMO_AGENTS"
TOOLS_BUCKET = "ATMO_TOOLS"
CONVERSATIONS_BUCKET = "ATMO_CONVERSATIONS"
"""Ingress's record of each open conversation: which replica saw it last, and who announces its end."""
COMPLETIONS_BUCKET = "ATMO_COMPLETIONS"
"""Ingress's record of OpenAI completions a retry may attach to (an `Idempotency-Key`, an SDK's retry)."""
TOOL_RESULTS_BUCKET = "ATMO_TOOL_RESULTS"
"""Object bucket: tool results too large for one message, from sandbox to dispatch."""

# A token is what sits between two dots: no dot, no wildcard, no whitespace, bounded length.
_TOKEN = re.compile(r"[A-Za-z0-9_\-:@]{1,128}")
# A namespace may hold several tokens (`tenant.dev`); it is validated token by token.
_NAMESPACE_TOKEN = re.compile(r"[A-Za-z0-9_\-]{1,64}")


def token(value: str, *, what: str = "subject token") -> str:
    """Return `value` if it is safe as one subject token, else raise `ValueError`.

    Agent names, run ids and tool names end up inside subjects; a dot, a space or a wildcard
    there would change which subscribers receive the message.
    """
    if not _TOKEN.fullmatch(value):
        msg = f"invalid {what} {value!r}: use 1-128 letters, digits, '_', '-', ':' or '@'"
        raise ValueError(msg)
    return value


def validate_namespace(namespace: str) -> str:
    """Return `namespace` ("" for none) if every dotted part of it is a safe token."""
    if namespace and not all(_NAMESPACE_TOKEN.fullmatch(t) for t in namespace.split(".")):
        msg = f"invalid bus namespace {namespace!r}"
        raise ValueError(msg)
    return namespace


def run_submit(agent: str, *, level: int = 0, pool: str = "") -> str:
    """Where a `RunSubmission` for `agent` is published (stream `ATMO_RUNS`); `level` > 0 for sub-runs.

    `pool` is the dispatch pool that runs the agent (its pinned runtime); "" is the default pool.
    """
    name = token(agent, what="agent name")
    return f"{run_submit_queue(level, pool)}.{name}"


def run_submit_level(level: int, pool: str = "") -> str:
    """The filter of the submissions of one nesting level (0: top-level runs) of one pool, whatever the agent.

    No two filters overlap, as consumers of a work-queue stream must not: the default pool's are
    `atmo.submit.*` and `atmo.submit.nested.<n>.*`, a pool's `atmo.submit.pool.<pool>.*` and
    `atmo.submit.nested.<n>.pool.<pool>.*` (a token more, and `pool` where the others have an agent).
    """
    return f"{run_submit_queue(level, pool)}.*"


def run_submit_queue(level: int, pool: str = "") -> str:
    """The subject prefix of one pool's queue at one nesting level (an agent's name follows it)."""
    base = f"{ROOT}.submit" if level == 0 else _nested(level)
    return f"{base}.pool.{token(pool, what='dispatch pool')}" if pool else base


def _nested(level: int) -> str:
    if level < 1:
        msg = f"a nesting level is 0 or more, not {level}"
        raise ValueError(msg)
    return f"{ROOT}.submit.nested.{level}"


def run_submit_all() -> str:
    """The filter of every submission, whatever the agent."""
    return f"{ROOT}.submit.>"


def run_events(run_id: str) -> str:
    """Where every `RunEvent` of `run_id` is published (stream `ATMO_EVENTS`)."""
    return f"{ROOT}.run.{token(run_id, what='run id')}.evt"


def run_events_all() -> str:
    """The filter of every run's events."""
    return f"{ROOT}.run.*.evt"


def run_probe(run_id: str) -> str:
    """Where a run's event writer checks that what it sent was stored (`ATMO_EVENTS`, not events)."""
    return f"{ROOT}.run.{token(run_id, what='run id')}.probe"


def run_probes_all() -> str:
    """The filter of every run's probes."""
    return f"{ROOT}.run.*.probe"


def run_journal(run_id: str) -> str:
    """Where the effect journal of `run_id` is appended (stream `ATMO_JOURNAL`)."""
    return f"{ROOT}.journal.{token(run_id, what='run id')}"


def run_journal_all() -> str:
    """The filter of every run's journal."""
    return f"{ROOT}.journal.*"


def run_control(run_id: str) -> str:
    """Where `Control` requests (cancel, approvals) for `run_id` are sent."""
    return f"{ROOT}.run.{token(run_id, what='run id')}.ctl"


def tool(name: str) -> str:
    """Where a `ToolCall` for the tool `name` is sent."""
    return f"{ROOT}.tool.{token(name, what='tool name')}"


def mcp_tool(server: str) -> str:
    """Where a `ToolCall` of any tool of the MCP server `server` is sent (the sandbox holds its session).

    One token, `mcp:<server>` (no `@tool` name has a colon), so it is a tool subject like the others.
    """
    return f"{ROOT}.tool.mcp:{token(server, what='MCP server name')}"


def sandbox_session_tool(instance: str, name: str) -> str:
    """Where a run's further calls of a tool go once a sandbox instance holds its session.

    The instance is the one a `ToolReply.session_instance` named.
    """
    return f"{ROOT}.sandbox.{token(instance, what='sandbox instance')}.tool.{token(name, what='tool name')}"


def sandbox_release(instance: str) -> str:
    """Where a run's end is announced to the sandbox instance holding its sessions.

    The message is a `ToolCall` naming the run and the tool.
    """
    return f"{ROOT}.sandbox.{token(instance, what='sandbox instance')}.release"


def governance(op: str) -> str:
    """A governance operation, e.g. `governance("admit")`; dotted ops (`admin.reload`) are validated token by token."""
    return f"{ROOT}.gov.{_dotted(op)}"


def memory(op: str) -> str:
    """A memory operation; dotted ops (`history.load`) are validated token by token."""
    return f"{ROOT}.mem.{_dotted(op)}"


def memory_log() -> str:
    """Where memory stores a write (`MemoryWrite`) in `ATMO_MEMORY` before applying it."""
    return f"{ROOT}.memlog.write"


def governance_log(kind: str) -> str:
    """Where governance stores an entry of its log (`kind`: `decision`, `run_settled`, `kill_switch`, `reload`)."""
    return f"{ROOT}.govlog.{token(kind, what='log entry kind')}"


def governance_log_all() -> str:
    """The filter of every entry of governance's log."""
    return f"{ROOT}.govlog.*"


def memory_tool(name: str) -> str:
    """Where a `ToolCall` for the harness tool `name` (served by memory) is sent."""
    return f"{ROOT}.mem.tool.{token(name, what='tool name')}"


def memory_tools_all() -> str:
    """Every harness tool subject (memory's subscription)."""
    return f"{ROOT}.mem.tool.*"


def conversation_closed() -> str:
    """Where ingress announces that a conversation ended."""
    return f"{ROOT}.conv.closed"


def tape(op: str) -> str:
    """A tape operation, e.g. `tape("steps")`."""
    return f"{ROOT}.tape.{_dotted(op)}"


def service_health(service: str) -> str:
    """The health responder of `service`."""
    return f"{ROOT}.svc.{token(service, what='service name')}.health"


def service_info(service: str) -> str:
    """The runtime-truth responder of `service`."""
    return f"{ROOT}.svc.{token(service, what='service name')}.info"


def _dotted(op: str) -> str:
    return ".".join(token(part, what="operation") for part in op.split("."))


def matches(pattern: str, subject: str) -> bool:
    """Whether `subject` matches `pattern` with NATS wildcard rules.

    `*` matches exactly one token, `>` matches one or more trailing tokens.
    """
    p_tokens = pattern.split(".")
    s_tokens = subject.split(".")
    for i, p in enumerate(p_tokens):
        if p == ">":
            return len(s_tokens) > i
        if i >= len(s_tokens) or (p != "*" and p != s_tokens[i]):
            return False
    return len(p_tokens) == len(s_tokens)


def overlaps(a: str, b: str) -> bool:
    """Whether some subject could match both filters `a` and `b` (as JetStream checks)."""
    a_tokens, b_tokens = a.split("."), b.split(".")
    for i in range(max(len(a_tokens), len(b_tokens))):
        ta = a_tokens[i] if i < len(a_tokens) else None
        tb = b_tokens[i] if i < len(b_tokens) else None
        if ta == ">" or tb == ">":
            return ta is not None and tb is not None
        if ta is None or tb is None:
            return False
        if ta != tb and "*" not in (ta, tb):
            return False
    return True
