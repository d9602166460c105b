"""`@agent`, `@coordinator`, `@ai_endpoint` and `@prompt`: declaring what dispatch serves."""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from pydantic import BaseModel

from atmosphere.sdk._harness import Harness, PromptCache
from atmosphere.sdk._permission import PermissionMode
from atmosphere.sdk._policies import AiBudget, RetryPolicy, ToolLoopPolicy
from atmosphere.sdk._request import AiInterceptor
from atmosphere.sdk._tool import Tool
from atmosphere.sdk.errors import UserError

T = TypeVar("T", bound=type[Any])
F = TypeVar("F", bound=Callable[..., Any])

AGENT_PATH_PREFIX = "/atmosphere/agent/"
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_\-]{0,63}")
_PATH = re.compile(r"(/[A-Za-z0-9_\-.]+)+")
_SPEC_ATTR = "__atmosphere_agent__"
_PROMPT_ATTR = "__atmosphere_prompt__"


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
    fleet: tuple[str, ...] = ()
    """Coordinator only: the agents it may delegate to."""
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


def prompt(func: F) -> F:
    """Mark `async def handler(self, message: str, session: StreamingSession)` as the prompt handler."""
    if not inspect.iscoroutinefunction(func):
        msg = f"@prompt {func.__qualname__} must be an async def"
        raise UserError(msg)
    params = list(inspect.signature(func).parameters)
    if len(params) != 3:
        msg = f"@prompt {func.__qualname__} must take (self, message, session), got ({', '.join(params)})"
        raise UserError(msg)
    setattr(func, _PROMPT_ATTR, True)
    return func


def _check_name(name: str, what: str) -> str:
    if not _NAME.fullmatch(name):
        msg = f"{what} name {name!r} must be 1-64 letters, digits, '_' or '-', starting alphanumeric"
        raise UserError(msg)
    return name


def _prompt_method(cls: type[Any]) -> str | None:
    prompts = [n for n, member in inspect.getmembers(cls) if getattr(member, _PROMPT_ATTR, False)]
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


def _register(cls: T, **fields: Any) -> T:
    owner = cls.__qualname__
    try:
        inspect.signature(cls).bind()
    except TypeError as exc:
        msg = f"{owner} must be constructible without arguments: {exc}"
        raise UserError(msg) from exc
    tools = tuple(fields.pop("tools"))
    for item in tools:
        if not isinstance(item, Tool):
            msg = f"{owner}: tools must be @tool functions, got {item!r}"
            raise UserError(msg)
    names = [t.name for t in tools]
    if len(set(names)) != len(names):
        msg = f"{owner}: two tools share a name in {names}"
        raise UserError(msg)
    if fields["max_history_messages"] < 2:
        msg = f"{owner}: max_history_messages must be >= 2"
        raise UserError(msg)
    harness = fields["harness"]
    if isinstance(harness, (str, Harness)) or not all(isinstance(h, Harness) for h in harness):
        msg = f"{owner}: harness must be a list of Harness values, e.g. [Harness.MEMORY]"
        raise UserError(msg)
    fields["harness"] = tuple(harness)
    fields["prompt_cache"] = _prompt_cache(fields["prompt_cache"], owner)
    fields["permission_mode"] = _permission_mode(fields["permission_mode"], owner)
    if fields["structured_output_retries"] < 0:
        msg = f"{owner}: structured_output_retries must be >= 0"
        raise UserError(msg)
    response_format = fields["response_format"]
    if response_format is not None and not (
        isinstance(response_format, type) and issubclass(response_format, BaseModel)
    ):
        msg = f"{owner}: response_format must be a pydantic BaseModel subclass"
        raise UserError(msg)
    spec = AgentSpec(
        cls=cls,
        prompt_method=_prompt_method(cls),
        description=fields.pop("description") or inspect.getdoc(cls) or "",
        tools=tools,
        interceptors=_interceptors(fields.pop("interceptors"), owner),
        **fields,
    )
    setattr(cls, _SPEC_ATTR, spec)
    return cls


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


def agent(
    *,
    name: str | None = None,
    system_prompt: str = "",
    description: str = "",
    tools: Sequence[Tool[Any, Any]] = (),
    interceptors: Sequence[AiInterceptor | type[AiInterceptor]] = (),
    tool_loop: ToolLoopPolicy = ToolLoopPolicy.DEFAULT,
    retry: RetryPolicy = RetryPolicy.DEFAULT,
    budget: AiBudget | None = None,
    response_format: type[BaseModel] | None = None,
    structured_output_retries: int = 0,
    model: str | None = None,
    harness: Sequence[Harness] = (Harness.ALL,),
    headless: bool = False,
    max_history_messages: int = 20,
    prompt_cache: PromptCache | str = PromptCache.NONE,
    permission_mode: PermissionMode | str = PermissionMode.DEFAULT,
) -> Callable[[T], T]:
    """Declare an agent served at `/atmosphere/agent/<name>` (default name: the class name).

    Without a `@prompt` method, each prompt is answered with `session.stream(message)`. The full
    harness is on unless `harness=` says otherwise (`harness=[]` is a bare loop).
    `permission_mode` gates its tool calls (`PermissionMode`; default: each tool as it declares).
    """

    def register(cls: T) -> T:
        agent_name = _check_name(name or cls.__name__.lower(), "agent")
        return _register(
            cls,
            name=agent_name,
            kind="agent",
            path=AGENT_PATH_PREFIX + agent_name,
            system_prompt=system_prompt,
            description=description,
            tools=tools,
            interceptors=interceptors,
            tool_loop=tool_loop,
            retry=retry,
            budget=budget,
            response_format=response_format,
            structured_output_retries=structured_output_retries,
            model=model,
            harness=harness,
            headless=headless,
            max_history_messages=max_history_messages,
            conversation_memory=False,
            prompt_cache=prompt_cache,
            permission_mode=permission_mode,
        )

    return register


