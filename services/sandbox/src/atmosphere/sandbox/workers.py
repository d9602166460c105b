"""The app's tools in worker processes: a tool that crashes, hangs or leaks cannot hurt sandbox.

`ToolWorkers` keeps `count` tool workers (`atmosphere.sandbox.tool_worker`) running and is the
`ToolExecutor` that `serve()` gives `ToolHost`. A call goes to the live worker with the fewest
calls in flight (calls run concurrently inside a worker: async tools await their I/O there). A
worker that ends (a segfault, `os._exit`, an OOM kill, a kill from outside, a deadline) answers
its calls in flight with a clear `Error: ...` (`worker_stops`) and is replaced; one whose sync
tool timed out (a thread that cannot be stopped) takes no new calls and is replaced once its
other calls are done. Replacements back off while workers keep dying young, so a tool that kills
its worker on every call cannot make sandbox spin; while none is ready a call waits for one
within its deadline, and fails at once when the workers cannot even start.

Each worker runs with the service's environment (tools may need API keys), minus the service's
own NATS settings (`ATMOSPHERE_NATS__*`: a URL may carry credentials, and tools do not talk to the
bus), its memory bounded by `memory_bytes` (`worker_memory`). `close()` stops every worker
(SIGTERM, then SIGKILL) and leaves no process behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from atmosphere.contracts.tool.v1.tool_pb2 import ToolCall
from atmosphere.sandbox import metrics
from atmosphere.sandbox.outcome import ResultLimits, ToolOutcome
from atmosphere.sandbox.settings import SandboxSettings
from atmosphere.sandbox.worker_memory import remove_stale_cgroups
from atmosphere.sandbox.worker_process import WorkerProcess, WorkerSpec, WorkerStartError
from atmosphere.sandbox.worker_stops import Closing, Retired, Stop
from atmosphere.sdk import Tool

log = logging.getLogger("atmosphere.sandbox")

STABLE_AFTER: Final = 30.0
"""Seconds a worker must have lived for its death to count as a fresh failure (no backoff)."""
MAX_BACKOFF: Final = 10.0
"""The longest wait before the next start of a worker that keeps dying young."""
HIDDEN_ENV_PREFIXES: Final = ("ATMOSPHERE_NATS__",)
"""The service's variables a worker does not get."""


class ToolWorkersError(Exception):
    """The tool workers cannot start (e.g. the app fails to import in them)."""


def worker_env(env: Mapping[str, str]) -> dict[str, str]:
    """The environment of a tool worker: the service's, without its connection to the bus."""
    return {k: v for k, v in env.items() if not k.startswith(HIDDEN_ENV_PREFIXES)}


@dataclass(eq=False)
class _Slot:
    """One of the pool's `count` places: the worker holding it, and how its recent workers fared."""

    index: int
    worker: WorkerProcess | None = None
    failures: int = 0
    start_error: str = ""
    """Why the last start failed; empty once a worker started."""
    supervisor: asyncio.Task[None] | None = field(default=None, repr=False)

    def backoff(self) -> float:
        """Seconds to wait before the next start: none after a first failure, then doubling."""
        return 0.0 if self.failures <= 1 else min(0.25 * 2 ** (self.failures - 2), MAX_BACKOFF)


