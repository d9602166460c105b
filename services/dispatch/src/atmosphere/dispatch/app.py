"""Dispatch's wiring: load the app, resolve a runtime, pull runs, serve gRPC."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import socket
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

from atmosphere.bus import Bus, BusError, Consumer, ConsumerSpec, MessageContext, Router, run_queue, subjects
from atmosphere.bus.run_queue import RunQueueLimits
from atmosphere.bus.runs import MAX_NESTING
from atmosphere.contracts.dispatch.v1.dispatch_pb2 import AgentDescriptor
from atmosphere.contracts.memory.v1.memory_pb2 import ConversationClosed
from atmosphere.contracts.run.v1.run_pb2 import RunSubmission
from atmosphere.dispatch import metrics
from atmosphere.dispatch.conversation import ConversationMemory, FactExtractor
from atmosphere.dispatch.descriptors import live_descriptors, permissions_info
from atmosphere.dispatch.grpc_api import DispatchServicer, serve_grpc
from atmosphere.dispatch.handlers import RunExecutor, agent_descriptors, hosted_tools
from atmosphere.dispatch.harness import AgentHarness, HarnessConfig, resolve_app, runtime_state
from atmosphere.dispatch.memory_client import MemoryClient
from atmosphere.dispatch.model_side import NO_RUNTIME, ModelSide
from atmosphere.dispatch.remote_delegation import RemoteLimits, RemoteMember, RemoteOverride, remote_fleets, remote_info
from atmosphere.dispatch.run_scope import ExecutorOptions
from atmosphere.dispatch.runtime.openai import BuiltInAgentRuntime, is_http_url
from atmosphere.dispatch.runtime_config import runtime_config
from atmosphere.dispatch.settings import DispatchOptions, DispatchSettings
from atmosphere.sdk import App
from atmosphere.sdk.errors import UserError
from atmosphere.sdk.host import HarnessSwitch
from atmosphere.sdk.runtime import AgentRuntime, discover_runtimes, resolve_runtime
from atmosphere.service import (
    AppLoadError,
    Authenticator,
    ServiceRuntime,
    StreamSlots,
    load_service_app,
    open_service,
)

NO_MODEL = "no model configured: set LLM_BASE_URL"
"""Why no runtime is active when the built-in one lacks a provider URL."""

AUTO_RUNTIME = "auto"
"""`ATMOSPHERE_DISPATCH__RUNTIME=auto`: the default pool runs the highest-priority available runtime."""

WORKERS = run_queue.WORKERS
"""The durable consumer every dispatch instance pulls top-level runs from (sub-runs: `-nested-<n>`)."""


def run_queue_consumers(
    run_ack_wait: float,
    *,
    max_deliveries: int = 5,
    heartbeat: float = 0,
    max_concurrent_runs: int = 16,
    pools: Sequence[str] = (),
) -> list[ConsumerSpec]:
    """The run queue's worker consumers (`atmosphere.bus.run_queue`) of the default pool and `pools`.

    The provisioner makes them with the same settings; dispatch only binds to them, and refuses
    to start when they were made with others (an ack wait the heartbeat does not expect).
    """
    limits = RunQueueLimits.for_workers(
        ack_wait_seconds=run_ack_wait, max_run_deliveries=max_deliveries, max_concurrent_runs=max_concurrent_runs
    )
    consumers = run_queue.consumers(limits, pools=pools)
    return [dataclasses.replace(spec, heartbeat_seconds=heartbeat) for spec in consumers]


def provisioned_queues(options: DispatchOptions) -> list[ConsumerSpec]:
    """Every pool's run queue consumers as dispatch's settings ask for them: what the provisioner makes."""
    return run_queue_consumers(
        options.run_ack_wait,
        max_deliveries=options.max_run_deliveries,
        heartbeat=options.run_heartbeat,
        max_concurrent_runs=options.max_concurrent_runs,
        pools=options.all_pools(),
    )


def run_queues(options: DispatchOptions) -> list[ConsumerSpec]:
    """The consumers this instance binds to: its own pool's, one per nesting level."""
    own = {run_queue.durable_name(level, options.pool) for level in range(MAX_NESTING + 1)}
    return [spec for spec in provisioned_queues(options) if spec.durable in own]


QUEUE_DEPTH_EVERY = 5.0
"""Seconds between two readings of the run queues' depth (one JetStream API call per level)."""


async def sample_queue_depth(
    bus: Bus, queues: Sequence[ConsumerSpec], *, pool: str, every: float = QUEUE_DEPTH_EVERY
) -> None:
    """Keep `atmosphere_run_queue_depth` current for this pool's queues until cancelled."""
    levels = {run_queue.durable_name(level, pool): str(level) for level in range(MAX_NESTING + 1)}
    while True:
        for spec in queues:
            try:
                state = await bus.consumer_state(spec.stream, spec.durable)
            except BusError:
                continue  # the broker is away: the last reading stands until it is back
            metrics.RUN_QUEUE_DEPTH.labels(pool or "default", levels.get(spec.durable, "")).set(state.pending)
        await asyncio.sleep(every)


