"""`@agent` and `@prompt`: declaring an agent class and its prompt handler."""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from atmosphere.sdk.errors import UserError

T = TypeVar("T", bound=type[Any])
F = TypeVar("F", bound=Callable[..., Any])

AGENT_PATH_PREFIX = "/atmosphere/agent/"
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_\-]{0,63}")
_SPEC_ATTR = "__atmosphere_agent__"
_PROMPT_ATTR = "__atmosphere_prompt__"


@dataclass(frozen=True, slots=True)
class AgentSpec:
    """What `@agent` records about a class."""

    name: str
    cls: type[Any]
    prompt_method: str
    system_prompt: str = ""
    description: str = ""
    kind: str = "agent"

    @property
    def path(self) -> str:
        """The endpoint path clients use, e.g. `/atmosphere/agent/echo`."""
        return AGENT_PATH_PREFIX + self.name


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


def agent(*, name: str | None = None, system_prompt: str = "", description: str = "") -> Callable[[T], T]:
    """Declare a class as an agent served at `/atmosphere/agent/<name>`.

    The class needs exactly one `@prompt` method and a constructor without arguments. The name
    defaults to the class name in lower case.
    """

    def register(cls: T) -> T:
        agent_name = name or cls.__name__.lower()
        if not _NAME.fullmatch(agent_name):
            msg = f"agent name {agent_name!r} must be 1-64 letters, digits, '_' or '-', starting alphanumeric"
            raise UserError(msg)
        prompts = [n for n, member in inspect.getmembers(cls) if getattr(member, _PROMPT_ATTR, False)]
        if len(prompts) != 1:
            msg = f"@agent {cls.__qualname__} needs exactly one @prompt method, found {len(prompts)}"
            raise UserError(msg)
        try:
            inspect.signature(cls).bind()
        except TypeError as exc:
            msg = f"@agent {cls.__qualname__} must be constructible without arguments: {exc}"
            raise UserError(msg) from exc
        spec = AgentSpec(
            name=agent_name,
            cls=cls,
            prompt_method=prompts[0],
            system_prompt=system_prompt,
            description=description or inspect.getdoc(cls) or "",
        )
        setattr(cls, _SPEC_ATTR, spec)
        return cls

    return register


def spec_of(cls: type[Any]) -> AgentSpec:
    """The `AgentSpec` of an `@agent` class; `UserError` for anything else."""
    spec = cls.__dict__.get(_SPEC_ATTR) if isinstance(cls, type) else None
    if not isinstance(spec, AgentSpec):
        msg = f"{cls!r} is not an @agent class"
        raise UserError(msg)
    return spec
