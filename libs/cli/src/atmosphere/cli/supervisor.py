"""Supervising child processes: prefixed logs, restarts with backoff, ordered shutdown."""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import os
import signal
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TextIO

log = logging.getLogger("atmosphere.cli")

_PR_SET_PDEATHSIG = 1
STOP_DRAIN = 2.0
"""Seconds `stop()` waits, after the children ended, for the last of their output."""


def _die_with_parent() -> None:
    # Runs in the child before exec: if the supervisor is killed outright (SIGKILL), the
    # kernel sends the child SIGTERM, so no orphan outlives `atmosphere dev`.
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


@dataclass
class ChildSpec:
    """One supervised program."""

    name: str
    argv: Sequence[str]
    env: Mapping[str, str] = field(default_factory=dict)
    stop_timeout: float = 10.0
    """Seconds between SIGTERM and SIGKILL on shutdown."""
    fatal_exit_codes: frozenset[int] = frozenset()
    """Exit codes that a restart cannot cure (the app does not import): the child stays down."""
    once: bool = False
    """A step, not a service: it runs to its end before the next child starts (`Supervisor.run_once`)."""


@dataclass
class _Child:
    spec: ChildSpec
    process: asyncio.subprocess.Process | None = None
    restarts: int = 0
    started_at: float | None = None
    """`time.monotonic()` at the last start (None: never started; 0.0 is a valid reading)."""
    exits: int = 0
    """Times it exited on its own (not stopped by `stop()`), over its whole life."""
    last_exit_code: int | None = None


def restart_delay(restarts: int, *, base: float = 0.5, cap: float = 30.0) -> float:
    """Seconds to wait before the `restarts`-th restart: doubling from `base`, capped."""
    return min(cap, base * float(2 ** max(0, restarts - 1)))


