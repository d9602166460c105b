"""Runtime pools: each dispatch serves the agents pinned to its runtime, from its own queue.

The real `serve()` of two dispatch instances on one in-memory bus, the default pool and the
`built-in` pool (an agent may pin the built-in runtime too: a real second pool with no framework
installed), their model behind `httpx.MockTransport`.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import sys
import types
from collections.abc import AsyncIterator

import httpx
import pytest

from atmosphere.bus import subjects
from atmosphere.bus.errors import RuntimeUnavailableError, ServiceError
from atmosphere.bus.runs import follow_run, new_run
from atmosphere.bus.testing import FakeBus
from atmosphere.contracts.common.v1.common_pb2 import Principal
from atmosphere.contracts.dispatch.v1.dispatch_pb2 import AgentDescriptor
from atmosphere.contracts.run.v1.run_pb2 import RunEvent, RunSubmission
from atmosphere.dispatch.app import Dispatch, provisioned_queues, run_queues, serve
from atmosphere.dispatch.settings import DispatchOptions, DispatchSettings, LlmSettings
from atmosphere.sdk import App, agent
from atmosphere.testing import running_service

from .test_wiring import admit_everything, completions

APP_MODULE = "atmosphere_dispatch_pools_app"
RUN_DEADLINE = 10.0
"""A safety net against a hang, never an assertion: a run here ends in milliseconds."""


@agent(name="plain", harness=[])
class Plain:
    """Pinned to no runtime: the default pool's."""


@agent(name="pinned", harness=[], runtime="built-in")
class Pinned:
    """Pinned to the built-in runtime: the `built-in` pool's."""


@agent(name="elsewhere", harness=[], runtime="no-such-runtime")
class Elsewhere:
    """Pinned to a runtime nobody installed."""


@pytest.fixture(autouse=True)
def pools_app(monkeypatch: pytest.MonkeyPatch) -> None:
    module = types.ModuleType(APP_MODULE)
    module.app = App(agents=[Plain, Pinned, Elsewhere])  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, APP_MODULE, module)


def settings(pool: str = "", runtime: str = "built-in", base_url: str = "http://model.test/v1") -> DispatchSettings:
    return DispatchSettings(
        app=f"{APP_MODULE}:app",
        probe_host="127.0.0.1",
        probe_port=0,
        dispatch=DispatchOptions(
            grpc_host="127.0.0.1", grpc_port=0, pool=pool, runtime=runtime, pools=("built-in", "no-such-runtime")
        ),
        llm=LlmSettings(base_url=base_url, model="wired-model"),
    )


@contextlib.asynccontextmanager
async def dispatch_pool(bus: FakeBus, pool: str) -> AsyncIterator[None]:
    run_dispatch = functools.partial(serve, bus=bus, transport=httpx.MockTransport(completions))
    async with running_service("dispatch", run_dispatch, settings(pool), bus=bus):
        yield


async def descriptor(bus: FakeBus, name: str) -> AgentDescriptor:
    found = await bus.kv_get(subjects.AGENTS_BUCKET, name, AgentDescriptor)
    assert found is not None, name
    return found


def run_for(agent_descriptor: AgentDescriptor) -> RunSubmission:
    """A run as ingress makes it: queued in the pool its agent's descriptor names."""
    return new_run(
        agent=agent_descriptor.name,
        message="Hi",
        principal=Principal(user_id="u1"),
        conversation_id="c1",
        transport="test",
        pool=agent_descriptor.pool,
    )


async def run_to_the_end(bus: FakeBus, request: RunSubmission) -> list[RunEvent]:
    async with asyncio.timeout(RUN_DEADLINE):
        return [event async for event in follow_run(bus, request.run_id, submit=request)]