class ToolWorkers:
    """`count` tool worker processes, kept running, that run the app's tools."""

    def __init__(self, spec: WorkerSpec, *, count: int = 2) -> None:
        """Keep `count` workers started from `spec` once `start()` is awaited."""
        if count < 1:
            msg = "a pool of tool workers needs at least one"
            raise ValueError(msg)
        self._spec = spec
        self._slots = [_Slot(i) for i in range(count)]
        self._workers: set[WorkerProcess] = set()
        """Every worker not yet ended: the slots' and those retiring."""
        self._changed = asyncio.Condition()
        self._serial = 0
        self._closing = asyncio.Event()

    @property
    def spec(self) -> WorkerSpec:
        """How the workers are started."""
        return self._spec

    def pids(self) -> list[int]:
        """The process ids of every worker not yet ended."""
        return sorted(w.pid for w in self._workers)

    def tools(self) -> frozenset[str]:
        """The tools the workers said they have."""
        return frozenset().union(*(w.tools for w in self._workers))

    def ready_pids(self) -> list[int]:
        """The process ids of the workers taking calls."""
        return sorted(w.pid for w in self._workers if w.ready)

    async def start(self) -> None:
        """Start every worker; `ToolWorkersError` (and none left running) when one cannot start."""
        if self._spec.use_cgroup:
            remove_stale_cgroups()
        try:
            results = await asyncio.gather(*(self._start_worker(s) for s in self._slots), return_exceptions=True)
        except asyncio.CancelledError:  # the service stops while it starts: leave nothing running
            await asyncio.shield(self.close())
            raise
        failed = [r for r in results if isinstance(r, BaseException)]
        if failed:
            await self.close()
            reason = failed[0]
            if not isinstance(reason, WorkerStartError):
                raise reason
            msg = f"the tool workers cannot start: {reason}"
            raise ToolWorkersError(msg) from reason
        for slot in self._slots:
            slot.supervisor = asyncio.create_task(self._supervise(slot), name=f"tool-worker-slot-{slot.index}")

    async def __aenter__(self) -> ToolWorkers:
        await self.start()
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.close()

    async def _start_worker(self, slot: _Slot) -> WorkerProcess:
        self._serial += 1
        worker = await WorkerProcess.start(self._spec, f"tool worker {slot.index}.{self._serial}")
        self._workers.add(worker)
        metrics.WORKERS.labels("tool").inc()
        worker.ended.add_done_callback(lambda _: self._forget(worker))
        slot.worker, slot.start_error = worker, ""
        log.info("%s started (pid %d, tools: %s)", worker.label, worker.pid, ", ".join(sorted(worker.tools)))
        async with self._changed:
            self._changed.notify_all()
        return worker

    def _forget(self, worker: WorkerProcess) -> None:
        self._workers.discard(worker)
        metrics.WORKERS.labels("tool").dec()

    async def _supervise(self, slot: _Slot) -> None:
        """Replace the slot's worker whenever it ends or retires, until the pool closes."""
        while not self._closing.is_set():
            worker = slot.worker
            if worker is not None:
                retired = asyncio.create_task(worker.retired.wait())
                either: set[asyncio.Future[Any]] = {worker.ended, retired}
                await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
                retired.cancel()
                if self._closing.is_set():
                    return
                delay = self._count(slot, worker)
            else:
                delay = slot.backoff()
            slot.worker = None
            await asyncio.sleep(delay)
            try:
                await self._start_worker(slot)
            except WorkerStartError as exc:
                slot.failures += 1
                slot.start_error = str(exc)
                log.error("tool worker %d cannot start (%s); trying again", slot.index, exc)
                async with self._changed:
                    self._changed.notify_all()

    def _count(self, slot: _Slot, worker: WorkerProcess) -> float:
        """Count the worker's end toward the slot's backoff, say why it ended; the wait before the next."""
        if not worker.ended.done() or isinstance(worker.ended.result(), Retired):
            return 0.0  # retired: replaced at once, while it finishes its calls
        why: Stop = worker.ended.result()
        slot.failures = 1 if worker.lifetime >= STABLE_AFTER else slot.failures + 1
        log.warning("%s (pid %d) %s; starting another", worker.label, worker.pid, why.what())
        return slot.backoff()

    async def run(
        self, tool: Tool[Any, Any], call: ToolCall, _arguments: dict[str, Any], limits: ResultLimits
    ) -> ToolOutcome:
        """Run `call` of `tool` on the least-loaded ready worker, within the tool's timeout."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + tool.timeout
        worker = await self._ready_worker(deadline)
        if isinstance(worker, str):
            return ToolOutcome.error(f"Error: {worker}; {tool.name} was not run")
        cap = self._spec.max_content_bytes
        bounded = ResultLimits(min(limits.inline_bytes, cap), min(limits.result_bytes, cap))
        return await worker.call(tool, call, bounded, deadline)

    async def _ready_worker(self, deadline: float) -> WorkerProcess | str:
        """The least-loaded ready worker, waiting for one until `deadline`; else why there is none."""
        async with self._changed:
            while True:
                if self._closing.is_set():
                    return "the sandbox is shutting down"
                ready = [s.worker for s in self._slots if s.worker is not None and s.worker.ready]
                if ready:
                    return min(ready, key=lambda w: w.load)
                if all(s.start_error for s in self._slots):
                    return f"the tool workers cannot start ({self._slots[0].start_error})"
                remaining = deadline - asyncio.get_running_loop().time()
                if remaining <= 0:
                    return "no tool worker became ready in time"
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(remaining):
                        await self._changed.wait()

    async def close(self) -> None:
        """Stop every worker (their calls in flight end with an error) and wait until none is left."""
        self._closing.set()
        for slot in self._slots:
            if slot.supervisor is not None:
                slot.supervisor.cancel()
        async with self._changed:
            self._changed.notify_all()
        await asyncio.gather(*(s.supervisor for s in self._slots if s.supervisor), return_exceptions=True)
        while self._workers:  # the slots' and those retiring, including any that started meanwhile
            await asyncio.gather(*(w.stop(Closing()) for w in list(self._workers)))


def spec_from(settings: SandboxSettings, *, env: Mapping[str, str] | None = None) -> WorkerSpec:
    """How `serve()` starts tool workers for `settings` (in the service's environment, `env` to override)."""
    options = settings.sandbox
    return WorkerSpec(
        app=settings.app,
        app_dir=Path(settings.app_dir).resolve(),
        env=worker_env(os.environ if env is None else env),
        memory_bytes=options.tool_worker_memory_bytes,
        max_content_bytes=options.max_result_bytes,
        grace=options.tool_worker_grace_seconds,
    )


@contextlib.asynccontextmanager
async def tool_workers(
    settings: SandboxSettings, tools: Mapping[str, Tool[Any, Any]]
) -> AsyncIterator[ToolWorkers | None]:
    """The started pool `serve()` runs the app's tools in; `None` (run them in-process) for 0 workers or no tools."""
    if settings.sandbox.tool_workers == 0 or not tools:
        if tools:
            log.warning("ATMOSPHERE_SANDBOX__TOOL_WORKERS=0: the app's tools run inside the sandbox process")
        yield None
        return
    async with ToolWorkers(spec_from(settings), count=settings.sandbox.tool_workers) as pool:
        missing = set(tools) - pool.tools()
        if missing:
            log.warning("the tool workers do not have %s (the app imports differently there)", sorted(missing))
        yield pool
