"""`EvalPool`: the JavaScript worker processes of one sandbox, one evaluation on them, and `probe`.

Each worker (`python -m atmosphere.sandbox.js.worker`) takes one evaluation at a time; more
calls wait for a free one, for a bounded time. The worker bounds each evaluation itself (V8's
timeout and heap limit); the pool adds a hard deadline of its own (the timeout plus a grace)
past which the worker is killed, so code that keeps V8 from answering (a long builtin call)
cannot hold a worker. A worker that dies during a call (V8 aborting on a huge allocation, a
signal) is replaced by the next call, and the call in it becomes an `Error: ...`: the service
never sees more than a closed pipe. A cancelled call kills the worker running it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
from dataclasses import dataclass
from typing import Final, Literal

from atmosphere.sandbox import metrics
from atmosphere.sandbox.js.availability import EvalAvailability
from atmosphere.sandbox.js.child import REAP_TIMEOUT, WorkerProcess, WorkerStartError, last_words, worker_environment
from atmosphere.sandbox.js.protocol import MAX_CODE_CHARS, FrameError, Reply, reply_limit
from atmosphere.sandbox.js.settings import MIB, EvalSettings

log = logging.getLogger("atmosphere.sandbox")

DEADLINE_GRACE: Final = 0.5
"""Seconds past the timeout after which the pool stops waiting for a worker's answer and kills it."""
START_TIMEOUT: Final = 10.0
"""Seconds a new worker has to load V8 and say it is ready."""

OutcomeKind = Literal["result", "error", "timeout", "oom", "stopped", "busy", "unavailable", "invalid"]


@dataclass(frozen=True, slots=True)
class EvalOutcome:
    """One evaluation's outcome: the rendered value, or the `Error: ...` text for the model."""

    kind: OutcomeKind
    text: str
    """The value as text (cut to `max_output_chars`, without a marker) or the whole error text."""
    truncated: bool = False
    """The value was longer than `max_output_chars` and was cut."""

    @property
    def is_error(self) -> bool:
        """Anything but a value."""
        return self.kind != "result"


def queue_wait_seconds(settings: EvalSettings) -> float:
    """How long a call waits for a free worker: long enough for one evaluation ahead of it."""
    return settings.timeout_seconds + DEADLINE_GRACE + 1.0


def longest_call_seconds(settings: EvalSettings) -> float:
    """The longest one `evaluate` takes: waiting for a worker, starting one, the evaluation, the grace."""
    return queue_wait_seconds(settings) + START_TIMEOUT + settings.timeout_seconds + DEADLINE_GRACE