def choose_runtime(runtimes: Sequence[AgentRuntime], name: str) -> AgentRuntime | None:
    """The runtime called `name` if it is available; without a name, the highest-priority available one."""
    if not name:
        return resolve_runtime(runtimes)
    return next((r for r in runtimes if r.name == name and r.is_available()), None)


def harness_config(settings: DispatchSettings) -> HarnessConfig:
    """The app-wide harness settings (each already parsed by `DispatchSettings`)."""
    return HarnessConfig(
        switch=HarnessSwitch(enabled=settings.ai_harness_enabled, exclude_paths=settings.ai_harness_exclude_paths),
        compaction=settings.ai_harness_compaction,
        recent_window=settings.ai_compaction_recent_window,
        prompt_cache_default=settings.ai_harness_prompt_cache_default,
        planning=settings.llm.planning,
        filesystem=settings.llm.filesystem,
        offload_threshold=settings.llm.tool_output_offload_threshold,
    )


def discover(settings: DispatchSettings, *, transport: httpx.AsyncBaseTransport | None = None) -> list[AgentRuntime]:
    """Every installed runtime, configured from `LLM_*`; the built-in one over `transport` when given."""
    # Every run slot of every nesting level may be in a model call at once.
    slots = settings.dispatch.max_concurrent_runs * (MAX_NESTING + 1)
    config = runtime_config(settings.llm, max_concurrency=slots)
    runtimes = discover_runtimes(config)
    if transport is None:
        return runtimes
    # Entry points build a runtime from its config alone: the built-in one is rebuilt over the
    # transport (it opens nothing before its first call, so the discarded one needs no closing).
    return [
        BuiltInAgentRuntime(config, transport=transport) if type(runtime) is BuiltInAgentRuntime else runtime
        for runtime in runtimes
    ]


def _closed_conversations(extractor: FactExtractor, running: set[asyncio.Task[int]]) -> Router:
    router = Router()

    async def on_closed(closed: ConversationClosed, _: MessageContext) -> None:
        # Extraction calls the model: it runs beside the subscription, which stays free.
        task = asyncio.create_task(extractor.on_closed(closed))
        running.add(task)
        task.add_done_callback(running.discard)

    router.add(subjects.conversation_closed(), ConversationClosed, on_closed)
    return router


