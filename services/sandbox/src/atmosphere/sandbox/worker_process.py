"""One tool worker, seen from the sandbox: its process, its pipes, its calls in flight, its end.

`WorkerProcess.start` spawns `python -m atmosphere.sandbox.tool_worker` in a session of its own
(the terminal's Ctrl-C reaches the sandbox, which drains first, not the workers) and waits for
its `ready`. `call` sends one call and waits for the answer until the call's hard deadline (the
tool's timeout plus `grace`): a worker that has not answered by then is wedged (a tool blocking
its event loop, or holding the GIL in C code) and is killed. However the process ends (killed
for a deadline, over its memory, crashed, broke the protocol, stopped), every call still in
flight on it gets an `Error: ...` that names its tool and what happened, and `ended` resolves.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import signal
import sys
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Final

from atmosphere.contracts.tool.v1.tool_pb2 import ToolCall
from atmosphere.sandbox import metrics
from atmosphere.sandbox.frames import (
    HEADER_ROOM,
    FrameError,
    decode_text,
    encode_text,
    pack,
    pipe_reader,
    pipe_writer,
    read_frame,
)
from atmosphere.sandbox.outcome import ResultLimits, ToolOutcome
from atmosphere.sandbox.worker_memory import MemoryCgroup, watch_resident_memory
from atmosphere.sandbox.worker_output import OutputLog
from atmosphere.sandbox.worker_stops import Crashed, Deadline, OverMemory, Protocol, Retired, Stop
from atmosphere.sdk import Tool

log = logging.getLogger("atmosphere.sandbox")

_KINDS: Final = frozenset({"result", "error", "approval"})
_KILL_REASONS: Final[dict[type[Stop], str]] = {
    Deadline: "timeout",
    OverMemory: "memory",
    Crashed: "crashed",
    Protocol: "protocol",
}
"""How `atmosphere_sandbox_kills_total` names a worker's end (closing and recycling are no kills)."""
_READ_AFTER_EXIT: Final = 1.0
"""Seconds to keep reading a dead worker's pipes (what it wrote just before it ended)."""
_REPORTED: set[str] = set()
"""Why workers had no memory cgroup, as already logged."""


class WorkerStartError(Exception):
    """A tool worker could not start (the app failed to import there, it died, or it was too slow)."""


@dataclass(frozen=True, slots=True)
class WorkerSpec:
    """How to start a tool worker, the same for every worker of a pool."""

    app: str
    app_dir: Path
    env: Mapping[str, str]
    memory_bytes: int
    max_content_bytes: int
    """The largest text a reply frame carries; a larger frame is a broken worker."""
    grace: float = 1.0
    """Seconds past a call's deadline before its worker counts as wedged and is killed."""
    use_cgroup: bool = True
    start_timeout: float = 30.0
    stop_timeout: float = 2.0
    max_request_bytes: int = 64 * 1024 * 1024 + HEADER_ROOM


@dataclass(slots=True)
class _Pending:
    tool: str
    future: asyncio.Future[ToolOutcome]


