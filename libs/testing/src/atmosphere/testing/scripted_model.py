"""The scripted model: the one fake model provider of the project's tests, in memory or on loopback.

A `ScriptedModel` answers each request with the next `Turn` of its script (or with what
`function(request)` returns), keeps every request (`requests`) and counts the clients that hung
up (`disconnects`). It speaks several wires from the same script: OpenAI's chat completions
(`atmosphere.testing.openai_wire`), and the native wires of `NATIVE_WIRES` at `root_url`:
Anthropic's Messages API (`anthropic_wire`), Cohere's v2 chat (`cohere_wire`) and Gemini's
`generateContent` (`gemini_wire`). It is reached two ways, and answers alike both ways (one
encoding per wire; one pacing, `atmosphere.testing.model_stream`):

- in memory: `handle` is an `httpx.MockTransport` handler. The agent test kit
  (`atmosphere.testing.agents`) gives dispatch's runtime that transport, so no socket is opened
  and nothing a test scripts can leak to a real provider;
- on loopback HTTP: `async with model.serving():` serves it on 127.0.0.1 at `base_url`, for
  services in processes of their own (the `fake_provider` fixture), and for benchmarks
  (`python -m atmosphere.testing.model_server`).

    model = ScriptedModel(Turn.error("busy", status=429, retry_after=1), Turn.text("Hello world"))
    async with model.serving():
        ...  # point LLM_BASE_URL at model.base_url
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncGenerator, Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

import httpx

from atmosphere.sdk.errors import UserError
from atmosphere.testing import anthropic_wire, cohere_wire, gemini_wire, openai_wire
from atmosphere.testing.model_stream import Answer, Paced
from atmosphere.testing.model_turns import ModelRequest, Turn

if TYPE_CHECKING:
    from contextlib import AbstractAsyncContextManager


class NativeWire(Protocol):
    """A provider's own wire, as the scripted model speaks it: one module of `atmosphere.testing`."""

    def claims(self, method: str, path: str, headers: Mapping[str, str]) -> bool:
        """Whether a request is on this wire (a model call, or any request of its SDK's client)."""
        ...

    def is_models(self, method: str, path: str) -> bool:
        """The route listing the models."""
        ...

    def models(self, names: tuple[str, ...]) -> Answer:
        """The model listing."""
        ...

    def is_call(self, method: str, path: str) -> bool:
        """The route of a model call."""
        ...

    def request_of(self, body: Mapping[str, Any], headers: Mapping[str, str]) -> ModelRequest:
        """What a model call asks, for the script."""
        ...

    def answer(self, turn: Turn, body: Mapping[str, Any], path: str) -> Answer:
        """`turn` as the answer to the call `body` at `path` (a path may say whether to stream)."""
        ...

    def failure(self, status: int, message: str) -> Answer:
        """An error the fake itself answers (a refused request, a broken script)."""
        ...


NATIVE_WIRES: tuple[NativeWire, ...] = (anthropic_wire, cohere_wire, gemini_wire)
"""The native wires, each tried in turn before OpenAI's (which takes what none claims)."""

REFUSED = (
    "Model requests are refused in atmosphere.testing: script the model with ScriptedModel(...) "
    "or pass allow_model_requests=True with a RuntimeConfig"
)

Script = Callable[[ModelRequest], Turn]