class EvalPool:
    """Up to `settings.workers` JavaScript workers, started at `start()` and replaced as they die."""

    def __init__(
        self,
        settings: EvalSettings,
        *,
        python: str | None = None,
        grace: float = DEADLINE_GRACE,
        start_timeout: float = START_TIMEOUT,
        queue_wait: float | None = None,
    ) -> None:
        """Evaluate with `settings`' limits in workers run by `python` (default: this interpreter).

        A call waits at most `queue_wait` seconds for a free worker (default `queue_wait_seconds`).
        """
        self.settings = settings
        self._command = [
            python or sys.executable,
            "-s",
            "-m",
            "atmosphere.sandbox.js.worker",
            f"--timeout-ms={settings.timeout_millis}",
            f"--max-memory-bytes={settings.max_memory_bytes}",
            f"--max-output-chars={settings.max_output_chars}",
        ]
        self._grace = grace
        self._start_timeout = start_timeout
        self._queue_wait = queue_wait_seconds(settings) if queue_wait is None else queue_wait
        self._idle: asyncio.Queue[WorkerProcess | None] = asyncio.Queue()
        for _ in range(settings.workers):
            self._idle.put_nowait(None)
        self._workers: set[WorkerProcess] = set()
        self._reapers: set[asyncio.Task[int]] = set()
        self._next_id = 0
        self._started = False
        self._closed = False
        self.engine = ""
        """What the workers run, e.g. `mini-racer 0.14.1 (V8 14.4.258.23)`, once one has started."""
        self.availability = EvalAvailability(active=False, reason="not started")
        """What `start` found."""

    async def start(self) -> str:
        """Start every worker now: the availability label, `ACTIVE(mini-racer)` or `INACTIVE(<reason>)`.

        Each worker evaluates `1+1` before it says it is ready, so ACTIVE means V8 really ran. When
        one cannot start, none is left running (`evaluate` tries again, and says why it cannot).
        Calling it again returns the first answer.
        """
        if self._started:
            return self.availability.label
        self._started = True
        # The free slots only: a call that already runs (started before this) keeps its worker.
        slots = [self._idle.get_nowait() for _ in range(self._idle.qsize())]
        try:
            spawned = await asyncio.gather(*(self._spawn() for slot in slots if slot is None), return_exceptions=True)
        except BaseException:  # cancelled: the slots go back (a worker being started was killed)
            for slot in slots:
                self._idle.put_nowait(slot)
            raise
        running = [slot for slot in slots if slot is not None]
        failures = [result for result in spawned if isinstance(result, BaseException)]
        workers = [result for result in spawned if isinstance(result, WorkerProcess)]
        if failures:
            for worker in workers:
                self._discard(worker)
                self._idle.put_nowait(None)
            for slot in [*running, *(None for _ in failures)]:
                self._idle.put_nowait(slot)
            unavailable = next((f for f in failures if isinstance(f, WorkerStartError)), None)
            if unavailable is None:
                raise failures[0]  # cancelled, or a bug: not a fact about the engine
            self.availability = EvalAvailability(active=False, reason=unavailable.reason)
            log.warning("eval: %s", self.availability.label)
            return self.availability.label
        for slot in [*running, *workers]:
            self._idle.put_nowait(slot)
        self.availability = EvalAvailability(active=True, reason=self.engine)
        return self.availability.label

    async def evaluate(self, code: str) -> EvalOutcome:
        """Run `code` in a worker; every way it can end is an outcome (cancellation kills the worker)."""
        if len(code) > MAX_CODE_CHARS:
            return EvalOutcome(
                "invalid", f"Error: the code is {len(code)} characters long; eval takes at most {MAX_CODE_CHARS}"
            )
        if self._closed:
            return EvalOutcome("unavailable", "Error: eval is shutting down")
        wait = self._queue_wait
        try:
            async with asyncio.timeout(wait):
                worker = await self._idle.get()
        except TimeoutError:
            return EvalOutcome("busy", f"Error: eval is busy: no JavaScript worker was free within {wait:g} s")
        kept: WorkerProcess | None = None
        try:
            if worker is None:
                worker = await self._spawn()
            outcome = await self._run(worker, code)
            if worker.alive:
                kept = worker
            return outcome
        except WorkerStartError as exc:
            return EvalOutcome("unavailable", f"Error: the JavaScript engine is not available ({exc.reason})")
        finally:
            if worker is not None and kept is None:
                self._discard(worker)
            self._idle.put_nowait(kept)

    async def close(self) -> None:
        """Kill every worker and wait until each has exited: no process is left behind."""
        self._closed = True
        # Again until none is left: a worker whose start was under way when this began joins late.
        while self._workers or self._reapers:
            for worker in list(self._workers):
                self._discard(worker)  # also one already killed: its reaper is what removes it
            try:
                async with asyncio.timeout(2 * REAP_TIMEOUT):
                    await asyncio.gather(*self._reapers, return_exceptions=True)
            except TimeoutError:  # SIGKILL did not end it (a process stuck in the kernel): say so, do not hang
                log.error("eval: worker(s) %s did not exit after SIGKILL", sorted(w.pid for w in self._workers))
                return

    @property
    def closed(self) -> bool:
        """`close` has begun: no call is taken, no worker started."""
        return self._closed

    def worker_pids(self) -> list[int]:
        """The process ids of the workers running now."""
        return sorted(worker.pid for worker in self._workers if worker.alive)

    async def _spawn(self) -> WorkerProcess:
        if self._closed:
            raise WorkerStartError("eval is shutting down")
        try:
            process = await asyncio.create_subprocess_exec(
                *self._command,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                env=worker_environment(),
                cwd="/",
                limit=reply_limit(self.settings.max_output_chars),
                # Its own session: the terminal's Ctrl-C reaches the sandbox (which then closes the
                # pool), not the workers. A worker whose sandbox died sees its stdin end and exits.
                start_new_session=True,
            )
        except OSError as exc:
            raise WorkerStartError(f"the JavaScript worker could not be started: {exc}") from exc
        worker = WorkerProcess(process)
        self._workers.add(worker)
        metrics.WORKERS.labels("eval").inc()  # and one less once reaped (`_discard`)
        if self.closed:  # `close` began while the process was being created
            self._discard(worker)
            raise WorkerStartError("eval is shutting down")
        try:
            async with asyncio.timeout(self._start_timeout):
                await worker.ready()
        except TimeoutError:
            self._discard(worker)
            raise WorkerStartError(f"the JavaScript worker was not ready within {self._start_timeout:g} s") from None
        except ValueError as exc:  # a FrameError, or a first line over the bound
            self._discard(worker)
            raise WorkerStartError(f"the JavaScript worker broke the protocol at start ({exc})") from None
        except BaseException:
            self._discard(worker)
            raise
        self.engine = worker.engine
        return worker

    async def _run(self, worker: WorkerProcess, code: str) -> EvalOutcome:
        """One evaluation on `worker`; a worker that fails it is killed (the caller drops it)."""
        self._next_id += 1
        try:
            async with asyncio.timeout(self.settings.timeout_seconds + self._grace):
                reply = await worker.call(self._next_id, code)
        except TimeoutError:
            worker.kill()
            log.warning("eval: the worker (pid %d) did not answer within its deadline; killed", worker.pid)
            return self._timed_out()
        except (FrameError, ValueError) as exc:  # ValueError: a reply line over the bound
            worker.kill()
            log.warning("eval: the worker (pid %d) broke the protocol (%s); killed", worker.pid, exc)
            return self._stopped("it sent a malformed reply")
        except (ConnectionError, OSError):  # its pipes closed: it died (or is dying) on its own
            # Killing a process that already ended changes nothing, and its own end is what is reported.
            worker.kill()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(REAP_TIMEOUT):
                    await worker.wait()
            log.warning("eval: the worker (pid %d) stopped: %s", worker.pid, last_words(worker.stderr_tail()))
            return self._out_of_memory() if worker.ran_out_of_memory() else self._stopped(worker.exit_description())
        return self._outcome(reply)

    def _outcome(self, reply: Reply) -> EvalOutcome:
        if reply.kind == "result":
            return EvalOutcome("result", reply.text, reply.truncated)
        if reply.kind == "timeout":
            return self._timed_out()
        if reply.kind == "oom":
            return self._out_of_memory()
        return EvalOutcome("error", f"Error: {reply.text}")

    def _timed_out(self) -> EvalOutcome:
        return EvalOutcome("timeout", f"Error: eval timed out after {self.settings.timeout_millis} ms")

    def _out_of_memory(self) -> EvalOutcome:
        limit = self.settings.max_memory_bytes / MIB
        return EvalOutcome("oom", f"Error: eval ran out of memory (limit {limit:g} MiB)")

    @staticmethod
    def _stopped(how: str) -> EvalOutcome:
        return EvalOutcome("stopped", f"Error: the JavaScript worker stopped ({how}); the call was not completed")

    def _discard(self, worker: WorkerProcess) -> None:
        """Kill `worker` and reap it in the background (`close` waits for every reaper)."""
        worker.kill()
        reaper = asyncio.get_running_loop().create_task(worker.wait())
        self._reapers.add(reaper)

        def forget(task: asyncio.Task[int]) -> None:
            self._reapers.discard(task)
            if worker in self._workers:  # discarded twice (`close` again), reaped once
                self._workers.discard(worker)
                metrics.WORKERS.labels("eval").dec()

        reaper.add_done_callback(forget)


async def probe(settings: EvalSettings, pool: EvalPool | None = None, *, python: str | None = None) -> EvalAvailability:
    """Whether `eval` can be offered, from a worker that really started and evaluated `1+1`.

    Not an import check in the service (which never imports mini-racer): a package that imports
    may still fail to start V8 (a missing native library, a CPU it was not built for). With
    `pool`, its workers are started and left running for the service; without, a one-worker pool
    run by `python` is started for the probe and closed after it.
    """
    if not settings.enabled:
        return EvalAvailability(active=False, reason="disabled")
    owned = pool is None
    checked = EvalPool(settings.model_copy(update={"workers": 1}), python=python) if pool is None else pool
    try:
        await checked.start()
        if not checked.availability.active:
            return checked.availability
        outcome = await checked.evaluate("1+1")
    finally:
        if owned:
            await checked.close()
    if outcome.is_error or outcome.text != "2":
        return EvalAvailability(active=False, reason=f"1+1 gave {outcome.text!r}")
    return checked.availability
