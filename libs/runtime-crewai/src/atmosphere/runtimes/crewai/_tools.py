"""Tools as CrewAI sees them, each call of which goes to `ctx.run_tool` (the choke point) first.

A `GatedTool` stands in for one tool: an Atmosphere agent's `ToolSpec`, or a hosted crew's own
CrewAI tool. CrewAI calls its `run` in a worker thread with the model's arguments; the call
crosses to the run's loop (`Bridge`) and goes to the choke point as it is (the choke point
validates it against the schema the model was shown), with the hosted tool itself as `local`, so
that a refused call never reaches it and the model reads the refusal (`Error: ...`).
"""

from __future__ import annotations

import asyncio
import contextvars
import copy
import json
import uuid
from collections.abc import Callable
from typing import Any, ClassVar

from crewai.tools import BaseTool
from pydantic import BaseModel, ConfigDict, PrivateAttr
from typing_extensions import override

from atmosphere.bus import errors as catalogue
from atmosphere.runtimes.crewai._bridge import Bridge
from atmosphere.sdk import OnMaxIterations, ToolLoopPolicy
from atmosphere.sdk.runtime import LocalTool, ToolCallRequest, ToolRunner, ToolSpec

NO_TOOL_RUNNER = "Error: no tool runner is attached to this run"
"""The built-in runtime's text for a tool call on a run that cannot run tools."""
TOOL_LIMIT_REACHED = "Error: the tool-call limit for this request was reached; answer with what you have"
"""The built-in runtime's text for a call refused by a lenient tool loop's cap."""

CALL_ID: contextvars.ContextVar[str] = contextvars.ContextVar("atmosphere_crewai_call_id", default="")
"""The id of the model's tool call being run (CrewAI hands a tool its arguments only; `GatedExecutor` sets it)."""


class ToolLoopExhaustedError(Exception):
    """A strict tool loop's cap was reached and the model still asked for tools."""

    code = catalogue.ToolLoopExhaustedError.code

    def __init__(self, cap: int) -> None:
        """The built-in runtime's words for a strict cap of `cap` rounds."""
        super().__init__(f"Tool loop exhausted after {cap} iterations")


class Incident:
    """The first platform failure of a run, and how to stop its crew.

    CrewAI turns an exception of a tool into text for the model and retries a failed agent; a
    failure of the platform (what the choke point raised, the provider's error, the tool loop's
    cap) must end the run as raised instead. It is kept here, and the crew stopped.
    """

    def __init__(self) -> None:
        """Nothing went wrong yet."""
        self.error: BaseException | None = None
        self.stop: Callable[[], object] = lambda: None

    def record(self, error: BaseException, *, stop: bool = False) -> None:
        """Keep `error` if it is the first; with `stop`, stop the crew now."""
        if self.error is None:
            self.error = error
        if stop:
            self.stop()


class ToolLoop:
    """Counts the run's tool rounds (model answers that asked for tools) against its `ToolLoopPolicy`.

    The platform's model reports each answer here before CrewAI runs its tools: a strict cap
    fails the run at once; a lenient one refuses that answer's calls and then offers no more
    tools (`offered`), so the next answer is made with what the model has.
    """

    def __init__(self, policy: ToolLoopPolicy) -> None:
        """Count against `policy`."""
        self.policy = policy
        self.rounds = 0
        self._refusing = False
        self._withdrawn = False

    def answered_with_tools(self) -> None:
        """Count one round; one past the cap fails (strict) or is refused (lenient).

        Raises:
            ToolLoopExhaustedError: a strict cap was passed.
        """
        self.rounds += 1
        if self.rounds <= self.policy.cap:
            return
        if self.policy.on_max_iterations is OnMaxIterations.FAIL:
            raise ToolLoopExhaustedError(self.policy.cap)
        self._refusing = True

    @property
    def offered(self) -> bool:
        """Whether the next model call is offered the tools."""
        return not self._withdrawn

    def refuses(self) -> bool:
        """Whether a call of this round is refused; the tools are withdrawn once they are."""
        if self._refusing:
            self._withdrawn = True
        return self._refusing


