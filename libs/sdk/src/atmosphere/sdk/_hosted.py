"""`hosted_agent`: serve your own framework object (a LangGraph graph, a PydanticAI `Agent`...) as an agent.

The object keeps its own prompt, tools and loop; the platform gives it everything else: every
front door, conversation memory, governance and approval on each of its tool calls (the runtime
wraps its tools so each passes dispatch's one choke point), the tape, budgets and cancellation.
The runtime that runs it is found by asking each installed runtime whether it `hosts` the object.
"""

from __future__ import annotations

from collections.abc import Sequence
from importlib.metadata import entry_points
from typing import Any

from atmosphere.sdk._agent import AGENT_PATH_PREFIX, check_name
from atmosphere.sdk._harness import Harness
from atmosphere.sdk._permission import PermissionMode
from atmosphere.sdk._policies import AiBudget
from atmosphere.sdk._spec import NATIVE_PATH, AgentOptions, NativeReference, record_spec
from atmosphere.sdk.errors import UserError
from atmosphere.sdk.runtime import ENTRY_POINT_GROUP


def hosted_agent(
    name: str,
    native: object,
    *,
    runtime: str | None = None,
    description: str = "",
    harness: Sequence[Harness] = (Harness.MEMORY,),
    budget: AiBudget | None = None,
    max_history_messages: int = 20,
    permission_mode: PermissionMode | str = PermissionMode.DEFAULT,
) -> type[Any]:
    """Serve `native` at `/atmosphere/agent/<name>`, run by the runtime that hosts it.

    `runtime` names that runtime (e.g. `"langgraph"`); by default it is the one installed runtime
    whose `hosts(native)` is true. `native` may also be the object's import path
    (`"mycrew.crew:crew"`, with `runtime=`): then only that runtime's dispatch pool imports it, so
    the framework need not be installed where the rest of the app runs (a pool's own image).
    Conversation memory is on (`harness`): the object is given the conversation's earlier turns
    with each message. Register the result in the `App` like any `@agent` class.
    """
    agent_name = check_name(name, "agent")
    if isinstance(native, str):
        hosted: object = _reference(native, runtime, agent_name)
        kind = native
    else:
        hosted, kind = native, type(native).__name__
    chosen = runtime or hosting_runtime(native)
    cls = type(f"Hosted{agent_name.title().replace('-', '').replace('_', '')}", (), {"__module__": __name__})
    options = AgentOptions(
        description=description or f"{kind} hosted as {agent_name}",
        harness=harness,
        budget=budget,
        max_history_messages=max_history_messages,
        permission_mode=permission_mode,
        runtime=chosen,
        native=hosted,
    )
    return record_spec(cls, name=agent_name, kind="agent", path=AGENT_PATH_PREFIX + agent_name, options=options)


def _reference(path: str, runtime: str | None, agent_name: str) -> NativeReference:
    """`path` as a reference its pool imports; `UserError` when it is not one, or names no runtime."""
    if not NATIVE_PATH.fullmatch(path):
        msg = f"hosted agent {agent_name!r}: {path!r} is not an import path like 'package.module:attribute'"
        raise UserError(msg)
    if not runtime:
        msg = f"hosted agent {agent_name!r}: an object given by its import path needs runtime= (the one hosting it)"
        raise UserError(msg)
    return NativeReference(path)


def hosting_runtime(native: object) -> str:
    """The name of the one installed runtime that hosts `native`; `UserError` when none or several do."""
    names = sorted({entry.name for entry in entry_points(group=ENTRY_POINT_GROUP) if _hosts(entry.load(), native)})
    kind = type(native).__qualname__
    if not names:
        msg = (
            f"no installed runtime hosts a {kind}: install its adapter "
            "(e.g. atmosphere-ai-runtime-langgraph for a compiled graph) or pass runtime="
        )
        raise UserError(msg)
    if len(names) > 1:
        msg = f"several runtimes host a {kind} ({', '.join(names)}): pass runtime= to choose one"
        raise UserError(msg)
    return names[0]


def _hosts(runtime_class: Any, native: object) -> bool:
    hosts = getattr(runtime_class, "hosts", None)
    return bool(callable(hosts) and hosts(native))
