"""`delegate_task` to a remote A2A agent: a coordinator's `RemoteAgent`, through the `a2a-sdk` client.

Only the remote members an app declares are reachable (the deployment may move one or give it a
token, `ATMOSPHERE_DELEGATION__REMOTES`; a model never names a URL of its own). The call is sent
only to the origin (scheme, host, port) the member was declared at: an Agent Card naming an
interface elsewhere is refused, redirects are not followed.

One call: resolve the Agent Card (`A2ACardResolver`), send the message streamed
(`Client.send_message`), forward the task's text as it grows and its status messages into the
parent's stream tagged with the call's id and the member's name (`origin_run_id`,
`origin_agent`, as a local sub-run's are), and return the answer when the task completes. A
task that fails, is rejected or cancelled, asks for input or auth, or a stream that ends early
is a failure text; a call that does not finish (the deadline, a failure, the parent cancelled)
cancels its remote task (`CancelTask`). Everything read from the remote (card and stream) is
bounded by `remote_max_bytes`, the whole call by `remote_timeout`.

The `a2a-sdk` is dispatch's `a2a` extra: imported only here, when a remote call is made.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, cast
from urllib.parse import urlsplit

import httpx

from atmosphere.bus import PayloadTooLargeError
from atmosphere.bus.sizes import clip
from atmosphere.contracts.run.v1.run_pb2 import Progress, RunEvent, RunSubmission, TextDelta
from atmosphere.dispatch.output_guard import Blocked, OutputGuard
from atmosphere.sdk import App
from atmosphere.sdk.builtin_tools import DELEGATION_TIMEOUT

if TYPE_CHECKING:
    from a2a.client import Client
    from a2a.types import AgentCard, StreamResponse, TaskStatus

log = logging.getLogger("atmosphere.dispatch")

Emit = Callable[[RunEvent], Awaitable[None]]

EXTRA = "atmosphere-ai-dispatch[a2a]"
CANCEL_TIMEOUT = 5.0
"""Seconds the remote task's cancel may take (it is sent once, whatever ended the call)."""
CANCEL_REPLY_BYTES = 64 * 1024
"""Bytes the cancel's answer may take, whatever the call had read before."""
STARTED = "The remote agent took the task"
"""The progress message forwarded when the remote task is known (and so can be cancelled)."""
PROGRESS_CHARS = 2000
"""Characters of a remote status message forwarded as progress."""
FORWARDED_CHUNK_BYTES = 64 * 1024
"""Bytes of one remote text chunk forwarded in one event (a remote's chunk may be of any size)."""
REMOTE_METADATA_KEY = "fleet.dispatch.remote"
"""The admission metadata naming a remote member's A2A URL (policies may read it)."""


def missing_client() -> str | None:
    """Why remote delegation cannot work in this process (the `a2a` extra is absent), or None."""
    try:
        import a2a.client  # noqa: F401, PLC0415 - only whether it imports
    except ImportError:
        return f"the A2A client is not installed here (install {EXTRA})"
    return None


@dataclass(frozen=True)
class RemoteMember:
    """A remote fleet member as this deployment reaches it."""

    name: str
    url: str
    """Its A2A base URL ("" when neither the app nor the deployment named one)."""
    token: str = field(default="", repr=False)
    description: str = ""


@dataclass(frozen=True)
class RemoteLimits:
    """The bounds of every remote call."""

    timeout: float = DELEGATION_TIMEOUT
    connect_timeout: float = 10.0
    max_bytes: int = 8 * 1024 * 1024


@dataclass(frozen=True)
class RemoteOverride:
    """The deployment's word on one remote member (`ATMOSPHERE_DELEGATION__REMOTES`)."""

    url: str = ""
    token: str = field(default="", repr=False)


def remote_fleets(app: App, overrides: Mapping[str, RemoteOverride]) -> dict[str, dict[str, RemoteMember]]:
    """Each coordinator's remote members (coordinator → name → member), the deployment's overrides applied."""
    fleets: dict[str, dict[str, RemoteMember]] = {}
    declared: set[str] = set()
    for spec in app.agents.values():
        members: dict[str, RemoteMember] = {}
        for remote in spec.remotes:
            declared.add(remote.name)
            override = overrides.get(remote.name, RemoteOverride())
            members[remote.name] = RemoteMember(
                remote.name, override.url or remote.url, override.token, remote.description
            )
        if members:
            fleets[spec.name] = members
    for name in sorted(set(overrides) - declared):
        log.warning("ATMOSPHERE_DELEGATION__REMOTES names %r, which no coordinator declares: ignored", name)
    return fleets