class ScriptedModel:
    """A model that answers from a script: turns in order, or a function of the request.

    A request past the end of the script (with no `default`) is answered with a 400 naming the
    request number: not retried, so a test that makes one call too many fails at once.
    """

    def __init__(
        self,
        *turns: Turn | str,
        function: Script | None = None,
        default: Turn | None = None,
        models: tuple[str, ...] = ("fake-model",),
    ) -> None:
        """Answer with `turns` in order (a plain string is a text turn), or with `function(request)`.

        `default` answers every request once the turns are used up (a benchmark's endless
        model); `models` is what `GET /models` lists.
        """
        if turns and function is not None:
            msg = "give ScriptedModel either turns or a function, not both"
            raise UserError(msg)
        self.turns: list[Turn] = []
        """The turns not answered yet, next first (a test may clear or replace them)."""
        self.function = function
        self.default = default
        self.models = models
        self.requests: list[ModelRequest] = []
        """Every model request (a chat completion, or an Anthropic message), in order: also a
        mapping over its body as its wire sent it (`requests[0]["messages"]`)."""
        self.headers: list[dict[str, str]] = []
        """Each model request's headers, names in lower case (as `requests[i].headers`)."""
        self.disconnects = 0
        """Clients that hung up before the answer ended."""
        self.disconnected = asyncio.Event()
        """Set at the first disconnect."""
        self.base_url = ""
        """`http://127.0.0.1:<port>/v1` while `serving()`."""
        self._answered = 0
        self.script(*turns)

    def script(self, *turns: Turn | str) -> ScriptedModel:
        """Append `turns` to the script (a plain string is a text turn)."""
        if turns and self.function is not None:
            msg = "this ScriptedModel answers with its function: it takes no turns"
            raise UserError(msg)
        self.turns.extend(Turn.text(t) if isinstance(t, str) else t for t in turns)
        return self

    @property
    def root_url(self) -> str:
        """`http://127.0.0.1:<port>` while `serving()`, with no version prefix.

        The base URL of a client that adds its own to each path (Anthropic's `/v1`, Cohere's
        `/v2`, Gemini's `/v1beta`).
        """
        return self.base_url.removesuffix("/v1")

    @property
    def anthropic_base_url(self) -> str:
        """The base URL of an Anthropic client (`root_url`: it adds `/v1`)."""
        return self.root_url

    def serving(self) -> AbstractAsyncContextManager[ScriptedModel]:
        """Serve on 127.0.0.1 on a free port (`base_url`) until the context exits."""
        from atmosphere.testing.model_server import serving  # noqa: PLC0415 - the server needs this module

        return serving(self)

    def respond(self, method: str, path: str, headers: Mapping[str, str], content: bytes) -> Answer:
        """The answer to one HTTP request, whichever transport brought it.

        The routes are a wire's: each native wire of `NATIVE_WIRES` claims its own requests (its
        model calls, and any request of its SDK's client, its model listing included); OpenAI's
        chat completions and models take the rest. All answer from the same script.
        """
        for wire in NATIVE_WIRES:
            if wire.claims(method, path, headers):
                return self._respond_on(wire, method, path, headers, content)
        if openai_wire.is_models(method, path):
            return openai_wire.models(self.models)
        if not openai_wire.is_completions(method, path):
            return openai_wire.failure(404, f"the scripted model has no route {method} {path}", "not_found")
        body = _json_object(content)
        if isinstance(body, str):
            return openai_wire.failure(400, body, "invalid_request_error")
        request = openai_wire.request_of(body, headers)
        self.headers.append(dict(headers))
        return openai_wire.answer(self._next(request), body)

    def _respond_on(
        self, wire: NativeWire, method: str, path: str, headers: Mapping[str, str], content: bytes
    ) -> Answer:
        """The answer on a native wire (one module of `atmosphere.testing`, as `anthropic_wire`)."""
        if wire.is_models(method, path):
            return wire.models(self.models)
        if not wire.is_call(method, path):
            return wire.failure(404, f"the scripted model has no route {method} {path}")
        body = _json_object(content)
        if isinstance(body, str):
            return wire.failure(400, body)
        request = wire.request_of(body, headers)
        self.headers.append(dict(headers))
        return wire.answer(self._next(request), body, path)

    def _next(self, request: ModelRequest) -> Turn:
        self.requests.append(request)
        if self.function is not None:
            try:
                return self.function(request)
            except Exception as exc:  # a bug in the test's script: shown in the run's error, never retried
                return Turn.error(f"the script function raised {type(exc).__name__}: {exc}")
        if self.turns:
            self._answered += 1
            return self.turns.pop(0)
        if self.default is not None:
            return self.default
        number = len(self.requests)
        return Turn.error(
            f"the scripted model has no turn left for request {number} (it answered {self._answered} scripted turns)"
        )

    def hung_up(self) -> None:
        """Count a client that went away before the answer ended."""
        self.disconnects += 1
        self.disconnected.set()

    async def handle(self, http: httpx.Request) -> httpx.Response:
        """Answer one request in memory (the `httpx.MockTransport` handler).

        Paced as over HTTP: `silence` holds the headers back, `chunk_delay` and `stall` space the
        stream out. The client's read timeout (httpx's, which a mock transport does not apply)
        is applied here, as the network would: silence or a stall longer than it is the client's
        `httpx.ReadTimeout`. A client that stops reading, or is cancelled, before the end counts
        as a disconnect.
        """
        answer = self.respond(http.method, http.url.path, dict(http.headers.items()), http.content)
        read_timeout = _read_timeout(http)
        if answer.silence:
            await self._silent(answer.silence, read_timeout, http)
        headers = list(answer.headers)
        if answer.stream is None:
            return httpx.Response(answer.status, headers=headers, json=answer.json)
        stream = _Received(answer.stream, read_timeout, http, self.hung_up)
        return httpx.Response(answer.status, headers=headers, stream=stream)

    async def _silent(self, seconds: float, read_timeout: float | None, http: httpx.Request) -> None:
        try:
            async with asyncio.timeout(read_timeout):
                await asyncio.sleep(seconds)
        except TimeoutError:
            self.hung_up()
            msg = f"the scripted model said nothing for {read_timeout:g} s"
            raise httpx.ReadTimeout(msg, request=http) from None
        except asyncio.CancelledError:
            self.hung_up()
            raise