@dataclass
class Dispatch:
    """What one dispatch instance serves, resolved before it connects: the app, its runtime and harnesses.

    `descriptors` and `grpc_port` are filled in as the service starts; `info()` reads them live.
    """

    settings: DispatchSettings
    app: App
    runtimes: list[AgentRuntime]
    runtime: AgentRuntime | None
    """The runtime runs take (`resolve_runtime`), None when none is available."""
    config: HarnessConfig
    harnesses: dict[str, AgentHarness]
    runtime_block: dict[str, Any]
    agent_pools: dict[str, str] = field(default_factory=dict)
    """The pool of every agent of the app (`app` holds only this pool's): where sub-runs go."""
    remote_fleets: dict[str, dict[str, RemoteMember]] = field(default_factory=dict)
    """This pool's coordinators' remote A2A members, as the deployment reaches them."""
    descriptors: list[AgentDescriptor] = field(default_factory=list)
    grpc_port: int = 0
    extractions: set[asyncio.Task[int]] = field(default_factory=set)
    """Fact extractions in flight (kept referenced until they finish)."""

    @classmethod
    def resolve(cls, settings: DispatchSettings, *, transport: httpx.AsyncBaseTransport | None = None) -> Dispatch:
        """Load the app first (an unloadable one never gets as far as a probe), then pick the runtime.

        A pool (`ATMOSPHERE_DISPATCH__POOL`) serves only the agents pinned to its runtime, with
        that runtime; the default pool the others, with `ATMOSPHERE_DISPATCH__RUNTIME` or the
        highest-priority available runtime.
        """
        whole = load_service_app(settings.app, settings.app_dir)
        pool = settings.dispatch.pool
        app = whole.served_by(pool)
        runtimes = discover(settings, transport=transport)
        default_runtime = settings.dispatch.runtime
        wanted = pool or ("" if default_runtime == AUTO_RUNTIME else default_runtime)
        runtime = choose_runtime(runtimes, wanted)
        load_hosted_objects(app, runtime)
        config = harness_config(settings)
        harnesses = resolve_app(
            app,
            config,
            runtime_name=runtime.name if runtime is not None else "",
            runtime_capabilities=runtime.capabilities() if runtime is not None else frozenset(),
        )
        block = runtime_info(runtime, runtimes, base_url=settings.llm.base_url, wanted=wanted)
        pools = {name: spec.pool for name, spec in whole.agents.items()}
        overrides = {
            name: RemoteOverride(url=remote.url, token=remote.token.get_secret_value())
            for name, remote in settings.delegation.remotes.items()
        }
        remotes = remote_fleets(app, overrides)
        return cls(settings, app, runtimes, runtime, config, harnesses, block, agent_pools=pools, remote_fleets=remotes)

    def unavailable(self) -> str:
        """What runs are told when this instance has no runtime: the pool's own reason, else how to set one up."""
        pool = self.settings.dispatch.pool
        if not pool:
            return NO_RUNTIME
        reason = str(self.runtime_block["state"]).removeprefix("INACTIVE(").removesuffix(")")
        return f"The {pool} runtime pool cannot run agents: {reason}"

    def info(self) -> dict[str, Any]:
        """Dispatch's part of the service info (`atmo.svc.dispatch.info`)."""
        options = self.settings.dispatch
        return {
            "agents": [d.name for d in self.descriptors],
            "app": self.settings.app,
            "runtime": self.runtime_block,
            "runtimes": runtime_states(self.runtimes, base_url=self.settings.llm.base_url),
            "pool": self.settings.dispatch.pool or "default",
            "grpc": f"{options.grpc_host}:{self.grpc_port}" if self.grpc_port else None,
            "harness": runtime_state(self.config, self.harnesses, durable=self.settings.durable_runs),
            # Only when some agent genuinely has a browsable plan or file workspace.
            **({"hasWorkspace": True} if any(h.attached() and h.tools for h in self.harnesses.values()) else {}),
            **permissions_info(self.app, self.settings.tools.policy),
            # Only when a coordinator declares remote members: can this process reach each one?
            **({"remoteAgents": remote_info(self.remote_fleets)} if self.remote_fleets else {}),
        }

    def executor(self, bus: Bus, model_side: ModelSide) -> RunExecutor:
        """The run executor every queue hands its runs to."""
        options = self.settings.dispatch
        return RunExecutor(
            self.app,
            bus,
            model_side,
            ExecutorOptions(
                governance_timeout=options.governance_timeout,
                approval_timeout=options.approval_timeout,
                offload_threshold=self.config.offload_threshold,
                max_deliveries=options.max_run_deliveries,
                durable=self.settings.durable_runs,
                owner=f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}",
                max_effects=self.settings.durable_runs_max_effects_per_run,
                retain_on_success=self.settings.durable_runs_retain_on_success,
                ack_wait=self.settings.dispatch.run_ack_wait,
                tool_permissions=self.settings.tools.policy,
                agent_pools=self.agent_pools,
                remote_fleets=self.remote_fleets,
                remote_limits=RemoteLimits(
                    timeout=self.settings.delegation.remote_timeout,
                    connect_timeout=self.settings.delegation.remote_connect_timeout,
                    max_bytes=self.settings.delegation.remote_max_bytes,
                ),
                listeners=self.app.listeners,
                text_delta_window=options.text_delta_window_ms / 1000,
                text_delta_max_chars=options.text_delta_max_chars,
            ),
            harnesses=self.harnesses,
        )

    async def serve_runs(self, stack: contextlib.AsyncExitStack, bus: Bus) -> list[Consumer]:
        """List the agents, then pull runs from every nesting level's queue; the queues, to stop them."""
        memory = MemoryClient(bus)
        model_call_timeout = self.settings.dispatch.memory_model_timeout
        conversations = ConversationMemory(memory, self.config, self.runtime, model_call_timeout=model_call_timeout)
        model_side = ModelSide(self.runtime, conversations, unavailable=self.unavailable())
        self.descriptors[:] = agent_descriptors(
            self.app,
            model_side,
            self.harnesses,
            pool=self.settings.dispatch.pool,
            runtime_state=str(self.runtime_block["state"]),
        )
        max_age = self.settings.jetstream.agents_max_age
        executor = self.executor(bus, model_side)
        listed = executor.listed_mcp_tools if any(spec.mcp_servers for spec in self.app.agents.values()) else None
        await stack.enter_async_context(live_descriptors(bus, self.descriptors, max_age=max_age, listed=listed))
        extractor = FactExtractor(self.app, self.harnesses, memory, self.runtime, model_call_timeout=model_call_timeout)
        # One instance of each pool hears of each closed conversation; only its agents' pool acts on it.
        closed = _closed_conversations(extractor, self.extractions)
        await stack.enter_async_context(bus.serve(closed, queue=run_queue.durable_name(0, self.settings.dispatch.pool)))
        options = self.settings.dispatch
        queues = run_queues(options)
        sampler = asyncio.create_task(sample_queue_depth(bus, queues, pool=options.pool))
        stack.callback(sampler.cancel)
        return [
            await stack.enter_async_context(
                bus.consume(consumer, RunSubmission, executor.on_work, max_inflight=options.max_concurrent_runs)
            )
            for consumer in queues
        ]

    async def serve_grpc(self, stack: contextlib.AsyncExitStack, service: ServiceRuntime) -> None:
        """The gRPC `DispatchService` (port 0: a free one, shown in the info once bound)."""
        options = self.settings.dispatch
        servicer = DispatchServicer(
            service.bus,
            self.descriptors,
            self.info,
            authenticator=Authenticator(self.settings.ingress.auth_tokens),
            streams=StreamSlots(per_client=options.grpc_max_streams_per_client, total=options.grpc_max_streams),
        )
        self.grpc_port = await stack.enter_async_context(
            serve_grpc(
                servicer,
                host=options.grpc_host,
                port=options.grpc_port,
                max_message_bytes=service.bus.max_payload,
                ready=lambda: service.health.ready,
            )
        )


