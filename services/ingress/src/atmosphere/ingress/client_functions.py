"""The caller's own functions and answer format on the OpenAI doors (a governed model gateway).

A client that sends `tools` (LangChain's `bind_tools`, a PydanticAI agent's tools, the Responses
API's function tools) gets the model's calls of them back as `tool_calls` instead of having them
run here; a `response_format` of `json_object` or `json_schema` is asked of the model as sent.
Both wires validate into one `Gateway`, which travels to dispatch in the run's metadata
(`GATEWAY_METADATA_KEY`). Only an agent whose runtime declares `CLIENT_TOOLS` can serve one.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from atmosphere.contracts.dispatch.v1.dispatch_pb2 import AgentDescriptor
from atmosphere.ingress.errors import OpenAiInvalidRequestError, OpenAiUnsupportedParameterError

MAX_FUNCTIONS = 128
"""OpenAI's own limit on `tools`."""
NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
TOOL_CHOICES = frozenset({"none", "auto", "required"})
CLIENT_TOOLS = "CLIENT_TOOLS"


@dataclass(frozen=True)
class Function:
    """One of the caller's functions."""

    name: str
    description: str
    parameters: dict[str, Any]

    def as_metadata(self) -> dict[str, Any]:
        return {"name": self.name, "description": self.description, "parameters": self.parameters}


@dataclass(frozen=True)
class Gateway:
    """What the caller brought besides its messages; empty for an ordinary completion."""

    functions: tuple[Function, ...] = ()
    tool_choice: str | dict[str, Any] | None = None
    response_format: dict[str, Any] | None = None
    continuation: tuple[dict[str, Any], ...] = ()
    """Turns after the last user message (the model's calls and their results), as history turns."""
    tool_turns: bool = False
    """Whether any turn (history or continuation) is a call of a function or its result."""
    names: frozenset[str] = field(default_factory=frozenset)

    @property
    def used(self) -> bool:
        return bool(self.functions or self.response_format or self.continuation or self.tool_turns)

    def metadata(self) -> dict[str, Any]:
        """The run's `GATEWAY_METADATA_KEY` object."""
        return {
            "tools": [f.as_metadata() for f in self.functions],
            "tool_choice": self.tool_choice,
            "response_format": self.response_format,
            "continuation": list(self.continuation),
        }


def split_exchange(
    turns: list[dict[str, Any]],
    *,
    functions: tuple[Function, ...],
    tool_choice: str | dict[str, Any] | None,
    response_format: dict[str, Any] | None,
) -> tuple[int | None, Gateway]:
    """Where the last user message is in `turns` (None: none), and the gateway: the turns after it its continuation.

    Each wire says in its own words what it makes of a missing or empty question.
    """
    asked = max((i for i, m in enumerate(turns) if m["role"] == "user"), default=None)
    gateway = Gateway(
        functions=functions,
        tool_choice=tool_choice,
        response_format=response_format,
        continuation=tuple(turns[asked + 1 :] if asked is not None else turns),
        tool_turns=any("tool_calls" in m or m["role"] == "tool" for m in turns),
        names=frozenset(f.name for f in functions),
    )
    return asked, gateway


def check_served(gateway: Gateway, agent: AgentDescriptor, *, param: str = "tools") -> None:
    """Refuse a gateway the agent cannot serve: a runtime without `CLIENT_TOOLS`, or a function named as its tool."""
    if not gateway.used:
        return
    if CLIENT_TOOLS not in agent.capabilities:
        runtime = agent.runtime or "its runtime"
        raise OpenAiUnsupportedParameterError(
            f"The agent '{agent.name}' cannot take the client's own functions, tool messages or a JSON "
            f"response_format: its runtime '{runtime}' cannot hand tool calls back (it lacks {CLIENT_TOOLS}).",
            param=param,
        )
    clash = sorted(gateway.names & set(agent.tools))
    if clash:
        raise OpenAiInvalidRequestError(
            f"The function '{clash[0]}' has the name of one of the agent's own tools; rename it.", param=param
        )


def function(name: Any, description: Any, parameters: Any, *, where: str, param: str = "tools") -> Function:
    """One function, checked as OpenAI checks it."""
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise OpenAiInvalidRequestError(
            f"{where}.name must be 1 to 64 letters, digits, underscores or dashes.", param=param
        )
    if description is not None and not isinstance(description, str):
        raise OpenAiInvalidRequestError(f"{where}.description must be a string.", param=param)
    if parameters is None:
        parameters = {"type": "object", "properties": {}}
    if not isinstance(parameters, dict) or parameters.get("type", "object") != "object":
        raise OpenAiInvalidRequestError(f"{where}.parameters must be a JSON schema of an object.", param=param)
    for key, kind, said in (("properties", dict, "an object"), ("required", list, "an array")):
        if key in parameters and not isinstance(parameters[key], kind):
            raise OpenAiInvalidRequestError(f"{where}.parameters.{key} must be {said}.", param=param)
    return Function(name, description or "", parameters)