def coordinator(
    *,
    name: str | None = None,
    fleet: Sequence[type[Any] | str] = (),
    system_prompt: str = "",
    description: str = "",
    tools: Sequence[Tool[Any, Any]] = (),
    interceptors: Sequence[AiInterceptor | type[AiInterceptor]] = (),
    tool_loop: ToolLoopPolicy = ToolLoopPolicy.DEFAULT,
    retry: RetryPolicy = RetryPolicy.DEFAULT,
    budget: AiBudget | None = None,
    model: str | None = None,
    harness: Sequence[Harness] = (Harness.ALL,),
    max_history_messages: int = 20,
    prompt_cache: PromptCache | str = PromptCache.NONE,
    permission_mode: PermissionMode | str = PermissionMode.DEFAULT,
) -> Callable[[T], T]:
    """Declare an agent that delegates to a `fleet` of other agents (classes or names).

    With the DELEGATION feature (on by default) it gets `delegate_task` and `task`.
    """

    def register(cls: T) -> T:
        agent_name = _check_name(name or cls.__name__.lower(), "coordinator")
        members = tuple(m if isinstance(m, str) else spec_of(m).name for m in fleet)
        return _register(
            cls,
            name=agent_name,
            kind="coordinator",
            path=AGENT_PATH_PREFIX + agent_name,
            fleet=members,
            system_prompt=system_prompt,
            description=description,
            tools=tools,
            interceptors=interceptors,
            tool_loop=tool_loop,
            retry=retry,
            budget=budget,
            response_format=None,
            structured_output_retries=0,
            model=model,
            harness=harness,
            headless=False,
            max_history_messages=max_history_messages,
            conversation_memory=False,
            prompt_cache=prompt_cache,
            permission_mode=permission_mode,
        )

    return register


def ai_endpoint(
    *,
    path: str,
    system_prompt: str = "",
    description: str = "",
    tools: Sequence[Tool[Any, Any]] = (),
    interceptors: Sequence[AiInterceptor | type[AiInterceptor]] = (),
    tool_loop: ToolLoopPolicy = ToolLoopPolicy.DEFAULT,
    retry: RetryPolicy = RetryPolicy.DEFAULT,
    budget: AiBudget | None = None,
    response_format: type[BaseModel] | None = None,
    structured_output_retries: int = 0,
    model: str | None = None,
    harness: Sequence[Harness] = (),
    conversation_memory: bool = False,
    max_history_messages: int = 20,
    prompt_cache: PromptCache | str = PromptCache.NONE,
    permission_mode: PermissionMode | str = PermissionMode.DEFAULT,
) -> Callable[[T], T]:
    """Declare a bare endpoint at `path`; it is named by the path's last segment.

    Bare by default: opt in to harness features with `harness=[Harness.ALL]` (or a selection).
    """
    if not _PATH.fullmatch(path):
        msg = f"@ai_endpoint path {path!r} must look like /segment/segment"
        raise UserError(msg)

    def register(cls: T) -> T:
        endpoint_name = _check_name(path.rsplit("/", 1)[1], "endpoint")
        return _register(
            cls,
            name=endpoint_name,
            kind="ai_endpoint",
            path=path,
            system_prompt=system_prompt,
            description=description,
            tools=tools,
            interceptors=interceptors,
            tool_loop=tool_loop,
            retry=retry,
            budget=budget,
            response_format=response_format,
            structured_output_retries=structured_output_retries,
            model=model,
            harness=harness,
            headless=False,
            max_history_messages=max_history_messages,
            conversation_memory=conversation_memory,
            prompt_cache=prompt_cache,
            permission_mode=permission_mode,
        )

    return register


def spec_of(cls: type[Any]) -> AgentSpec:
    """The `AgentSpec` of a declared class; `UserError` for anything else."""
    spec = cls.__dict__.get(_SPEC_ATTR) if isinstance(cls, type) else None
    if not isinstance(spec, AgentSpec):
        msg = f"{cls!r} is not an @agent, @coordinator or @ai_endpoint class"
        raise UserError(msg)
    return spec