async def serve(
    settings: DispatchSettings,
    *,
    stop: asyncio.Event,
    bus: Bus | None = None,
    transport: httpx.AsyncBaseTransport | None = None,
) -> None:
    """Run dispatch until `stop` is set.

    `bus` replaces the NATS connection (a test's `FakeBus`; the caller closes it), `transport`
    the network under the built-in runtime (a test's `httpx.MockTransport`).
    """
    dispatch = Dispatch.resolve(settings, transport=transport)
    async with contextlib.AsyncExitStack() as stack:
        # Every discovered runtime, not only the resolved one: any may have opened a pool.
        for discovered in dispatch.runtimes:
            stack.push_async_callback(discovered.aclose)
        # The run queue's consumers are provisioned with the layout, never made by this login.
        service = await stack.enter_async_context(
            open_service(
                "dispatch",
                settings,
                info=dispatch.info,
                stop=stop,
                bus=bus,
                consumers=tuple(run_queues(settings.dispatch)),
            )
        )
        queues = await dispatch.serve_runs(stack, service.bus)
        await dispatch.serve_grpc(stack, service)
        service.health.mark_ready()
        await stop.wait()
        for queue in queues:
            queue.stop()  # all levels at once; the stack's exits then wait for runs in hand only


def runtime_info(
    runtime: AgentRuntime | None, discovered: Sequence[AgentRuntime], *, base_url: str, wanted: str = ""
) -> dict[str, Any]:
    """The `runtime` block of the info: the runtime runs take, or why there is none (`wanted`: the one asked for).

    `state` is `ACTIVE`, or `INACTIVE(<why>)` with no name and no capabilities: a runtime that
    cannot run is never reported as if it could.
    """
    if runtime is None:
        return {
            "state": f"INACTIVE({why_no_runtime(discovered, base_url=base_url, wanted=wanted)})",
            "name": None,
            "model": None,
            "capabilities": [],
        }
    return {
        "state": "ACTIVE",
        "name": runtime.name,
        "model": runtime.config.model or None,
        "capabilities": sorted(c.value for c in runtime.capabilities()),
    }


def load_hosted_objects(app: App, runtime: AgentRuntime | None) -> None:
    """Import the framework objects this pool hosts by path now, before it serves anything.

    One that does not import, or that its runtime does not host, is the app's mistake, like an
    app that does not import: the pool stops with the reason (`AppLoadError`), not a restart loop.
    """
    for spec in app.agents.values():
        try:
            hosted_tools(spec, runtime)
        except UserError as exc:
            raise AppLoadError(str(exc)) from exc


def runtime_states(discovered: Sequence[AgentRuntime], *, base_url: str) -> dict[str, str]:
    """Every installed runtime's state in this process: `ACTIVE`, or `INACTIVE(<why>)` (the `runtimes` block)."""
    return {
        r.name: "ACTIVE" if r.is_available() else f"INACTIVE({why_no_runtime([r], base_url=base_url, wanted=r.name)})"
        for r in sorted(discovered, key=lambda r: r.name)
    }


def why_no_runtime(discovered: Sequence[AgentRuntime], *, base_url: str, wanted: str = "") -> str:
    """Why no discovered runtime (or not the `wanted` one) is available, in words that name the fix."""
    if wanted:
        match = [r for r in discovered if r.name == wanted]
        if not match:
            return f"runtime {wanted} is not installed (pip install atmosphere-ai-runtime-{wanted})"
        return match[0].unavailable_reason() or (NO_MODEL if not base_url else f"runtime {wanted} is not configured")
    if not discovered:
        return "no runtime installed"
    if not base_url:
        return NO_MODEL
    if not is_http_url(base_url):
        # The value itself is not shown: a URL may carry credentials.
        return "LLM_BASE_URL is not an http(s) URL"
    names = ", ".join(sorted(r.name for r in discovered))
    return f"no runtime available among {names}"
