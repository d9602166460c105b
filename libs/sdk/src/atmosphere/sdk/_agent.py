"""`@agent`, `@coordinator`, `@ai_endpoint` and `@prompt`: declaring what dispatch serves.

Each decorator names its agent and gathers the rest of its keywords into one `AgentOptions`;
`record_spec` (`_spec.py`) checks it and records the class's `AgentSpec`.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from pydantic import BaseModel

from atmosphere.sdk._harness import Harness, PromptCache
from atmosphere.sdk._mcp import McpServer
from atmosphere.sdk._permission import PermissionMode
from atmosphere.sdk._policies import AiBudget, RetryPolicy, ToolLoopPolicy
from atmosphere.sdk._remote import AGENT_NAME, RemoteAgent
from atmosphere.sdk._request import AiInterceptor
from atmosphere.sdk._spec import PROMPT_ATTR, AgentOptions, record_spec
from atmosphere.sdk._tool import Tool
from atmosphere.sdk.errors import UserError

T = TypeVar("T", bound=type[Any])
F = TypeVar("F", bound=Callable[..., Any])

AGENT_PATH_PREFIX = "/atmosphere/agent/"
_NAME = AGENT_NAME
_PATH = re.compile(r"(/[A-Za-z0-9_\-.]+)+")


def prompt(func: F) -> F:
    """Mark `async def handler(self, message: str, session: StreamingSession)` as the prompt handler."""
    if not inspect.iscoroutinefunction(func):
        msg = f"@prompt {func.__qualname__} must be an async def"
        raise UserError(msg)
    params = list(inspect.signature(func).parameters)
    if len(params) != 3:
        msg = f"@prompt {func.__qualname__} must take (self, message, session), got ({', '.join(params)})"
        raise UserError(msg)
    setattr(func, PROMPT_ATTR, True)
    return func


def check_name(name: str, what: str) -> str:
    if not _NAME.fullmatch(name):
        msg = f"{what} name {name!r} must be 1-64 letters, digits, '_' or '-', starting alphanumeric"
        raise UserError(msg)
    return name


def agent(
    *,
    name: str | None = None,
    system_prompt: str = "",
    description: str = "",
    tools: Sequence[Tool[Any, Any]] = (),
    mcp_servers: Sequence[McpServer] = (),
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
    runtime: str | None = None,
) -> Callable[[T], T]:
    """Declare an agent served at `/atmosphere/agent/<name>` (default name: the class name).

    Without a `@prompt` method, each prompt is answered with `session.stream(message)`. The full
    harness is on unless `harness=` says otherwise (`harness=[]` is a bare loop).
    `permission_mode` gates its tool calls (`PermissionMode`; default: each tool as it declares).
    `mcp_servers` adds the tools of MCP servers (`McpServer.http`, `McpServer.stdio`), named
    `<server>__<tool>` for the model and `<server>.<tool>` for governance, offered while they answer.
    """
    options = AgentOptions(
        system_prompt=system_prompt,
        description=description,
        tools=tools,
        mcp_servers=mcp_servers,
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
        prompt_cache=prompt_cache,
        permission_mode=permission_mode,
        runtime=runtime,
    )

    def register(cls: T) -> T:
        agent_name = check_name(name or cls.__name__.lower(), "agent")
        return record_spec(cls, name=agent_name, kind="agent", path=AGENT_PATH_PREFIX + agent_name, options=options)

    return register


def coordinator(
    *,
    name: str | None = None,
    fleet: Sequence[type[Any] | str | RemoteAgent] = (),
    system_prompt: str = "",
    description: str = "",
    tools: Sequence[Tool[Any, Any]] = (),
    mcp_servers: Sequence[McpServer] = (),
    interceptors: Sequence[AiInterceptor | type[AiInterceptor]] = (),
    tool_loop: ToolLoopPolicy = ToolLoopPolicy.DEFAULT,
    retry: RetryPolicy = RetryPolicy.DEFAULT,
    budget: AiBudget | None = None,
    model: str | None = None,
    harness: Sequence[Harness] = (Harness.ALL,),
    max_history_messages: int = 20,
    prompt_cache: PromptCache | str = PromptCache.NONE,
    permission_mode: PermissionMode | str = PermissionMode.DEFAULT,
    runtime: str | None = None,
) -> Callable[[T], T]:
    """Declare an agent that delegates to a `fleet` of other agents (classes or names, or `RemoteAgent`s).

    With the DELEGATION feature (on by default) it gets `delegate_task` and `task`.
    """
    options = AgentOptions(
        fleet=fleet,
        system_prompt=system_prompt,
        description=description,
        tools=tools,
        mcp_servers=mcp_servers,
        interceptors=interceptors,
        tool_loop=tool_loop,
        retry=retry,
        budget=budget,
        model=model,
        harness=harness,
        max_history_messages=max_history_messages,
        prompt_cache=prompt_cache,
        permission_mode=permission_mode,
        runtime=runtime,
    )

    def register(cls: T) -> T:
        agent_name = check_name(name or cls.__name__.lower(), "coordinator")
        path = AGENT_PATH_PREFIX + agent_name
        return record_spec(cls, name=agent_name, kind="coordinator", path=path, options=options)

    return register


def ai_endpoint(
    *,
    path: str,
    system_prompt: str = "",
    description: str = "",
    tools: Sequence[Tool[Any, Any]] = (),
    mcp_servers: Sequence[McpServer] = (),
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
    runtime: str | None = None,
) -> Callable[[T], T]:
    """Declare a bare endpoint at `path`; it is named by the path's last segment.

    Bare by default: opt in to harness features with `harness=[Harness.ALL]` (or a selection).
    """
    if not _PATH.fullmatch(path):
        msg = f"@ai_endpoint path {path!r} must look like /segment/segment"
        raise UserError(msg)

    options = AgentOptions(
        system_prompt=system_prompt,
        description=description,
        tools=tools,
        mcp_servers=mcp_servers,
        interceptors=interceptors,
        tool_loop=tool_loop,
        retry=retry,
        budget=budget,
        response_format=response_format,
        structured_output_retries=structured_output_retries,
        model=model,
        harness=harness,
        conversation_memory=conversation_memory,
        max_history_messages=max_history_messages,
        prompt_cache=prompt_cache,
        permission_mode=permission_mode,
        runtime=runtime,
    )

    def register(cls: T) -> T:
        endpoint_name = check_name(path.rsplit("/", 1)[1], "endpoint")
        return record_spec(cls, name=endpoint_name, kind="ai_endpoint", path=path, options=options)

    return register