def remote_info(fleets: Mapping[str, Mapping[str, RemoteMember]]) -> dict[str, str]:
    """Runtime truth for the info: each remote member and whether this process can reach it."""
    missing = missing_client()
    state: dict[str, str] = {}
    for members in fleets.values():
        for member in members.values():
            if not member.url:
                state[member.name] = "INACTIVE(no-url)"
            elif missing is not None:
                state[member.name] = f"INACTIVE(install {EXTRA})"
            else:
                state[member.name] = f"ACTIVE(a2a {_origin(member.url)})"
    return state


@dataclass
class RemoteOutcome:
    """How a remote call ended: its answer, or why it has none."""

    text: str = ""
    error: str | None = None
    timed_out: bool = False


class RemoteCallError(Exception):
    """A remote call that cannot go on, in words for the model."""


class _Budget:
    """Bytes a call may still read from its remote."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.left = limit

    def spend(self, size: int) -> None:
        self.left -= size
        if self.left < 0:
            msg = f"the remote agent sent more than {self.limit} bytes"
            raise RemoteCallError(msg)


class _BoundedStream(httpx.AsyncByteStream):
    def __init__(self, inner: httpx.AsyncByteStream, budget: _Budget) -> None:
        self._inner = inner
        self._budget = budget

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self._inner:
            self._budget.spend(len(chunk))
            yield chunk

    async def aclose(self) -> None:
        await self._inner.aclose()


class _BoundedTransport(httpx.AsyncBaseTransport):
    """Every response body of one call counted against its byte budget, as it arrives."""

    def __init__(self, inner: httpx.AsyncBaseTransport, budget: _Budget) -> None:
        self._inner = inner
        self._budget = budget

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        response = await self._inner.handle_async_request(request)
        stream = response.stream
        assert isinstance(stream, httpx.AsyncByteStream)
        response.stream = _BoundedStream(stream, self._budget)
        return response

    async def aclose(self) -> None:
        await self._inner.aclose()


DEFAULT_PORTS = {"http": 80, "https": 443}


def _origin(url: str) -> str:
    """`scheme://host:port` of `url`, the port spelled out (`https://a` and `https://a:443` are one origin)."""
    try:
        parts = urlsplit(url)
        scheme = parts.scheme.lower()
        port = parts.port or DEFAULT_PORTS.get(scheme, 0)
    except ValueError:
        return ""
    return f"{scheme}://{(parts.hostname or '').lower()}:{port}"


class RemoteCall:
    """One `delegate_task` to a remote member: its events forwarded through `emit`, tagged as `child`'s."""

    def __init__(
        self,
        member: RemoteMember,
        child: RunSubmission,
        emit: Emit,
        limits: RemoteLimits,
        *,
        guard: OutputGuard | None = None,
    ) -> None:
        """Call `member` on behalf of `child` (the delegation edge governance admitted).

        `guard` (when a policy judges answers): the task's text reaches the client only as its
        checks pass, as a local sub-run's does, and the whole answer is checked before it is returned.
        """
        self._guard = guard
        self._member = member
        self._child = child
        self._emit = emit
        self._limits = limits
        self._artifacts: dict[str, str] = {}
        self._streamed = ""
        """The text forwarded so far (what the guard has seen)."""
        self._task_id = ""
        self._finished = False
        self._budget = _Budget(limits.max_bytes)

    async def run(self, message: str) -> RemoteOutcome:
        """Send `message`; the answer, or how the call ended."""
        timeout = httpx.Timeout(self._limits.timeout, connect=self._limits.connect_timeout)
        headers = {"Authorization": f"Bearer {self._member.token}"} if self._member.token else {}
        transport = _BoundedTransport(httpx.AsyncHTTPTransport(), self._budget)
        try:
            async with (
                httpx.AsyncClient(
                    transport=transport, timeout=timeout, headers=headers, follow_redirects=False
                ) as http,
                asyncio.timeout(self._limits.timeout),
            ):
                return await self._call(http, message)
        except TimeoutError:
            return RemoteOutcome(self.answer(), timed_out=True)
        except RemoteCallError as exc:
            return RemoteOutcome(self.answer(), error=str(exc))
        except Blocked as exc:
            return RemoteOutcome(error=exc.reason)
        except Exception as exc:  # the SDK's and httpx's failures, in words for the model
            return RemoteOutcome(self.answer(), error=_failure_text(exc))

    async def _call(self, http: httpx.AsyncClient, message: str) -> RemoteOutcome:
        from a2a.client import ClientConfig, ClientFactory  # noqa: PLC0415 - the optional extra
        from a2a.helpers import new_text_message  # noqa: PLC0415
        from a2a.types import Role, SendMessageRequest  # noqa: PLC0415

        card = await self._card(http)
        client = ClientFactory(ClientConfig(streaming=True, httpx_client=http)).create(card)
        request = SendMessageRequest(message=new_text_message(message, role=Role.ROLE_USER))
        try:
            # An async generator at run time (the SDK's signature says iterator): closed on every exit.
            stream = cast("AsyncGenerator[StreamResponse, None]", client.send_message(request))
            async with contextlib.aclosing(stream) as replies:
                async for reply in replies:
                    outcome = await self._take(reply)
                    if outcome is not None:
                        return outcome
            raise RemoteCallError("the remote agent's stream ended before its task finished")
        finally:
            if not self._finished and self._task_id:
                # Timed out, failed, or the parent was cancelled: the remote task must not go on alone.
                await asyncio.shield(self._cancel(client))
            await client.close()

    async def _card(self, http: httpx.AsyncClient) -> AgentCard:
        """The member's Agent Card, its interfaces kept to the declared origin."""
        from a2a.client import A2ACardResolver  # noqa: PLC0415 - the optional extra

        card = await A2ACardResolver(http, base_url=self._member.url).get_agent_card()
        origin = _origin(self._member.url)
        kept = [i for i in card.supported_interfaces if _origin(i.url) == origin]
        if not kept:
            msg = f"its Agent Card names no interface at {origin}, where it was declared"
            raise RemoteCallError(msg)
        del card.supported_interfaces[:]
        card.supported_interfaces.extend(kept)
        return card

    async def _cancel(self, client: Client) -> None:
        from a2a.types import CancelTaskRequest  # noqa: PLC0415 - the optional extra

        # Room to read the cancel's answer, even when the call ended for having read too much.
        self._budget.left = max(self._budget.left, CANCEL_REPLY_BYTES)
        try:
            async with asyncio.timeout(CANCEL_TIMEOUT):
                await client.cancel_task(CancelTaskRequest(id=self._task_id))
        except Exception as exc:  # the call's outcome is already decided; the cancel is best effort
            log.warning(
                "run %s: the remote task %s of %s could not be cancelled (%s)",
                self._child.parent_run_id,
                self._task_id,
                self._member.name,
                exc,
            )

    async def _take(self, reply: StreamResponse) -> RemoteOutcome | None:
        """One streamed reply taken in: the outcome once the task has ended, else None."""
        kind = reply.WhichOneof("payload")
        if kind == "message":  # an answer without a task
            self._finished = True
            await self._artifact("message", _text(reply.message.parts), append=False)
            return await self._done(RemoteOutcome(self.answer()))
        if kind == "task":
            task = reply.task
            await self._started(task.id)
            for artifact in task.artifacts:
                await self._artifact(artifact.artifact_id, _text(artifact.parts), append=False)
            return await self._status(task.status)
        if kind == "artifact_update":
            update = reply.artifact_update
            await self._started(update.task_id)
            artifact = update.artifact
            await self._artifact(artifact.artifact_id, _text(artifact.parts), append=update.append)
            return None
        if kind == "status_update":
            await self._started(reply.status_update.task_id)
            return await self._status(reply.status_update.status)
        return None

    async def _started(self, task_id: str) -> None:
        """The remote task's id, once known: from then on it can be cancelled, and the client hears it began."""
        if self._task_id or not task_id:
            return
        self._task_id = task_id
        await self._forward(RunEvent(progress=Progress(message=f"{STARTED} (task {task_id[:64]})")))

    async def _artifact(self, artifact_id: str, text: str, *, append: bool) -> None:
        """An artifact's text grew (or was replaced): what is new goes to the client as text."""
        before = self._artifacts.get(artifact_id, "")
        after = before + text if append else text
        self._artifacts[artifact_id] = after
        new = after[len(before) :] if after.startswith(before) else ""
        if new:
            self._streamed += new
            await self._forward(RunEvent(text_delta=TextDelta(text=new)))

    async def _status(self, status: TaskStatus) -> RemoteOutcome | None:
        from a2a.types import TaskState  # noqa: PLC0415 - the optional extra

        said = _text(status.message.parts) if status.HasField("message") else ""
        state = status.state
        if state == TaskState.TASK_STATE_COMPLETED:
            self._finished = True
            return await self._done(RemoteOutcome(self.answer() or said))
        if state in (TaskState.TASK_STATE_FAILED, TaskState.TASK_STATE_REJECTED):
            self._finished = True
            return RemoteOutcome(self.answer(), error=said or "the remote task failed")
        if state == TaskState.TASK_STATE_CANCELED:
            self._finished = True
            return RemoteOutcome(self.answer(), error="the remote task was cancelled")
        if state in (TaskState.TASK_STATE_INPUT_REQUIRED, TaskState.TASK_STATE_AUTH_REQUIRED):
            # Nobody can answer it from here: the task is cancelled (`_finished` stays false).
            what = "input" if state == TaskState.TASK_STATE_INPUT_REQUIRED else "authorization"
            asked = f": {said[:PROGRESS_CHARS]}" if said else ""
            raise RemoteCallError(f"the remote agent asked for {what}, which a delegation cannot give{asked}")
        if said:
            await self._forward(RunEvent(progress=Progress(message=said[:PROGRESS_CHARS])))
        return None

    def answer(self) -> str:
        """The task's text so far: its artifacts' texts, in the order they came."""
        return "\n".join(text for text in self._artifacts.values() if text)

    async def _done(self, outcome: RemoteOutcome) -> RemoteOutcome:
        """A completed task's outcome, once the output check (if any) passed the whole answer.

        Raises:
            Blocked: the answer may not reach the client (nor the model).
        """
        guard = self._guard
        if guard is not None:
            await self._send(await guard.before(final=True))
            if outcome.text != self._streamed:  # an answer not (all) streamed: checked whole too
                await guard.whole_text(outcome.text)
        return outcome

    async def _forward(self, event: RunEvent) -> None:
        """Forward one event of the remote task, tagged; its text through the guard, when there is one.

        Raises:
            Blocked: the answer so far may not reach the client.
        """
        event.run_id = self._child.run_id
        event.agent = self._member.name
        event.origin_run_id = self._child.run_id
        event.origin_agent = self._member.name
        if self._guard is None:
            await self._send([event])
        elif event.HasField("text_delta"):
            await self._send(await self._guard.text(event))
        else:  # what the guard holds goes first: order is kept
            await self._send([*await self._guard.before(final=False), event])

    async def _send(self, events: list[RunEvent]) -> None:
        for event in events:
            if event.HasField("text_delta"):
                event.text_delta.text = clip(event.text_delta.text, FORWARDED_CHUNK_BYTES, "a remote text chunk")
            try:
                await self._emit(event)
            except PayloadTooLargeError as exc:
                log.warning(
                    "run %s: an event of %s not forwarded (%s)", self._child.parent_run_id, self._member.name, exc
                )


def _text(parts: object) -> str:
    """The text parts of a message or artifact, joined."""
    from a2a.helpers import get_text_parts  # noqa: PLC0415 - the optional extra

    return "".join(get_text_parts(parts))  # type: ignore[arg-type]


def _failure_text(exc: Exception) -> str:
    """What the model learns when the SDK or the connection failed."""
    from a2a.client import A2AClientTimeoutError, AgentCardResolutionError  # noqa: PLC0415
    from a2a.utils.errors import A2AError  # noqa: PLC0415

    if isinstance(exc, AgentCardResolutionError):
        return f"its Agent Card could not be read ({exc.message})"
    if isinstance(exc, A2AClientTimeoutError):
        return "the remote agent did not answer in time"
    if isinstance(exc, A2AError):
        return f"the remote agent could not be reached or refused the message ({exc.message})"
    if isinstance(exc, httpx.HTTPError):
        return f"the remote agent could not be reached ({type(exc).__name__}: {exc})"
    if isinstance(exc, ValueError):  # ClientFactory: no interface this client speaks
        return f"its Agent Card offers no interface this client speaks ({exc})"
    log.error("a remote delegation failed unexpectedly", exc_info=exc)
    return f"the remote call failed ({type(exc).__name__})"
