"""One sandbox per run: made on the run's first `code_exec`, kept for its later rounds, then torn down.

Files a run's code writes stay for its next executions (a session's workspace); its executions run
one at a time. A session ends when the run releases it (`release`, at the run's end), when it sat
idle for `sandbox_ttl_seconds` (the reaper), or when the service stops (`close`). At most
`max_sessions` are alive at once; one more is refused with a clear reason, never queued forever.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Final

from atmosphere.sandbox.code.results import Backend, ExecResult, Language, Sandbox, SessionUnavailableError
from atmosphere.sandbox.code.settings import CodeSettings

log = logging.getLogger("atmosphere.sandbox.code")

MAX_REAP_PERIOD: Final = 30.0
MIN_REAP_PERIOD: Final = 0.05


class _Session:
    """A run's sandbox (being opened, or open), and whether it is in use."""

    def __init__(self, opening: asyncio.Task[Sandbox], now: float) -> None:
        self.opening = opening
        self.busy = 0
        self.last_used = now
        self.turn = asyncio.Lock()
        """Held by the execution running: one at a time, whatever the backend does."""


class CodeSessions:
    """The sandboxes of the runs using `code_exec` on this instance, by run id."""

    def __init__(
        self,
        backend: Backend,
        settings: CodeSettings,
        *,
        max_sessions: int | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """Sessions on `backend`, idle ones reaped after `settings.sandbox_ttl_seconds`.

        `max_sessions` (default `settings.max_sessions`) bounds the sessions alive at once.
        """
        self._backend = backend
        self._ttl = settings.sandbox_ttl_seconds
        self._max = max_sessions if max_sessions is not None else settings.max_sessions
        self._clock = clock
        self._sessions: dict[str, _Session] = {}
        self._reaper: asyncio.Task[None] | None = None
        self._closed = False

    @property
    def backend(self) -> str:
        """The backend's name (`bwrap`, `docker`, `podman`)."""
        return self._backend.name

    def languages(self) -> tuple[Language, ...]:
        """The languages this host's sandboxes run."""
        return self._backend.languages()

    def __len__(self) -> int:
        """Sessions alive (or being opened)."""
        return len(self._sessions)

    def __contains__(self, run_id: object) -> bool:
        """Whether run `run_id` has a session."""
        return run_id in self._sessions

    async def exec(self, run_id: str, language: Language, code: str) -> ExecResult:
        """Run `code` in `run_id`'s sandbox, made now if it has none.

        Raises:
            SessionUnavailableError: no sandbox for this run (too many alive, the backend failed,
                the service is stopping, or the session was released meanwhile).
        """
        session = self._session(run_id)
        session.busy += 1
        try:
            try:
                sandbox = await asyncio.shield(session.opening)
            except asyncio.CancelledError:
                task = asyncio.current_task()
                if session.opening.cancelled() and (task is None or not task.cancelling()):
                    msg = "the session was released while its sandbox was being made"
                    raise SessionUnavailableError(msg) from None
                raise
            async with session.turn:
                return await sandbox.run(language, code)
        finally:
            session.busy -= 1
            session.last_used = self._clock()

    def _session(self, run_id: str) -> _Session:
        if self._closed:
            msg = "the sandbox service is stopping"
            raise SessionUnavailableError(msg)
        session = self._sessions.get(run_id)
        if session is not None:
            return session
        if len(self._sessions) >= self._max:
            msg = f"{self._max} code sessions are already open on this instance; try again when a run ends"
            raise SessionUnavailableError(msg)
        session = _Session(asyncio.create_task(self._open(run_id)), self._clock())
        self._sessions[run_id] = session
        self._start_reaper()
        return session

    async def _open(self, run_id: str) -> Sandbox:
        try:
            return await self._backend.open(run_id)
        except BaseException as exc:
            self._sessions.pop(run_id, None)  # the next call tries again
            if isinstance(exc, SessionUnavailableError | asyncio.CancelledError):
                raise
            log.warning("code_exec: opening a %s sandbox for run %s failed", self._backend.name, run_id, exc_info=True)
            raise SessionUnavailableError(str(exc) or type(exc).__name__) from exc

    async def release(self, run_id: str) -> None:
        """Tear down `run_id`'s sandbox (killing a running execution); nothing if it has none."""
        session = self._sessions.pop(run_id, None)
        if session is not None:
            await _close(session)

    async def close(self) -> None:
        """Tear down every sandbox (the service stops); later calls are refused."""
        self._closed = True
        if self._reaper is not None:
            self._reaper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reaper
        sessions = list(self._sessions.values())
        self._sessions.clear()
        await asyncio.gather(*(_close(session) for session in sessions))

    def _start_reaper(self) -> None:
        if self._reaper is None or self._reaper.done():
            self._reaper = asyncio.create_task(self._reap_forever())

    async def _reap_forever(self) -> None:
        period = min(max(self._ttl / 4, MIN_REAP_PERIOD), MAX_REAP_PERIOD)
        while self._sessions:
            await asyncio.sleep(period)
            await self.reap()

    async def reap(self) -> int:
        """Tear down the sessions idle for the TTL; how many went."""
        now = self._clock()
        idle = [
            run_id
            for run_id, session in self._sessions.items()
            if session.busy == 0 and session.opening.done() and now - session.last_used >= self._ttl
        ]
        for run_id in idle:
            log.info("code_exec: the sandbox of run %s sat idle for %gs; torn down", run_id, self._ttl)
            await self.release(run_id)
        return len(idle)


async def _close(session: _Session) -> None:
    """Close a session's sandbox, waiting for it to be opened first (or cancelling the opening)."""
    opening = session.opening
    if not opening.done():
        opening.cancel()
    await asyncio.wait({opening})
    if opening.cancelled() or opening.exception() is not None:
        return  # never opened: nothing to close
    try:
        await opening.result().close()
    except Exception:
        log.warning("code_exec: closing a sandbox failed", exc_info=True)