class _Received(httpx.AsyncByteStream):
    """A paced stream as the client reads it in memory: its read timeout applied, a hang-up counted."""

    def __init__(
        self, paced: Paced, read_timeout: float | None, request: httpx.Request, hung_up: Callable[[], None]
    ) -> None:
        self._paced = paced
        self._read_timeout = read_timeout
        self._request = request
        self._hung_up = hung_up
        self._frames: AsyncGenerator[bytes, None] | None = None
        self._closed = False

    async def __aiter__(self) -> AsyncGenerator[bytes, None]:
        frames = self._frames = self._paced.frames()
        while True:
            try:
                async with asyncio.timeout(self._read_timeout):
                    frame = await anext(frames)
            except StopAsyncIteration:
                return
            except TimeoutError:
                msg = f"the scripted model's stream stalled for {self._read_timeout:g} s"
                raise httpx.ReadTimeout(msg, request=self._request) from None
            yield frame

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        if not self._paced.delivered:
            self._hung_up()
        if self._frames is not None:
            with contextlib.suppress(RuntimeError):  # already closing in the reader's own task
                await self._frames.aclose()


def _json_object(content: bytes) -> dict[str, Any] | str:
    """A request's JSON object body, or why it is none (the text of a 400)."""
    try:
        body = json.loads(content or b"{}")
    except ValueError as exc:
        return f"the request body is not JSON: {exc}"
    if not isinstance(body, dict):
        return "the request body is not a JSON object"
    return body


def _read_timeout(http: httpx.Request) -> float | None:
    """The client's read timeout for `http` (httpx puts its timeouts in the request's extensions)."""
    timeouts: Any = http.extensions.get("timeout") or {}
    value = timeouts.get("read")
    return float(value) if value is not None else None


def refuse(_request: httpx.Request) -> httpx.Response:
    """The transport's answer when no model is scripted: every request refused, nothing sent out."""
    answer = openai_wire.failure(403, REFUSED)
    return httpx.Response(answer.status, json=answer.json)