def test_each_pool_resolves_its_own_agents_and_runtime() -> None:
    default = Dispatch.resolve(settings())
    pool = Dispatch.resolve(settings("built-in"))
    missing = Dispatch.resolve(settings("no-such-runtime"))
    assert list(default.app.agents) == ["plain"]
    assert list(pool.app.agents) == ["pinned"]
    assert list(missing.app.agents) == ["elsewhere"]
    # Every pool knows where every agent is served: a coordinator's fleet may be elsewhere.
    assert default.agent_pools == {"plain": "", "pinned": "built-in", "elsewhere": "no-such-runtime"}
    assert (default.info()["pool"], pool.info()["pool"]) == ("default", "built-in")
    assert pool.info()["runtime"]["state"] == "ACTIVE"
    assert pool.info()["runtime"]["name"] == "built-in"
    why = "runtime no-such-runtime is not installed (pip install atmosphere-ai-runtime-no-such-runtime)"
    assert missing.info()["runtime"]["state"] == f"INACTIVE({why})"
    assert missing.info()["runtime"]["name"] is None


def test_the_info_reports_every_installed_runtimes_real_state() -> None:
    runtimes = Dispatch.resolve(settings()).info()["runtimes"]
    assert runtimes["built-in"] == "ACTIVE"
    unconfigured = Dispatch.resolve(settings(base_url="")).info()["runtimes"]
    assert unconfigured["built-in"] == "INACTIVE(no model configured: set LLM_BASE_URL)"


def test_a_pool_binds_only_its_own_queues_and_the_provisioner_makes_every_pools() -> None:
    options = DispatchOptions(pool="built-in", pools=("langchain",))
    assert [q.durable for q in run_queues(options)] == [
        "dispatch-pool-built-in",
        "dispatch-pool-built-in-nested-1",
        "dispatch-pool-built-in-nested-2",
        "dispatch-pool-built-in-nested-3",
    ]
    made = {q.durable for q in provisioned_queues(options)}
    assert {"dispatch", "dispatch-pool-langchain", "dispatch-pool-built-in-nested-3"} <= made
    assert len(made) == 12


async def test_each_agent_is_answered_by_its_own_pool() -> None:
    bus = FakeBus()
    async with bus.serve(admit_everything()), dispatch_pool(bus, ""), dispatch_pool(bus, "built-in"):
        plain, pinned = await descriptor(bus, "plain"), await descriptor(bus, "pinned")
        assert (plain.pool, plain.runtime, pinned.pool, pinned.runtime) == ("", "built-in", "built-in", "built-in")
        for agent_descriptor in (plain, pinned):
            events = await run_to_the_end(bus, run_for(agent_descriptor))
            assert events[-1].WhichOneof("kind") == "complete", agent_descriptor.name
    queued = [subject for subject, message in bus.published if isinstance(message, RunSubmission)]
    assert queued == [subjects.run_submit("plain"), subjects.run_submit("pinned", pool="built-in")]


async def test_a_pool_that_is_not_running_leaves_its_runs_queued_for_it() -> None:
    bus = FakeBus()
    async with bus.serve(admit_everything()), dispatch_pool(bus, ""):
        # The `built-in` pool ran once (its queue exists, its agent was described), then stopped.
        async with dispatch_pool(bus, "built-in"):
            pinned = await descriptor(bus, "pinned")
        request = run_for(pinned)
        following = asyncio.create_task(run_to_the_end(bus, request))
        # The default pool answers its own agents meanwhile, and never takes the other pool's run.
        events = await run_to_the_end(bus, run_for(await descriptor(bus, "plain")))
        assert events[-1].WhichOneof("kind") == "complete"
        assert not following.done()
        waiting = [s for s, _ in bus.stream_messages(subjects.RUNS_STREAM)]
        assert subjects.run_submit("pinned", pool="built-in") in waiting
        # When the pool is back, it runs the run that waited for it.
        async with dispatch_pool(bus, "built-in"):
            events = await following
    assert events[-1].WhichOneof("kind") == "complete"


async def test_a_pool_whose_runtime_is_missing_ends_its_runs_with_the_reason() -> None:
    bus = FakeBus()
    async with bus.serve(admit_everything()), dispatch_pool(bus, "no-such-runtime"):
        elsewhere = await descriptor(bus, "elsewhere")
        events = await run_to_the_end(bus, run_for(elsewhere))
    error = ServiceError.from_proto(events[-1].error)
    assert isinstance(error, RuntimeUnavailableError)
    assert error.message == (
        "The no-such-runtime runtime pool cannot run agents: runtime no-such-runtime is not installed "
        "(pip install atmosphere-ai-runtime-no-such-runtime)"
    )
