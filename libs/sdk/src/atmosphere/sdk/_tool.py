"""`@tool`: a Python function the model may call, with a JSON schema built at import time."""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import re
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Annotated, Any, Generic, ParamSpec, TypeVar, cast, get_origin, get_type_hints, overload

import pydantic
import pydantic_core
from pydantic import BaseModel, ConfigDict, Field, create_model
from pydantic.fields import FieldInfo

from atmosphere.contracts.tool.v1.tool_pb2 import ToolDescriptor
from atmosphere.contracts.tool.v1.tool_pb2 import ToolKind as ProtoToolKind
from atmosphere.sdk._docstrings import parse_docstring
from atmosphere.sdk.errors import UserError

P = ParamSpec("P")
R = TypeVar("R")

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_\-]{0,63}")
DEFAULT_TOOL_TIMEOUT = 60.0
"""Seconds a tool call may take unless the tool sets its own `timeout`."""
APPROVED_ARGUMENT = "__atmosphere_approved__"
"""Set (to `true`) by dispatch, never by the model, on a call the user approved after the tool
raised `ApprovalRequired`. The model cannot send it: every tool's schema forbids unknown
arguments, and the choke point refuses them before anything runs."""

_approved: contextvars.ContextVar[bool] = contextvars.ContextVar("atmosphere_tool_call_approved", default=False)


def tool_call_approved() -> bool:
    """Inside a `@tool` function: whether the user approved this call (see `ApprovalRequired`)."""
    return _approved.get()


class ToolKind(Enum):
    """What a tool does to the world; governance and approvals key on it."""

    OTHER = "other"
    READ = "read"
    EDIT = "edit"
    DELETE = "delete"
    EXECUTE = "execute"
    NETWORK = "network"

    def to_proto(self) -> int:
        """The `tool.v1.ToolKind` value."""
        return {
            ToolKind.OTHER: ProtoToolKind.TOOL_KIND_UNSPECIFIED,
            ToolKind.READ: ProtoToolKind.TOOL_KIND_READ,
            ToolKind.EDIT: ProtoToolKind.TOOL_KIND_EDIT,
            ToolKind.DELETE: ProtoToolKind.TOOL_KIND_DELETE,
            ToolKind.EXECUTE: ProtoToolKind.TOOL_KIND_EXECUTE,
            ToolKind.NETWORK: ProtoToolKind.TOOL_KIND_NETWORK,
        }[self]


class ToolArgumentsError(ValueError):
    """The model sent arguments that do not fit the tool's schema."""

    def __init__(self, tool: str, details: list[str]) -> None:
        self.tool = tool
        self.details = details
        super().__init__(f"invalid arguments for {tool}: {'; '.join(details)}")