class WorkerProcess:
    """A started tool worker; `ready` while it takes calls."""

    def __init__(
        self,
        label: str,
        spec: WorkerSpec,
        process: asyncio.subprocess.Process,
        pipes: tuple[asyncio.StreamWriter, asyncio.StreamReader, asyncio.ReadTransport],
        cgroup: MemoryCgroup | None,
    ) -> None:
        """Own `process` (just spawned), talking to it over `pipes`; use `start` instead."""
        loop = asyncio.get_running_loop()
        self.label = label
        self.spec = spec
        self.process = process
        self._requests, self._replies, self._replies_transport = pipes
        self.cgroup = cgroup
        self.output = OutputLog(label)
        self.tools: frozenset[str] = frozenset()
        self.ended: asyncio.Future[Stop] = loop.create_future()
        """Resolves with why the worker ended, once its calls in flight are answered."""
        self.retired = asyncio.Event()
        """Set when the worker stops taking calls to be replaced (it ends once its calls are done)."""
        self._started_at = loop.time()
        self._stop: Stop | None = None
        self._pending: dict[int, _Pending] = {}
        self._ids = itertools.count(1)
        self._drains = [
            asyncio.create_task(self.output.drain(_piped(process.stdout), "stdout")),
            asyncio.create_task(self.output.drain(_piped(process.stderr), "stderr")),
        ]
        self._tasks: set[asyncio.Task[Any]] = set()

    @classmethod
    async def start(cls, spec: WorkerSpec, label: str) -> WorkerProcess:
        """A worker that said `ready`; `WorkerStartError` when it cannot get there."""
        cgroup = MemoryCgroup.create(spec.memory_bytes) if spec.use_cgroup else "none was asked for"
        requests_read, requests_write = os.pipe()
        replies_read, replies_write = os.pipe()
        try:
            process = await asyncio.create_subprocess_exec(
                *_command(spec, requests_read, replies_write, cgroup),
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                env=dict(spec.env),
                pass_fds=(requests_read, replies_write),
                start_new_session=True,
            )
        except BaseException:
            os.close(requests_write)
            os.close(replies_read)
            if isinstance(cgroup, MemoryCgroup):
                await cgroup.dispose()
            raise
        finally:  # the child's ends of the pipes
            os.close(requests_read)
            os.close(replies_write)
        # Cancelled (the pool is closing) between the spawn and the worker, nothing is left running.
        # Each pipe end is the stream's once it is being wrapped (asyncio closes it on failure).
        writer: asyncio.StreamWriter | None = None
        try:
            writer = await pipe_writer(requests_write)
            pipes = (writer, *(await pipe_reader(replies_read)))
        except BaseException:
            if writer is None:
                os.close(replies_read)
            else:
                writer.close()
            await asyncio.shield(_discard(process, cgroup))
            raise
        worker = cls(label, spec, process, pipes, cgroup if isinstance(cgroup, MemoryCgroup) else None)
        try:
            await worker._handshake(cgroup if isinstance(cgroup, str) else "")
        except asyncio.CancelledError:  # the pool is closing: no worker is left half-started
            await asyncio.shield(worker._abandon("cancelled"))
            raise
        return worker

    @property
    def pid(self) -> int:
        """The worker's process id."""
        return self.process.pid

    @property
    def ready(self) -> bool:
        """Whether it takes new calls."""
        return not self.retired.is_set() and self._stop is None and not self.ended.done()

    @property
    def load(self) -> int:
        """Calls in flight on it."""
        return len(self._pending)

    @property
    def lifetime(self) -> float:
        """Seconds since it was started."""
        return asyncio.get_running_loop().time() - self._started_at

    async def _handshake(self, no_cgroup: str) -> None:
        try:
            async with asyncio.timeout(self.spec.start_timeout):
                frame = await read_frame(self._replies, HEADER_ROOM)
        except TimeoutError:
            raise WorkerStartError(
                await self._abandon(f"it was not ready within {self.spec.start_timeout:g}s")
            ) from None
        except FrameError as exc:
            raise WorkerStartError(await self._abandon(f"it answered with {exc}")) from None
        if frame is None or frame[0]["op"] != "ready":
            why = str(frame[0].get("error", frame[0])) if frame else "it ended before it was ready"
            raise WorkerStartError(await self._abandon(why))
        self.tools = frozenset(frame[0].get("tools", ()))
        self._guard_memory(no_cgroup or str(frame[0].get("cgroup", "")))
        self._spawn(self._watch())

    async def _abandon(self, why: str) -> str:
        """Kill a worker that did not start and say why, with the end of what it wrote to stderr."""
        self._kill()
        returncode = await self.process.wait()
        await self._close()
        ended = f" ({Crashed(returncode).what()})" if returncode not in (0, -signal.SIGKILL) else ""
        tail = self.output.tail()[-1000:]
        return f"{why}{ended}" + (f"; its last output: {tail}" if tail else "")

    def _guard_memory(self, no_cgroup: str) -> None:
        """Bound the worker's memory by its cgroup, or else watch its resident size."""
        if self.cgroup is not None and not no_cgroup and self.cgroup.holds(self.pid):
            return
        if self.spec.use_cgroup:  # said once per reason, not at every restart
            level = logging.DEBUG if no_cgroup in _REPORTED else logging.WARNING
            _REPORTED.add(no_cgroup)
            log.log(level, "%s: no memory cgroup (%s); watching its resident memory instead", self.label, no_cgroup)
        self._spawn(watch_resident_memory(self.pid, self.spec.memory_bytes, self._over_memory))

    def _over_memory(self) -> None:
        self.stop_now(OverMemory(self.spec.memory_bytes))

    async def call(self, tool: Tool[Any, Any], call: ToolCall, limits: ResultLimits, deadline: float) -> ToolOutcome:
        """Run `call` on this worker: its answer, or why there is none, by `deadline` (loop time) plus the grace."""
        loop = asyncio.get_running_loop()
        call_id = next(self._ids)
        pending = self._pending[call_id] = _Pending(tool.name, loop.create_future())
        header = {
            "op": "call",
            "id": call_id,
            "tool": tool.name,
            "run_id": call.run_id,
            "timeout": max(deadline - loop.time(), 0.001),
            "inline": limits.inline_bytes,
            "result": limits.result_bytes,
        }
        try:
            self._send(pack(header, encode_text(call.arguments_json)))
            async with asyncio.timeout_at(deadline + self.spec.grace):
                with contextlib.suppress(ConnectionError):  # it ended: its end answers the call
                    await self._requests.drain()
                return await asyncio.shield(pending.future)
        except TimeoutError:
            self.stop_now(Deadline(tool.name, tool.timeout, call_id))
            return await pending.future
        except asyncio.CancelledError:
            self._send(pack({"op": "cancel", "id": call_id}))
            raise
        finally:
            self._pending.pop(call_id, None)
            self._stop_if_retired_and_idle()

    def _send(self, frame: bytes) -> None:
        if not self._requests.transport.is_closing():
            self._requests.write(frame)

    def retire(self) -> None:
        """Take no new calls; stop once the calls in flight are answered."""
        self.retired.set()
        self._stop_if_retired_and_idle()

    def _stop_if_retired_and_idle(self) -> None:
        if self.retired.is_set() and not self._pending and self._stop is None:
            self._spawn(self.stop(Retired()))

    def stop_now(self, why: Stop) -> None:
        """Kill the worker at once (wedged, over its memory, broken); its calls in flight end with `why`."""
        if self.ended.done():
            return
        if self._stop is None:
            self._stop = why
        self._kill()

    async def stop(self, why: Stop) -> Stop:
        """Stop the worker (SIGTERM, SIGKILL after `stop_timeout`) and wait for its end; why it ended."""
        if self.ended.done():  # never signal a pid that was reaped: it may belong to another process by now
            return self.ended.result()
        if self._stop is None:
            self._stop = why
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, signal.SIGTERM)
        try:
            async with asyncio.timeout(self.spec.stop_timeout):
                return await asyncio.shield(self.ended)
        except TimeoutError:
            self._kill()
        return await asyncio.shield(self.ended)

    def _kill(self) -> None:
        # The whole session and cgroup: what the tools started dies with the worker.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, signal.SIGKILL)
        # `os.kill`, not `Process.kill()`: on 3.11 the latter polls first, which can reap the child
        # before asyncio's watcher does, and its exit status then reads 255 (a signal lost).
        if self.process.returncode is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(self.pid, signal.SIGKILL)
        if self.cgroup is not None:
            self.cgroup.kill_all()

    async def _watch(self) -> None:
        """Read answers until the worker ends; then end its calls in flight and clean up."""
        replies = asyncio.create_task(self._read_replies())
        exited = asyncio.create_task(self.process.wait())
        await asyncio.wait({replies, exited}, return_when=asyncio.FIRST_COMPLETED)
        if not exited.done():  # it closed its pipe, or broke the protocol: it cannot be talked to
            self._kill()
        returncode = await exited
        self._stop = self._stop or self._cause(returncode)  # from here on, it takes no call
        self._kill()  # what it left behind in its session or cgroup
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(_READ_AFTER_EXIT):
                await asyncio.shield(replies)  # answers it sent just before it ended
        replies.cancel()
        why = self._stop
        if reason := _KILL_REASONS.get(type(why)):
            metrics.killed("tool", reason)
        in_flight = len(self._pending)
        for call_id, pending in self._pending.items():
            if not pending.future.done():
                # The call whose deadline stopped the worker timed out; the others were killed with it.
                culprit = isinstance(why, Deadline) and call_id == why.call_id
                told = ToolOutcome.error(why.text(pending.tool, call_id, in_flight))
                pending.future.set_result(replace(told, killed=True, timed_out=culprit))
        await self._close()
        self.ended.set_result(why)

    def _cause(self, returncode: int) -> Stop:
        if self.cgroup is not None and self.cgroup.oom_kills() > 0:
            return OverMemory(self.spec.memory_bytes)
        return Crashed(returncode)

    async def _read_replies(self) -> None:
        max_bytes = self.spec.max_content_bytes + HEADER_ROOM
        try:
            while frame := await read_frame(self._replies, max_bytes):
                self._answered(*frame)
        except FrameError as exc:
            self.stop_now(Protocol(str(exc)))

    def _answered(self, header: dict[str, Any], body: bytes) -> None:
        kind = header.get("kind")
        if header["op"] != "done" or kind not in _KINDS:
            msg = f"an unexpected frame {header['op']!r}"
            raise FrameError(msg)
        pending = self._pending.get(int(header.get("id", 0)))
        if pending is None or pending.future.done():
            return  # a call given up meanwhile (cancelled)
        outcome = ToolOutcome(
            kind,
            decode_text(body),
            truncated=bool(header.get("truncated")),
            timed_out=bool(header.get("timed_out")),
        )
        pending.future.set_result(outcome)
        if header.get("recycle"):
            log.warning("%s: %s timed out in a thread that cannot be stopped; recycling it", self.label, pending.tool)
            self.retire()

    async def _close(self) -> None:
        """Close the pipes, finish reading the worker's output (briefly), remove its cgroup."""
        self._requests.close()
        self._replies_transport.close()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(_READ_AFTER_EXIT):
                await asyncio.gather(*self._drains, return_exceptions=True)
        for task in [*self._drains, *self._tasks]:
            if task is not asyncio.current_task():
                task.cancel()
        if self.cgroup is not None:
            await self.cgroup.dispose()

    def _spawn(self, work: Any) -> None:
        task: asyncio.Task[Any] = asyncio.create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)


async def _discard(process: asyncio.subprocess.Process, cgroup: MemoryCgroup | str) -> None:
    """Kill a worker process that never became a `WorkerProcess`, read its output to the end, reap it."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)
    await process.communicate()  # its stdout and stderr to their end: their transports close
    if isinstance(cgroup, MemoryCgroup):
        await cgroup.dispose()


def _piped(stream: asyncio.StreamReader | None) -> asyncio.StreamReader:
    assert stream is not None, "the worker is started with stdout and stderr piped"
    return stream


def _command(spec: WorkerSpec, requests_fd: int, replies_fd: int, cgroup: MemoryCgroup | str) -> list[str]:
    command = [sys.executable, "-m", "atmosphere.sandbox.tool_worker", "--app", spec.app]
    command += ["--app-dir", str(spec.app_dir), "--requests-fd", str(requests_fd), "--replies-fd", str(replies_fd)]
    command += ["--max-request-bytes", str(spec.max_request_bytes), "--parent", str(os.getpid())]
    return command + (["--cgroup", str(cgroup.procs)] if isinstance(cgroup, MemoryCgroup) else [])
