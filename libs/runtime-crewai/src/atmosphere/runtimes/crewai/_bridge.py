"""The link between CrewAI's worker threads and the run's event loop.

CrewAI's agent loop is a `Flow` whose steps are synchronous methods it runs with
`asyncio.to_thread`: each model call and each tool call of an agent happens in a worker thread.
Everything the platform does is a coroutine on the run's loop (the session, the choke point, the
provider's HTTP stream). A `Bridge` carries both directions through one ordered queue:

- events (`post`): sent to the session in the order CrewAI emitted them, whatever thread;
- jobs (`call`): a coroutine started on the loop once every event posted before it was sent (so a
  round's text, argument deltas and usage reach the client before its tools' `tool-start`), its
  result handed back to the blocked worker thread.

Closing the bridge cancels every job still running (closing a model's HTTP stream, abandoning a
tool call) and refuses new ones: a cancelled run stops at once even though CrewAI's threads,
which nothing can interrupt, unwind on their own afterwards.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import contextvars
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any, TypeVar

from atmosphere.contracts.run.v1.run_pb2 import RunEvent
from atmosphere.sdk import StreamingSession

T = TypeVar("T")

CLOSE_WAIT = 2.0
"""Seconds closing waits for the cancelled jobs to unwind (each closes its HTTP stream as it does)."""


class BridgeClosedError(Exception):
    """The run ended: no more work is started for it."""

    def __init__(self) -> None:
        """Say so."""
        super().__init__("the run has ended")


@dataclass(frozen=True, slots=True)
class _Job:
    start: Callable[[], Coroutine[Any, Any, Any]]
    context: contextvars.Context
    done: concurrent.futures.Future[Any]


class Bridge:
    """One run's ordered queue of events and jobs, drained on its loop (see the module)."""

    def __init__(self, session: StreamingSession, loop: asyncio.AbstractEventLoop) -> None:
        """Send events to `session`; run jobs on `loop` (the run's)."""
        self._session = session
        self._loop = loop
        self._queue: asyncio.Queue[RunEvent | _Job] = asyncio.Queue()
        self._running: set[asyncio.Task[Any]] = set()
        self._closed = False
        self._refusing = False
        self._pump = loop.create_task(self._drain_forever())

    @property
    def loop_thread(self) -> bool:
        """Whether the caller runs on the run's loop (where blocking on a job would deadlock)."""
        try:
            return asyncio.get_running_loop() is self._loop
        except RuntimeError:
            return False

    def post(self, event: RunEvent) -> None:
        """Queue `event` for the session; from any thread."""
        if not self._closed:
            self._loop.call_soon_threadsafe(self._queue.put_nowait, event)

    def call(self, start: Callable[[], Coroutine[Any, Any, T]]) -> T:
        """Run `start()` on the loop, in a copy of the caller's context, and wait for its result.

        For a worker thread: the loop must not be the caller's own.

        Raises:
            BridgeClosedError: the run ended before or while the job ran.
        """
        if self._closed or self._refusing:
            raise BridgeClosedError
        done: concurrent.futures.Future[T] = concurrent.futures.Future()
        self._loop.call_soon_threadsafe(self._queue.put_nowait, _Job(start, contextvars.copy_context(), done))
        try:
            return done.result()
        except concurrent.futures.CancelledError as exc:
            raise BridgeClosedError from exc

    def refuse_new_work(self) -> None:
        """Start no more jobs (the run failed); events are still sent and running jobs finish."""
        self._refusing = True

    async def caught_up(self) -> None:
        """Wait until everything queued so far was handled (events sent, jobs started)."""
        await self._queue.join()

    async def aclose(self) -> None:
        """Cancel the running jobs, refuse new ones, and stop draining (the queued events are dropped)."""
        self._closed = True
        self._pump.cancel()
        for task in self._running:
            task.cancel()
        pending = [self._pump, *self._running]
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.gather(*pending, return_exceptions=True), CLOSE_WAIT)
        while not self._queue.empty():
            item = self._queue.get_nowait()
            if isinstance(item, _Job):
                item.done.cancel()

    async def _drain_forever(self) -> None:
        while True:
            item = await self._queue.get()
            try:
                if isinstance(item, _Job):
                    self._start(item)
                else:
                    await self._session.emit(item)
            finally:
                self._queue.task_done()

    def _start(self, job: _Job) -> None:
        if not job.done.set_running_or_notify_cancel():
            return
        task = self._loop.create_task(_settle(job.start(), job.done), context=job.context)
        self._running.add(task)
        task.add_done_callback(self._running.discard)


async def _settle(work: Awaitable[T], done: concurrent.futures.Future[T]) -> None:
    """Hand `work`'s outcome to the waiting thread (a cancellation too)."""
    try:
        result = await work
    except asyncio.CancelledError:
        done.set_exception(concurrent.futures.CancelledError())
        raise
    except BaseException as exc:  # every outcome goes back to the thread
        done.set_exception(exc)
    else:
        done.set_result(result)