@dataclass(frozen=True, slots=True, eq=False)
class Tool(Generic[P, R]):
    """A tool: still callable as the original function, plus what the model needs to call it."""

    func: Callable[P, R | Awaitable[R]]
    name: str
    description: str
    parameters: dict[str, Any]
    """The JSON schema of the arguments object."""
    arguments_model: type[BaseModel] = field(repr=False)
    kind: ToolKind = ToolKind.OTHER
    timeout: float = DEFAULT_TOOL_TIMEOUT
    requires_approval: bool = False
    idempotent: bool = False
    """Running it twice with the same arguments does no more than running it once. A durable
    run whose worker died inside such a call runs it again; any other tool is reported to the
    model as interrupted instead (it may or may not have run), never silently re-run."""
    roles: tuple[str, ...] = ()
    """Roles the caller (the run's principal) must all hold for a call to run; none: anyone may."""

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R | Awaitable[R]:
        """Call the underlying function directly."""
        return self.func(*args, **kwargs)

    def validate(self, arguments: dict[str, Any]) -> dict[str, Any]:
        """Coerce and check `arguments` against the schema; `ToolArgumentsError` otherwise."""
        try:
            parsed = self.arguments_model.model_validate(arguments)
        except pydantic.ValidationError as exc:
            details = [f"{'.'.join(str(p) for p in e['loc']) or '(root)'}: {e['msg']}" for e in exc.errors()]
            raise ToolArgumentsError(self.name, details) from None
        return {name: getattr(parsed, name) for name in type(parsed).model_fields}

    async def invoke(self, arguments: dict[str, Any]) -> str:
        """Validate, call (a sync function runs in a thread) and render the result as text.

        The tool's own `ToolError`, `ModelRetry` and `ApprovalRequired` propagate to the host,
        which turns them into the call's outcome.
        """
        arguments = dict(arguments)
        approved = arguments.pop(APPROVED_ARGUMENT, False) is True
        values = self.validate(arguments)
        func = cast(Callable[..., Any], self.func)
        token = _approved.set(approved)
        try:
            if inspect.iscoroutinefunction(func):
                result = await func(**values)
            else:
                # `to_thread` copies the context, so `tool_call_approved()` works in sync tools too.
                result = await asyncio.to_thread(func, **values)
        finally:
            _approved.reset(token)
        return render_result(result)

    def descriptor(self, *, provider: str = "sandbox") -> ToolDescriptor:
        """The protobuf descriptor published to `ATMO_TOOLS`."""
        return ToolDescriptor(
            name=self.name,
            description=self.description,
            parameters_json_schema=pydantic_core.to_json(self.parameters).decode(),
            kind=self.kind.to_proto(),  # type: ignore[arg-type]
            timeout_seconds=self.timeout,
            provider=provider,
            idempotent=self.idempotent,
        )


def render_result(result: Any) -> str:
    """What the model sees: strings as they are, `None` as "null", anything else as JSON."""
    if isinstance(result, str):
        return result
    if result is None:
        return "null"
    return pydantic_core.to_json(result, fallback=str).decode()


def _strip_titles(schema: Any) -> Any:
    # pydantic adds a "title" to everything; the model needs names and descriptions only.
    if isinstance(schema, dict):
        return {k: _strip_titles(v) for k, v in schema.items() if k != "title" or not isinstance(v, str)}
    if isinstance(schema, list):
        return [_strip_titles(v) for v in schema]
    return schema


def _field(param: inspect.Parameter, hint: Any, doc: str | None) -> Any:
    """The parameter's `Field`: its default, and the docstring's description unless `hint` has one.

    Pydantic lets this `Field` override the one inside `Annotated[...]`: setting the docstring's
    description (or `None`) here would erase `Annotated[int, Field(description=...)]`'s, the
    more specific of the two. Metadata other than `Field`s (a plain string) describes nothing.
    """
    default = ... if param.default is param.empty else param.default
    if doc is None or _declared_description(hint) is not None:
        return Field(default)
    return Field(default, description=doc)


def _declared_description(hint: Any) -> str | None:
    """The description an `Annotated[..., Field(description=...)]` hint declares, if any."""
    if get_origin(hint) is not Annotated:
        return None
    declared = [meta.description for meta in hint.__metadata__ if isinstance(meta, FieldInfo) and meta.description]
    # Of several `Field`s the last wins, as it does when pydantic merges them.
    return declared[-1] if declared else None


