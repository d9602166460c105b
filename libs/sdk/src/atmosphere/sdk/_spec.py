"""What a declaration records about its class (`AgentSpec`), checked from what its decorator was given.

`@agent`, `@coordinator` and `@ai_endpoint` (`_agent.py`) each gather their keywords into one
`AgentOptions`, as written; `record_spec` checks it against the class and leaves the class's
`AgentSpec` on it, where hosts read it (`spec_of`). A misuse is refused there, at declaration,
with the class named.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar, cast

from pydantic import BaseModel

from atmosphere.sdk._harness import Harness, PromptCache
from atmosphere.sdk._mcp import McpServer, mcp_servers_by_name
from atmosphere.sdk._permission import PermissionMode
from atmosphere.sdk._policies import AiBudget, RetryPolicy, ToolLoopPolicy
from atmosphere.sdk._remote import RemoteAgent
from atmosphere.sdk._request import AiInterceptor
from atmosphere.sdk._tool import Tool
from atmosphere.sdk.errors import UserError
from atmosphere.sdk.runtime import RUNTIME_NAME

T = TypeVar("T", bound=type[Any])

SPEC_ATTR = "__atmosphere_agent__"
PROMPT_ATTR = "__atmosphere_prompt__"
"""Set on the method `@prompt` marks."""


@dataclass(frozen=True, slots=True)
class AgentSpec:
    """What a declaration decorator records about a class."""

    name: str
    cls: type[Any]
    prompt_method: str | None
    """The `@prompt` method, or None: then a prompt is answered with `session.stream(message)`."""
    kind: str = "agent"
    """"agent", "coordinator" or "ai_endpoint"."""
    path: str = ""
    system_prompt: str = ""
    description: str = ""
    tools: tuple[Tool[Any, Any], ...] = ()
    mcp_servers: tuple[McpServer, ...] = ()
    """The MCP servers whose tools its model may call (`<server>__<tool>`), while they answer."""
    fleet: tuple[str, ...] = ()
    """Coordinator only: the agents of the app it may delegate to."""
    remotes: tuple[RemoteAgent, ...] = ()
    """Coordinator only: the remote A2A agents it may delegate to (its fleet's `RemoteAgent`s)."""
    interceptors: tuple[AiInterceptor, ...] = ()
    tool_loop: ToolLoopPolicy = ToolLoopPolicy.DEFAULT
    retry: RetryPolicy = RetryPolicy.DEFAULT
    budget: AiBudget | None = None
    response_format: type[BaseModel] | None = None
    structured_output_retries: int = 0
    model: str | None = None
    harness: tuple[Harness, ...] = ()
    """The declared harness (`@agent`/`@coordinator` default to `ALL`, `@ai_endpoint` to none)."""
    headless: bool = False
    """No prompt loop for the harness to complete: the harness does not apply."""
    max_history_messages: int = 20
    """Messages of conversation history kept (>= 2)."""
    conversation_memory: bool = False
    """`@ai_endpoint` only: keep history even without the MEMORY feature."""
    prompt_cache: PromptCache = PromptCache.NONE
    """The prompt-cache policy; NONE lets the harness's CACHE feature seed one."""
    permission_mode: PermissionMode = PermissionMode.DEFAULT
    """How its tool calls are gated; a request may make it stricter, never looser."""
    runtime: str = ""
    """The runtime it is pinned to (`@agent(runtime="langchain")`), served by that runtime's own
    dispatch pool; empty: the default pool's runtime (the highest-priority available one)."""
    native: object | None = None
    """The user's own framework object it hosts (`hosted_agent`), run by `runtime`: the object, or
    a `NativeReference` to it (see `hosted_object`)."""

    def hosted_object(self) -> object | None:
        """The framework object it hosts, imported now when the app named it by its import path."""
        native = self.native
        return native.load() if isinstance(native, NativeReference) else native

    @property
    def pool(self) -> str:
        """The dispatch pool that runs it: its runtime's, or "" for the default pool."""
        return self.runtime


NATIVE_PATH = re.compile(r"[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*:[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*")
"""`package.module:attribute`, as an entry point names an object."""


@dataclass(frozen=True, slots=True)
class NativeReference:
    """A hosted framework object named by its import path (`"package.module:attribute"`).

    Only the dispatch pool that runs it imports it (`AgentSpec.hosted_object`): the other pools,
    the front doors and the sandbox, which load the same app, never import its framework, which
    need not even be installed beside them (a pool of its own runs in an image of its own).
    """

    path: str

    def load(self) -> object:
        """The object (imported once per process); `UserError` naming the path when it cannot be."""
        return _import_object(self.path)


@functools.cache
def _import_object(path: str) -> object:
    module_name, _, attributes = path.partition(":")
    try:
        found: object = importlib.import_module(module_name)
        for attribute in attributes.split("."):
            found = getattr(found, attribute)
    except (ImportError, AttributeError) as exc:
        msg = f"cannot import the hosted object {path!r}: {exc}"
        raise UserError(msg) from exc
    return found


@dataclass(frozen=True, slots=True, kw_only=True)
class AgentOptions:
    """How a declared agent behaves, as its decorator was given it (the keywords the three share).

    Built once by `@agent`, `@coordinator` or `@ai_endpoint` from their keywords; unchecked
    until `record_spec` turns it into the class's `AgentSpec` (a name is not an option: each
    decorator derives its own). What a decorator does not take keeps the default here.
    """

    system_prompt: str = ""
    description: str = ""
    """Empty: the class's docstring."""
    tools: Sequence[Tool[Any, Any]] = ()
    mcp_servers: Sequence[McpServer] = ()
    fleet: Sequence[type[Any] | str | RemoteAgent] = ()
    """`@coordinator` only: the agents it may delegate to, as classes or names, and remote A2A agents."""
    interceptors: Sequence[AiInterceptor | type[AiInterceptor]] = ()
    """Instances, or classes built once with no arguments."""
    tool_loop: ToolLoopPolicy = ToolLoopPolicy.DEFAULT
    retry: RetryPolicy = RetryPolicy.DEFAULT
    budget: AiBudget | None = None
    response_format: type[BaseModel] | None = None
    structured_output_retries: int = 0
    model: str | None = None
    harness: Sequence[Harness] = ()
    headless: bool = False
    max_history_messages: int = 20
    conversation_memory: bool = False
    prompt_cache: PromptCache | str = PromptCache.NONE
    permission_mode: PermissionMode | str = PermissionMode.DEFAULT
    runtime: str | None = None
    """Pin the agent to one runtime (and so to that runtime's dispatch pool); None: the default."""
    native: object | None = None


def record_spec(cls: T, *, name: str, kind: str, path: str, options: AgentOptions) -> T:
    """Check `options` against `cls` and record its `AgentSpec` on it; `UserError` names the misuse."""
    owner = cls.__qualname__
    fleet, remotes = _fleet(options.fleet, owner)
    try:
        inspect.signature(cls).bind()
    except TypeError as exc:
        msg = f"{owner} must be constructible without arguments: {exc}"
        raise UserError(msg) from exc
    tools = _tools(options.tools, owner)
    _require(options.max_history_messages >= 2, f"{owner}: max_history_messages must be >= 2")
    harness = _harness(options.harness, owner)
    prompt_cache = _prompt_cache(options.prompt_cache, owner)
    permission_mode = _permission_mode(options.permission_mode, owner)
    _require(options.structured_output_retries >= 0, f"{owner}: structured_output_retries must be >= 0")
    runtime = options.runtime or ""
    _require(
        not runtime or RUNTIME_NAME.fullmatch(runtime) is not None,
        f"{owner}: runtime {runtime!r} must be 1-32 lower-case letters, digits, '_' or '-' (e.g. 'langchain')",
    )
    response_format = options.response_format
    _require(
        response_format is None or (isinstance(response_format, type) and issubclass(response_format, BaseModel)),
        f"{owner}: response_format must be a pydantic BaseModel subclass",
    )
    spec = AgentSpec(
        name=name,
        cls=cls,
        prompt_method=_prompt_method(cls),
        kind=kind,
        path=path,
        system_prompt=options.system_prompt,
        description=options.description or inspect.getdoc(cls) or "",
        tools=tools,
        mcp_servers=mcp_servers_by_name(options.mcp_servers, owner),
        fleet=fleet,
        remotes=remotes,
        interceptors=_interceptors(options.interceptors, owner),
        tool_loop=options.tool_loop,
        retry=options.retry,
        budget=options.budget,
        response_format=response_format,
        structured_output_retries=options.structured_output_retries,
        model=options.model,
        harness=harness,
        headless=options.headless,
        max_history_messages=options.max_history_messages,
        conversation_memory=options.conversation_memory,
        prompt_cache=prompt_cache,
        permission_mode=permission_mode,
        runtime=runtime,
        native=options.native,
    )
    setattr(cls, SPEC_ATTR, spec)
    return cls


def spec_of(cls: type[Any]) -> AgentSpec:
    """The `AgentSpec` of a declared class; `UserError` for anything else."""
    spec = cls.__dict__.get(SPEC_ATTR) if isinstance(cls, type) else None
    if not isinstance(spec, AgentSpec):
        msg = f"{cls!r} is not an @agent, @coordinator or @ai_endpoint class"
        raise UserError(msg)
    return spec


def _require(holds: bool, message: str) -> None:
    if not holds:
        raise UserError(message)


def _fleet(
    members: Iterable[type[Any] | str | RemoteAgent], owner: str
) -> tuple[tuple[str, ...], tuple[RemoteAgent, ...]]:
    """The local members' names and the remote members, each name once across both."""
    local: list[str] = []
    remotes: list[RemoteAgent] = []
    for member in members:
        if isinstance(member, RemoteAgent):
            remotes.append(member)
        else:
            local.append(member if isinstance(member, str) else spec_of(member).name)
    names = [*local, *(r.name for r in remotes)]
    twice = sorted({n for n in names if names.count(n) > 1} & {r.name for r in remotes})
    _require(not twice, f"{owner}: the fleet names {twice} twice (a remote agent's name must be its own)")
    urls = [r.url for r in remotes if r.url]
    _require(len(set(urls)) == len(urls), f"{owner}: two remote fleet members share a URL")
    return tuple(local), tuple(remotes)


def _tools(values: Iterable[object], owner: str) -> tuple[Tool[Any, Any], ...]:
    tools: list[Tool[Any, Any]] = []
    for item in values:
        if not isinstance(item, Tool):
            msg = f"{owner}: tools must be @tool functions, got {item!r}"
            raise UserError(msg)
        tools.append(item)
    names = [t.name for t in tools]
    if len(set(names)) != len(names):
        msg = f"{owner}: two tools share a name in {names}"
        raise UserError(msg)
    return tuple(tools)


def _harness(value: Iterable[object], owner: str) -> tuple[Harness, ...]:
    # A single `Harness` is a `str` (a StrEnum): iterating it would give its letters.
    if isinstance(value, (str, Harness)) or not all(isinstance(h, Harness) for h in value):
        msg = f"{owner}: harness must be a list of Harness values, e.g. [Harness.MEMORY]"
        raise UserError(msg)
    return tuple(cast("Iterable[Harness]", value))


def _prompt_method(cls: type[Any]) -> str | None:
    prompts = [n for n, member in inspect.getmembers(cls) if getattr(member, PROMPT_ATTR, False)]
    if len(prompts) > 1:
        msg = f"{cls.__qualname__} has {len(prompts)} @prompt methods; at most one is allowed"
        raise UserError(msg)
    return prompts[0] if prompts else None


def _interceptors(values: Sequence[object], owner: str) -> tuple[AiInterceptor, ...]:
    result: list[AiInterceptor] = []
    for value in values:
        instance: object = value() if isinstance(value, type) else value
        if not isinstance(instance, AiInterceptor):
            msg = f"{owner}: {value!r} is not an AiInterceptor"
            raise UserError(msg)
        result.append(instance)
    return tuple(result)


def _prompt_cache(value: object, owner: str) -> PromptCache:
    if isinstance(value, PromptCache):
        return value
    try:
        return PromptCache(str(value).lower())
    except ValueError:
        msg = f"{owner}: prompt_cache must be a PromptCache (none, conservative, aggressive), got {value!r}"
        raise UserError(msg) from None


def _permission_mode(value: object, owner: str) -> PermissionMode:
    if isinstance(value, PermissionMode):
        return value
    mode = PermissionMode.parse(value) if isinstance(value, str) else None
    if mode is None:
        names = ", ".join(m.name for m in PermissionMode)
        msg = f"{owner}: permission_mode must be a PermissionMode ({names}), got {value!r}"
        raise UserError(msg)
    return mode