class Supervisor:
    """Starts children, prefixes their output, restarts crashed ones, stops all in order."""

    stable_after = 30.0
    """A child that ran this long before crashing starts its backoff from scratch."""

    def __init__(
        self,
        *,
        out: TextIO = sys.stdout,
        on_event: Callable[[str], None] | None = None,
        on_fatal: Callable[[str, int], None] | None = None,
    ) -> None:
        """Write prefixed child output to `out`; call `on_fatal(name, code)` when a child cannot recover."""
        self._out = out
        self._on_fatal = on_fatal or (lambda _name, _code: None)
        self._children: list[_Child] = []
        self._stopping = False
        self._stop_requested = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._on_event = on_event or (lambda _line: None)
        self._width = 10

    @property
    def stopping(self) -> bool:
        """Whether `stop()` was called."""
        return self._stopping

    @property
    def pids(self) -> list[int]:
        """Process ids of the running children."""
        return [c.process.pid for c in self._children if c.process is not None and c.process.returncode is None]

    def pid(self, name: str) -> int | None:
        """The process id of the running child `name` (None: not running now, e.g. between restarts)."""
        process = self._child(name).process
        return process.pid if process is not None and process.returncode is None else None

    def exits(self, name: str) -> int:
        """How often the child `name` exited on its own (a crash, or a fatal exit)."""
        return self._child(name).exits

    def last_exit_code(self, name: str) -> int | None:
        """The exit code of the child `name`'s last exit on its own (None: it never exited)."""
        return self._child(name).last_exit_code

    @property
    def names(self) -> list[str]:
        """Every child's name, in start order."""
        return [c.spec.name for c in self._children]

    def _child(self, name: str) -> _Child:
        return next(c for c in self._children if c.spec.name == name)

    def _print(self, name: str, line: str) -> None:
        self._out.write(f"{name:<{self._width}}| {line}\n")
        self._out.flush()

    async def start(self, spec: ChildSpec) -> None:
        """Start `spec` and keep it running until `stop()`."""
        child = _Child(spec)
        self._children.append(child)
        self._width = max(self._width, len(spec.name) + 1)
        await self._spawn(child)
        self._tasks.append(asyncio.create_task(self._watch(child), name=f"watch-{spec.name}"))

    async def _spawn(self, child: _Child) -> None:
        env = {**os.environ, **child.spec.env, "PYTHONUNBUFFERED": "1"}
        starting = asyncio.ensure_future(
            asyncio.create_subprocess_exec(
                *child.spec.argv,
                env=env,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT,
                # Own session: a terminal's Ctrl-C reaches only the supervisor, which then stops
                # the children in order (services first, the broker last).
                start_new_session=True,
                preexec_fn=_die_with_parent,
            )
        )
        try:
            child.process = await asyncio.shield(starting)
        except asyncio.CancelledError:
            # Cancelled (by `stop()`) while the process was being made: it exists already, and
            # cancelling its making would leave it running with nobody holding it (and its pipe
            # unclosed). Let the making end, then stop what it made.
            child.process = await starting
            await self._stop_child(child)
            raise
        child.started_at = time.monotonic()
        self._on_event(f"started {child.spec.name} pid={child.process.pid}")

    async def run_once(self, spec: ChildSpec, *, timeout: float) -> int | None:
        """Run `spec` to its end, its output prefixed like a child's; its exit code (None: `timeout` passed).

        Stopped like a child by `stop()` meanwhile (its exit code is then returned).
        """
        child = _Child(spec)
        self._children.append(child)
        self._width = max(self._width, len(spec.name) + 1)
        await self._spawn(child)
        assert child.process is not None
        try:
            async with asyncio.timeout(timeout):
                await self._pump(child)
                return await child.process.wait()
        except TimeoutError:
            self._print(spec.name, f"did not finish in {timeout:g}s; stopping it")
            await self._stop_child(child)
            return None

    async def _pump(self, child: _Child) -> None:
        assert child.process is not None
        assert child.process.stdout is not None
        async for raw in child.process.stdout:
            self._print(child.spec.name, raw.decode(errors="replace").rstrip())

    async def _watch(self, child: _Child) -> None:
        while True:
            await self._pump(child)
            assert child.process is not None
            code = await child.process.wait()
            if self._stopping:
                return
            child.exits += 1
            child.last_exit_code = code
            if code in child.spec.fatal_exit_codes:
                self._print(child.spec.name, f"exited with {code}: it cannot start as configured; not restarting")
                self._on_event(f"fatal {child.spec.name} code={code}")
                self._on_fatal(child.spec.name, code)
                return
            if child.started_at is not None and time.monotonic() - child.started_at >= self.stable_after:
                child.restarts = 0
            child.restarts += 1
            delay = restart_delay(child.restarts)
            self._print(child.spec.name, f"exited with {code}; restarting in {delay:.1f}s")
            self._on_event(f"crashed {child.spec.name} code={code}")
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(delay):
                    await self._stop_requested.wait()  # stop() ends the backoff at once
            if self.stopping:
                return
            await self._spawn(child)
            if self._stop_requested.is_set():  # stop() came while it was being made, and passed it by
                await self._stop_child(child)
                return

    async def stop(self) -> None:
        """Stop the children in reverse start order: SIGTERM, wait, then SIGKILL."""
        self._stopping = True
        self._stop_requested.set()
        for child in reversed(self._children):
            await self._stop_child(child)
        # Each watcher ends by itself once its child's output reached its end: cancelled before
        # that, the pipe would stay open and outlive the event loop (a grandchild holding it
        # open is why the wait is bounded).
        if self._tasks:
            await asyncio.wait(self._tasks, timeout=STOP_DRAIN)
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _stop_child(self, child: _Child) -> None:
        process = child.process
        if process is None or process.returncode is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            process.terminate()
        try:
            await asyncio.wait_for(process.wait(), child.spec.stop_timeout)
        except TimeoutError:
            self._print(child.spec.name, f"did not stop in {child.spec.stop_timeout:g}s; killing")
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            await process.wait()
