"""One JavaScript worker process as the pool sees it: its pipes, its ready frame, its calls, its end."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from typing import Final

from atmosphere.sandbox.js.protocol import FrameError, Reply, decode, encode

log = logging.getLogger("atmosphere.sandbox")

_STDERR_TAIL_BYTES: Final = 8192
"""What is kept of a worker's stderr: enough to tell a V8 out-of-memory abort and to log why it died."""
REAP_TIMEOUT: Final = 5.0
"""Seconds to wait for a worker's stderr to end once its process has exited."""


class WorkerStartError(Exception):
    """A worker could not start: mini-racer is missing, V8 did not start, or the worker died early."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def worker_environment() -> dict[str, str]:
    """The whole environment of a worker: nothing of the service's (no credentials), only what Python needs."""
    env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1"}
    if python_path := os.environ.get("PYTHONPATH"):
        env["PYTHONPATH"] = python_path  # where the service found its own code, e.g. a source checkout
    return env


class WorkerProcess:
    """One worker process: its pipes, the tail of its stderr, its end."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process
        self.engine = ""
        self._killed = False
        self._stderr_tail = bytearray()
        self._stderr_reader = asyncio.create_task(self._drain_stderr())

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def alive(self) -> bool:
        """Running, and not killed (a killed process is alive until it is reaped)."""
        return self.process.returncode is None and not self._killed

    async def ready(self) -> None:
        """Wait for the ready frame; `WorkerStartError` with the worker's own reason if it is not ready."""
        assert self.process.stdout is not None
        line = await self.process.stdout.readline()
        if not line:
            await self.wait()
            raise WorkerStartError(f"the JavaScript worker stopped at start ({self.exit_description()})")
        frame = decode(line)
        if frame.get("ready") is not True:
            raise WorkerStartError(str(frame.get("reason") or "the JavaScript worker did not start"))
        self.engine = f"mini-racer {frame.get('version')} (V8 {frame.get('v8')})"
        if frame.get("data_limit") is None:
            log.warning("eval: the worker could not limit its data segment; only V8's heap limit bounds memory")

    async def call(self, request_id: int, code: str) -> Reply:
        """Send one request and read its reply (`FrameError` for a broken reply, EOF as `ConnectionError`)."""
        assert self.process.stdin is not None
        assert self.process.stdout is not None
        self.process.stdin.write(encode({"id": request_id, "code": code}))
        await self.process.stdin.drain()
        line = await self.process.stdout.readline()
        if not line:
            raise ConnectionResetError("the worker closed its output")
        reply = Reply.parse(decode(line))
        if reply.request_id != request_id:
            msg = f"a reply to request {reply.request_id} while {request_id} was asked"
            raise FrameError(msg)
        return reply

    def kill(self) -> None:
        """SIGKILL the worker and its process group (nothing to save: each evaluation starts from nothing).

        The group, because the worker leads a session of its own: anything it started would
        otherwise outlive it, holding its pipes open.
        """
        self._killed = True
        if self.process.returncode is None:  # not reaped yet: its pid (and group id) are still its own
            # `os.killpg`, not `Process.kill`: that polls first, and a poll that reaps the process
            # races asyncio's own child watcher, which then reports an exit status of 255.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.process.pid, signal.SIGKILL)

    async def wait(self) -> int:
        """Its exit status, once it has exited and its pipes are read to their end."""
        assert self.process.stdin is not None
        assert self.process.stdout is not None
        self.process.stdin.close()
        # The pipes first: asyncio's `Process.wait` returns only once every pipe is closed, and a
        # reader paused on a full buffer (a reply over the bound) would never see the end of its
        # pipe. A call still reading stdout (`close` during the call) sees the end itself.
        with contextlib.suppress(TimeoutError, RuntimeError, ValueError, OSError):
            async with asyncio.timeout(REAP_TIMEOUT):
                while await self.process.stdout.read(65536):
                    pass
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(REAP_TIMEOUT):
                await asyncio.shield(self._stderr_reader)
        try:
            async with asyncio.timeout(REAP_TIMEOUT):
                return await self.process.wait()
        except TimeoutError:  # it exited, but something outside its group still holds a pipe
            log.warning("eval: the worker (pid %d) left a pipe open after it ended", self.pid)
            return self.process.returncode if self.process.returncode is not None else -1

    def exit_description(self) -> str:
        """How it ended: `killed by SIGKILL`, `exit status 3`."""
        status = self.process.returncode
        if status is None:
            return "still running"
        if status < 0:
            with contextlib.suppress(ValueError):
                return f"killed by {signal.Signals(-status).name}"
            return f"killed by signal {-status}"
        return f"exit status {status}"

    def ran_out_of_memory(self) -> bool:
        """V8 said it aborted for lack of memory."""
        return b"out of memory" in bytes(self._stderr_tail).lower()

    def stderr_tail(self) -> str:
        return bytes(self._stderr_tail).decode("utf-8", "replace")

    async def _drain_stderr(self) -> None:
        # Always read: a worker blocked on a full stderr pipe would look wedged.
        assert self.process.stderr is not None
        while chunk := await self.process.stderr.read(65536):
            self._stderr_tail += chunk
            del self._stderr_tail[:-_STDERR_TAIL_BYTES]


def last_words(stderr: str) -> str:
    """The line of a worker's stderr that says why it died (V8's `Fatal ...`), else its last one."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    return next((line for line in lines if "fatal" in line.lower()), lines[-1] if lines else "nothing on stderr")
