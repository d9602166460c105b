"""Where the tool choke point sends the calls it does not run itself: the sandbox (and memory), behind a port.

`SandboxPort` is what the `ToolGateway` needs of the tools that run elsewhere: deliver one
call and get its reply, read back a result too large for one reply, and let go of the run's
sessions when the run ends. `BusSandbox` does it over the bus: user tools on
`atmo.tool.<name>` (any sandbox replica, or the one holding the run's session of the tool),
the harness's plan and file tools on `atmo.mem.tool.<name>` (memory).
"""

from __future__ import annotations

import logging
import uuid
from typing import Protocol

from atmosphere.bus import Bus, BusError, NoRespondersError, RequestTimeoutError, subjects
from atmosphere.contracts.tool.v1.tool_pb2 import ToolCall, ToolReply
from atmosphere.sdk.runtime import ToolSpec

log = logging.getLogger("atmosphere.dispatch")

TOOL_REPLY_GRACE = 2.0
"""Seconds past a tool's deadline dispatch still waits for the sandbox's own answer (its timeout error)."""


class SandboxPort(Protocol):
    """The tools of one run that execute outside dispatch."""

    async def call(self, subject: str, request: ToolCall, spec: ToolSpec) -> ToolReply:
        """The reply to `request` sent on `subject` (raises `BusError` when none came)."""
        ...

    async def stored_result(self, name: str) -> str:
        """A result stored as an object because one reply could not carry it (raises `BusError`)."""
        ...

    async def release_sessions(self) -> None:
        """The run ended: its sessions may go (never fails)."""
        ...


class BusSandbox:
    """The sandbox and memory over the bus, for one run: its sessions, its stored results."""

    def __init__(self, bus: Bus, run_id: str) -> None:
        """Send the calls of run `run_id` over `bus`."""
        self.bus = bus
        self.run_id = run_id
        self.sessions: dict[str, str] = {}
        """The sandbox instance holding this run's session of a tool, by tool (`ToolReply.session_instance`)."""

    async def call(self, subject: str, request: ToolCall, spec: ToolSpec) -> ToolReply:
        """The tool's reply, from the sandbox holding the run's session of it if one does.

        The wait is the tool's deadline plus `TOOL_REPLY_GRACE`: the sandbox enforces the deadline
        itself and answers with its own error, so no reply by then means the sandbox that took the
        call is gone (killed, partitioned). An idempotent tool is then called once more, on whichever
        replica takes it; any other tool's call is an error for the model, never a hung run.
        """
        reply = await self._delivered(subject, request, spec)
        if reply.session_instance:
            self.sessions[request.name] = reply.session_instance
        return reply

    async def _delivered(self, subject: str, request: ToolCall, spec: ToolSpec) -> ToolReply:
        name = request.name
        timeout = spec.timeout + TOOL_REPLY_GRACE
        instance = self.sessions.get(name)
        if instance is not None:
            try:
                return await self.bus.request(
                    subjects.sandbox_session_tool(instance, name), request, ToolReply, timeout=timeout
                )
            except NoRespondersError:
                log.warning("run %s: the sandbox holding its %s session is gone; starting anew", self.run_id, name)
                del self.sessions[name]
        try:
            return await self.bus.request(subject, request, ToolReply, timeout=timeout)
        except RequestTimeoutError:
            if not spec.idempotent:
                raise
            log.warning("run %s: no reply to idempotent %s; calling it once more", self.run_id, name)
            return await self.bus.request(subject, request, ToolReply, timeout=timeout)

    async def stored_result(self, name: str) -> str:
        """A result the sandbox stored as an object because one message could not carry it.

        Read once, then deleted: nobody else needs it (the bucket's max age clears what a crash
        between the two leaves behind).
        """
        try:
            data = await self.bus.object_get(subjects.TOOL_RESULTS_BUCKET, name)
        finally:
            try:
                await self.bus.object_delete(subjects.TOOL_RESULTS_BUCKET, name)
            except BusError as exc:
                log.debug("run %s: the stored result %s was not deleted (%s)", self.run_id, name, exc)
        if data is None:
            msg = "it is no longer stored"
            raise BusError(msg)
        return data.decode("utf-8", errors="replace")

    async def release_sessions(self) -> None:
        """Tell each sandbox holding a session of this run that the run ended (at most once; never fails).

        A release that does not arrive is not lost work: the sandbox reaps idle sessions after
        `ATMOSPHERE_AI_CODE_SANDBOXTTLSECONDS`.
        """
        sessions, self.sessions = self.sessions, {}
        for tool, instance in sessions.items():
            release = ToolCall(name=tool, run_id=self.run_id, call_id=uuid.uuid4().hex)
            try:
                await self.bus.publish(subjects.sandbox_release(instance), release)
            except (BusError, ValueError) as exc:
                log.debug("run %s: the release of its %s session was not sent (%s)", self.run_id, tool, exc)