class Gate:
    """One run's way to the choke point, from any of CrewAI's threads."""

    def __init__(
        self, bridge: Bridge, run_tool: ToolRunner | None, incident: Incident, loop: ToolLoop | None = None
    ) -> None:
        """Route calls over `bridge` to `run_tool`, within `loop` (an Atmosphere agent's) when given."""
        self.bridge = bridge
        self._run_tool = run_tool
        self._incident = incident
        self._loop = loop

    def run(self, name: str, arguments: dict[str, Any], local: LocalTool | None = None) -> str:
        """Hand one call to the choke point and wait for the text the model reads.

        A failure the choke point raises ends the run: it is recorded, the crew stopped, and
        CrewAI, which would show it to the model, is told only that the run ended.
        """
        if self._loop is not None and self._loop.refuses():
            return TOOL_LIMIT_REACHED
        run_tool = self._run_tool
        if run_tool is None:
            return NO_TOOL_RUNNER
        call = ToolCallRequest(
            call_id=CALL_ID.get() or f"call_{uuid.uuid4().hex[:24]}",
            name=name,
            arguments_json=json.dumps(arguments, ensure_ascii=False),
            local=local,
        )

        async def through_the_choke_point() -> str:
            try:
                return await run_tool(call)
            except Exception as exc:
                self._incident.record(exc, stop=True)
                raise

        return self.bridge.call(through_the_choke_point)


class _DeclaredSchema(BaseModel):
    """Arguments of a tool the platform declares: any object, whose schema is the declared one."""

    model_config = ConfigDict(extra="allow")
    declared: ClassVar[dict[str, Any]] = {"type": "object", "properties": {}}

    @classmethod
    @override
    def model_json_schema(cls, *args: Any, **kwargs: Any) -> dict[str, Any]:
        """The schema the app declared (what CrewAI renders for the model and its text prompts)."""
        del args, kwargs
        return copy.deepcopy(cls.declared)


def declared_schema(spec: ToolSpec) -> type[BaseModel]:
    """An arguments model for `spec` whose JSON schema is the declared one."""
    return type(f"{spec.name}_arguments", (_DeclaredSchema,), {"declared": spec.parameters})


class GatedTool(BaseTool):
    """A tool whose every call passes the choke point first (see the module)."""

    _gate: Gate = PrivateAttr()
    _tool_name: str = PrivateAttr()
    _original: BaseTool | None = PrivateAttr(default=None)

    @classmethod
    def of_spec(cls, spec: ToolSpec, gate: Gate) -> GatedTool:
        """An Atmosphere agent's tool: what the app declared, run by the choke point."""
        tool = cls(name=spec.name, description=spec.description or spec.name, args_schema=declared_schema(spec))
        tool._gate, tool._tool_name = gate, spec.name
        return tool

    @classmethod
    def of_native(cls, original: BaseTool, name: str, gate: Gate) -> GatedTool:
        """A hosted crew's own tool (called `name` by the model): gated, then run as CrewAI would."""
        tool = cls(
            name=original.name,
            description=original.description,
            args_schema=original.args_schema,
            result_as_answer=original.result_as_answer,
        )
        tool._gate, tool._tool_name, tool._original = gate, name, original
        return tool

    @override
    def run(self, *args: Any, **kwargs: Any) -> str:
        """The choke point's answer to the call (CrewAI's own validation is the choke point's, then the tool's)."""
        del args
        original = self._original
        local = None if original is None else run_native(original)
        return self._gate.run(self._tool_name, kwargs, local)

    @override
    def _run(self, *args: Any, **kwargs: Any) -> str:
        return self.run(*args, **kwargs)


def run_native(tool: BaseTool) -> LocalTool:
    """The hosted tool itself, for the choke point to run after its gates (in a thread: CrewAI tools block).

    Arguments that do not fit the tool become the `Error: ...` text the model reads, as a failure
    CrewAI reports in-band (a `ToolFailure`) does; any other exception is the tool failing, which
    the choke point reports.
    """

    async def local(arguments_json: str) -> str:
        arguments = json.loads(arguments_json or "{}")
        if not isinstance(arguments, dict):
            return f"Error: the arguments of {tool.name} must be a JSON object"
        try:
            result = await asyncio.to_thread(tool.run, **arguments)
        except ValueError as exc:
            return f"Error: {exc}"
        return str(tool.format_output_for_agent(result))

    return local
