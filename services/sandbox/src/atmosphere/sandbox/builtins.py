"""The sandbox's own tools, `code_exec` and `eval`: offered only where they really run.

Each is off unless its setting enables it (`ATMOSPHERE_AI_CODE_ENABLED`, `ATMOSPHERE_AI_EVAL_ENABLED`)
*and* its backend proves itself at start: a bubblewrap sandbox (or a container engine) actually
started with the isolation flags, a V8 worker actually evaluated `1+1`. Only then is the tool's
descriptor written to `ATMO_TOOLS` (where dispatch finds it and offers it to every agent); otherwise
the descriptor is deleted, so a sandbox restarted without the tool takes it away. Either way the
service's info says which, with the reason: `{"code_exec": "ACTIVE(bwrap)", "eval": "INACTIVE(disabled)"}`.

`code_exec` keeps one session per run (its workspace files) on this instance: a reply names the
instance (`ToolReply.session_instance`), dispatch sends the run's later calls to
`atmo.sandbox.<instance>.tool.code_exec` and, at the run's end, a release to
`atmo.sandbox.<instance>.release`; sessions nobody releases are reaped when idle.
"""

from __future__ import annotations

import contextlib
import json
import logging
import tempfile
import uuid
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from atmosphere.bus import Bus, MessageContext, Router, subjects
from atmosphere.bus.sizes import DEFAULT_MAX_PAYLOAD, clip, data_budget
from atmosphere.contracts.tool.v1.tool_pb2 import ToolCall, ToolDescriptor, ToolReply
from atmosphere.sandbox import metrics
from atmosphere.sandbox.code import make_backend
from atmosphere.sandbox.code.availability import Availability
from atmosphere.sandbox.code.availability import probe as probe_code
from atmosphere.sandbox.code.sessions import CodeSessions
from atmosphere.sandbox.code.tool import CODE_EXEC_TOOL, code_exec_descriptor, run_code_exec
from atmosphere.sandbox.js.pool import EvalPool
from atmosphere.sandbox.js.tool import EVAL_TOOL, eval_descriptor, run_eval
from atmosphere.sandbox.settings import SandboxSettings
from atmosphere.sdk import Tool
from atmosphere.service import AppLoadError

log = logging.getLogger("atmosphere.sandbox")


@dataclass
class Builtins:
    """What this instance offers of its own, and the state behind it."""

    instance: str
    code: Availability
    eval_label: str
    sessions: CodeSessions | None = None
    pool: EvalPool | None = None
    code_offer: ToolDescriptor | None = None
    eval_offer: ToolDescriptor | None = None
    max_reply_bytes: int = data_budget(DEFAULT_MAX_PAYLOAD)
    """The most a reply may carry (the bus's message size less the envelope dispatch wraps around it)."""

    def info(self) -> dict[str, Any]:
        """The runtime-truth fragment: each tool's state, as the backends reported it at start."""
        return {"code_exec": self.code.label, "eval": self.eval_label}

    def offered(self) -> dict[str, ToolDescriptor | None]:
        """Each built-in tool's descriptor, or None when it is not offered here."""
        return {CODE_EXEC_TOOL: self.code_offer, EVAL_TOOL: self.eval_offer}

    async def publish(self, bus: Bus) -> None:
        """Write the offered tools' descriptors and delete the others' (a restart can take a tool away)."""
        self.max_reply_bytes = data_budget(bus.max_payload)
        for name, descriptor in self.offered().items():
            if descriptor is not None:
                await bus.kv_put(subjects.TOOLS_BUCKET, name, descriptor)
            else:
                await bus.kv_delete(subjects.TOOLS_BUCKET, name)

    def router(self) -> Router:
        """The subjects of the offered tools (and of this instance's code sessions)."""
        router = Router()
        if self.sessions is not None:
            router.add(subjects.tool(CODE_EXEC_TOOL), ToolCall, self._code_exec)
            router.add(subjects.sandbox_session_tool(self.instance, CODE_EXEC_TOOL), ToolCall, self._code_exec)
            router.add(subjects.sandbox_release(self.instance), ToolCall, self._release)
        if self.pool is not None:
            router.add(subjects.tool(EVAL_TOOL), ToolCall, self._eval)
        return router

    async def _code_exec(self, call: ToolCall, _ctx: MessageContext) -> ToolReply:
        assert self.sessions is not None
        reply = _fitting(await run_code_exec(self.sessions, call), self.max_reply_bytes)
        reply.session_instance = self.instance  # this run's later calls come here, to its files
        return reply

    async def _release(self, call: ToolCall, _ctx: MessageContext) -> None:
        assert self.sessions is not None
        if call.run_id:
            await self.sessions.release(call.run_id)

    async def _eval(self, call: ToolCall, _ctx: MessageContext) -> ToolReply:
        assert self.pool is not None
        return await run_eval(self.pool, call)