def functions_of(raw: Any, read: Any) -> tuple[Function, ...]:
    """`tools` through `read(index, tool) -> Function` (each wire spells a function its way)."""
    if raw is None or raw == []:
        return ()
    if not isinstance(raw, list):
        raise OpenAiInvalidRequestError("'tools' must be an array.", param="tools")
    if len(raw) > MAX_FUNCTIONS:
        raise OpenAiInvalidRequestError(f"'tools' may hold at most {MAX_FUNCTIONS} functions.", param="tools")
    functions = tuple(read(index, tool) for index, tool in enumerate(raw))
    seen: set[str] = set()
    for f in functions:
        if f.name in seen:
            raise OpenAiInvalidRequestError(f"Two functions are named '{f.name}'.", param="tools")
        seen.add(f.name)
    return functions


def chat_function(index: int, tool: Any) -> Function:
    """A Chat Completions tool: `{"type": "function", "function": {name, description, parameters}}`."""
    where = f"tools[{index}]"
    if not isinstance(tool, dict):
        raise OpenAiInvalidRequestError(f"{where} must be an object.", param="tools")
    if tool.get("type") != "function":
        raise OpenAiUnsupportedParameterError(
            f"{where}: a tool of type '{tool.get('type')}' is not supported by this server (only 'function').",
            param="tools",
        )
    spec = tool.get("function")
    if not isinstance(spec, dict):
        raise OpenAiInvalidRequestError(f"{where}.function must be an object.", param="tools")
    return function(spec.get("name"), spec.get("description"), spec.get("parameters"), where=f"{where}.function")


def tool_choice_of(raw: Any, functions: Sequence[Function], *, nested: bool) -> str | dict[str, Any] | None:
    """`tool_choice`: `none`, `auto`, `required` or one of the functions (`nested`: Chat Completions' shape)."""
    if raw is None:
        return None
    if not functions:
        raise OpenAiInvalidRequestError(
            "'tool_choice' is only allowed when 'tools' are specified.", param="tool_choice"
        )
    if isinstance(raw, str):
        if raw not in TOOL_CHOICES:
            raise OpenAiInvalidRequestError(
                f"'tool_choice' must be one of {sorted(TOOL_CHOICES)}.", param="tool_choice"
            )
        return raw
    if not isinstance(raw, dict) or raw.get("type") != "function":
        raise OpenAiUnsupportedParameterError(
            "A 'tool_choice' other than none, auto, required or a function is not supported by this server.",
            param="tool_choice",
        )
    name = (raw.get("function") or {}).get("name") if nested else raw.get("name")
    if name not in {f.name for f in functions}:
        raise OpenAiInvalidRequestError(f"'tool_choice' names no function of 'tools': {name!r}.", param="tool_choice")
    # The provider is always asked in Chat Completions' shape.
    return {"type": "function", "function": {"name": name}}


def response_format_of(raw: Any, *, param: str = "response_format") -> dict[str, Any] | None:
    """`text` (None: nothing to ask), `json_object`, or `json_schema` with a name and an object schema."""
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise OpenAiInvalidRequestError(f"'{param}' must be an object.", param=param)
    kind = raw.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "json_object"}
    if kind != "json_schema":
        raise OpenAiInvalidRequestError(f"'{param}.type' must be 'text', 'json_object' or 'json_schema'.", param=param)
    spec = raw.get("json_schema")
    if not isinstance(spec, dict):
        raise OpenAiInvalidRequestError(f"'{param}.json_schema' must be an object.", param=param)
    return {"type": "json_schema", "json_schema": json_schema(spec, where=f"{param}.json_schema", param=param)}


def json_schema(spec: dict[str, Any], *, where: str, param: str) -> dict[str, Any]:
    """A `json_schema` format's `{name, schema, strict, description}`, checked."""
    name = spec.get("name")
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise OpenAiInvalidRequestError(
            f"'{where}.name' must be 1 to 64 letters, digits, underscores or dashes.", param=param
        )
    schema = spec.get("schema", {})
    if not isinstance(schema, dict):
        raise OpenAiInvalidRequestError(f"'{where}.schema' must be a JSON schema object.", param=param)
    strict = spec.get("strict")
    if strict is not None and not isinstance(strict, bool):
        raise OpenAiInvalidRequestError(f"'{where}.strict' must be a boolean.", param=param)
    checked: dict[str, Any] = {"name": name, "schema": schema}
    if strict is not None:
        checked["strict"] = strict
    if isinstance(spec.get("description"), str):
        checked["description"] = spec["description"]
    return checked
