"""A hosted object named by its import path: imported by the pool that serves it, checked there.

`hosted_agent("name", "package.module:attribute", runtime=...)` lets an app name a framework object
that is only installed in its pool's image; the pool imports it when it binds the agent, and an
object its runtime does not host stops that pool with the app's mistake said plainly.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from atmosphere.dispatch.app import load_hosted_objects
from atmosphere.dispatch.handlers import hosted_tools
from atmosphere.sdk import App, StreamingSession, UserError, hosted_agent
from atmosphere.sdk.host import AiCapability, spec_of
from atmosphere.sdk.runtime import AgentExecutionContext, AgentRuntime, RuntimeConfig, ToolSpec
from atmosphere.service import AppLoadError


@dataclass
class Crew:
    """Stands for a framework object (a crew) with one tool of its own."""

    tool: str = "count"


CREW = Crew()
NOT_A_CREW = object()


class CrewRuntime(AgentRuntime):
    name = "crews"

    def is_available(self) -> bool:
        return True

    def capabilities(self) -> frozenset[AiCapability]:
        return frozenset()

    async def execute(self, ctx: AgentExecutionContext, session: StreamingSession) -> None:
        raise NotImplementedError

    @classmethod
    def hosts(cls, native: object) -> bool:
        return isinstance(native, Crew)

    def native_tools(self, native: object) -> tuple[ToolSpec, ...]:
        assert isinstance(native, Crew)
        return (ToolSpec(name=native.tool, description="Count.", parameters={"type": "object"}),)


def test_the_serving_pool_imports_the_object_and_lists_its_tools() -> None:
    spec = spec_of(hosted_agent("crew", f"{__name__}:CREW", runtime="crews"))
    assert [t.name for t in hosted_tools(spec, CrewRuntime(RuntimeConfig()))] == ["count"]
    assert spec.hosted_object() is CREW
    # A pool without the runtime (another pool's process) asks nothing, so imports nothing.
    assert hosted_tools(spec, None) == ()


def test_an_object_its_runtime_does_not_host_stops_the_pool_with_the_reason() -> None:
    spec = spec_of(hosted_agent("crew", f"{__name__}:NOT_A_CREW", runtime="crews"))
    with pytest.raises(UserError, match="hosted agent 'crew': the crews runtime does not host a object"):
        hosted_tools(spec, CrewRuntime(RuntimeConfig()))


def test_a_pool_whose_hosted_object_cannot_load_stops_as_an_unloadable_app() -> None:
    # `Dispatch.resolve` loads them before serving: the app's mistake, not a restart loop.
    runtime = CrewRuntime(RuntimeConfig())
    missing = App(agents=[hosted_agent("crew", "no_such_module_anywhere:crew", runtime="crews")])
    with pytest.raises(AppLoadError, match="cannot import the hosted object 'no_such_module_anywhere:crew'"):
        load_hosted_objects(missing, runtime)
    wrong = App(agents=[hosted_agent("crew", f"{__name__}:NOT_A_CREW", runtime="crews")])
    with pytest.raises(AppLoadError, match="the crews runtime does not host a object"):
        load_hosted_objects(wrong, runtime)
    # A pool that runs another runtime's agents (none of these) imports nothing.
    load_hosted_objects(missing.served_by("other"), runtime)