def _fitting(reply: ToolReply, max_bytes: int) -> ToolReply:
    """`reply`, without the artifact events that would make it too large for one bus message.

    An 8 MiB image is ~11 MiB of data URI: such artifacts are dropped (the agent step stays) and
    the result says how many, rather than the whole call failing to arrive.
    """
    if reply.ByteSize() <= max_bytes:
        return reply
    kept = [e for e in reply.events if e.WhichOneof("kind") == "agent_step"]
    dropped = len(reply.events) - len(kept)
    del reply.events[:]
    reply.events.extend(kept)
    with contextlib.suppress(ValueError, TypeError):
        content = json.loads(reply.content)
        content["artifactsOmitted"] = dropped
        content["artifactsOmittedReason"] = "too large to stream in one message"
        reply.content = json.dumps(content)
    if reply.ByteSize() > max_bytes:  # the output itself (capped per stream) is too large: cut it
        reply.content = clip(reply.content, max_bytes // 2, "the result of code_exec")
        reply.truncated = True
    return reply


def _remove_empty(root: Path) -> None:
    """Remove this instance's (by then empty: every session cleaned its own) workspace root."""
    with contextlib.suppress(OSError):
        root.rmdir()


def _refuse_clashes(builtins: Builtins, tools: Mapping[str, Tool[Any, Any]]) -> None:
    clashing = sorted(name for name, d in builtins.offered().items() if d is not None and name in tools)
    if clashing:
        names = ", ".join(clashing)
        msg = (
            f"the app's tool(s) {names} clash with the sandbox's own (enabled by ATMOSPHERE_AI_*_ENABLED); rename them"
        )
        raise AppLoadError(msg)


@contextlib.asynccontextmanager
async def sandbox_builtins(
    settings: SandboxSettings, tools: Mapping[str, Tool[Any, Any]], *, instance: str | None = None
) -> AsyncIterator[Builtins]:
    """Probe the backends, start what is enabled and works, and stop it all (0 processes left) on exit."""
    instance = instance or uuid.uuid4().hex[:12]
    code = await probe_code(settings.code)
    async with contextlib.AsyncExitStack() as stack:
        builtins = Builtins(instance=instance, code=code, eval_label="INACTIVE(disabled)")
        if code.active:
            # Under the temp dir, not the data dir: the sandbox's uid must be able to pass every
            # directory above a workspace, and a data dir (or a test's tmp dir) is often 0700.
            root = Path(tempfile.gettempdir()) / f"atmosphere-code-{instance}"
            root.mkdir(mode=0o711)
            root.chmod(0o711)  # whatever the umask
            stack.callback(_remove_empty, root)
            sessions = CodeSessions(make_backend(settings.code, code, root), settings.code)
            stack.push_async_callback(sessions.close)
            metrics.observe_code_sessions(sessions)
            builtins.sessions = sessions
            builtins.code_offer = code_exec_descriptor(settings.code, sessions.languages())
        if settings.eval.enabled:
            pool = EvalPool(settings.eval)
            stack.push_async_callback(pool.close)
            label = await pool.start()
            builtins.eval_label = label
            if label.startswith("ACTIVE"):
                builtins.pool = pool
                builtins.eval_offer = eval_descriptor(settings.eval)
        _refuse_clashes(builtins, tools)
        log.info("sandbox %s: code_exec %s, eval %s", instance, code.label, builtins.eval_label)
        yield builtins