def _build(
    func: Callable[..., Any],
    *,
    name: str | None,
    description: str | None,
    kind: ToolKind,
    timeout: float | None,
    requires_approval: bool,
    idempotent: bool = False,
    roles: Sequence[str] = (),
) -> Tool[Any, Any]:
    tool_name = name or func.__name__
    if not _NAME.fullmatch(tool_name):
        msg = f"tool name {tool_name!r} must be 1-64 letters, digits, '_' or '-'"
        raise UserError(msg)
    summary, arg_docs = parse_docstring(func.__doc__)
    try:
        # With the extras: `Annotated[int, Field(ge=1, description=...)]` keeps its constraints.
        hints = get_type_hints(func, include_extras=True)
    except Exception as exc:
        msg = f"@tool {func.__qualname__}: cannot resolve its annotations: {exc}"
        raise UserError(msg) from exc
    fields: dict[str, Any] = {}
    for param in inspect.signature(func).parameters.values():
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            msg = f"@tool {func.__qualname__}: *args and **kwargs cannot be described to a model"
            raise UserError(msg)
        if param.name not in hints:
            msg = f"@tool {func.__qualname__}: parameter {param.name!r} needs a type annotation"
            raise UserError(msg)
        fields[param.name] = (hints[param.name], _field(param, hints[param.name], arg_docs.get(param.name)))
    try:
        model = create_model(f"{tool_name}_arguments", __config__=ConfigDict(extra="forbid"), **fields)
        parameters = _strip_titles(model.model_json_schema())
    except (pydantic.PydanticSchemaGenerationError, pydantic.PydanticUserError, TypeError) as exc:
        msg = f"@tool {func.__qualname__}: its parameters cannot be described as JSON schema: {exc}"
        raise UserError(msg) from exc
    if timeout is not None and timeout <= 0:
        msg = f"@tool {func.__qualname__}: timeout must be positive"
        raise UserError(msg)
    required_roles = _checked_roles(roles, func)
    text = description if description is not None else summary
    if not text:
        msg = f"@tool {func.__qualname__} needs a description (a docstring or description=...)"
        raise UserError(msg)
    return Tool(
        func=func,
        name=tool_name,
        description=text,
        parameters=parameters,
        arguments_model=model,
        kind=kind,
        timeout=timeout if timeout is not None else DEFAULT_TOOL_TIMEOUT,
        requires_approval=requires_approval,
        idempotent=idempotent,
        roles=required_roles,
    )


def _checked_roles(roles: Sequence[str], func: Callable[..., Any]) -> tuple[str, ...]:
    """`roles` as a tuple of non-blank names (duplicates dropped); `UserError` for anything else."""
    # A bare string is a sequence too: `roles="admin"` would demand the roles "a", "d", "m", ...
    names = tuple(roles) if isinstance(roles, list | tuple | set | frozenset) else None
    if names is None or not all(isinstance(role, str) and role.strip() for role in names):
        msg = f'@tool {func.__qualname__}: roles must be a list of role names, e.g. roles=("admin",); got {roles!r}'
        raise UserError(msg)
    return tuple(dict.fromkeys(role.strip() for role in names))


@overload
def tool(func: Callable[P, R], /) -> Tool[P, R]: ...


@overload
def tool(
    *,
    name: str | None = None,
    description: str | None = None,
    kind: ToolKind = ToolKind.OTHER,
    timeout: float | None = None,
    requires_approval: bool = False,
    idempotent: bool = False,
    roles: Sequence[str] = (),
) -> Callable[[Callable[P, R]], Tool[P, R]]: ...


def tool(
    func: Callable[P, R] | None = None,
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    kind: ToolKind = ToolKind.OTHER,
    timeout: float | None = None,
    requires_approval: bool = False,
    idempotent: bool = False,
    roles: Sequence[str] = (),
) -> Tool[P, R] | Callable[[Callable[P, R]], Tool[P, R]]:
    """Declare a tool, bare (`@tool`) or with options (`@tool(timeout=5)`).

    The arguments' JSON schema comes from the signature (every parameter needs a type
    annotation) and the docstring: its description is the tool's, and its parameter section
    (Google `Args:`, NumPy `Parameters`, reST `:param x:` or Epydoc `@param x:`) describes each
    parameter. `Annotated[int, Field(ge=1, description=...)]` keeps its constraints, and its
    description wins over the docstring's.
    Misuse raises `UserError` at import time. `idempotent=True` declares that a second call with
    the same arguments changes nothing more (see `Tool.idempotent`). `roles=("admin",)` lets only
    a caller holding every listed role run it (checked by dispatch before the call starts).
    """

    def decorate(target: Callable[P, R]) -> Tool[P, R]:
        return cast(
            Tool[P, R],
            _build(
                target,
                name=name,
                description=description,
                kind=kind,
                timeout=timeout,
                requires_approval=requires_approval,
                idempotent=idempotent,
                roles=roles,
            ),
        )

    if func is not None:
        return decorate(func)
    return decorate
