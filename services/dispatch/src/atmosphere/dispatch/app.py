"""Dispatch's wiring: load the app, resolve a runtime, pull runs, serve gRPC."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from typing import Any

from atmosphere.bus import Bus, ConsumerSpec, MessageContext, Router, subjects
from atmosphere.bus.runs import MAX_NESTING
from atmosphere.contracts.dispatch.v1.dispatch_pb2 import AgentDescriptor
from atmosphere.contracts.memory.v1.memory_pb2 import ConversationClosed
from atmosphere.contracts.run.v1.run_pb2 import RunRequest
from atmosphere.dispatch.conversation import ConversationMemory, FactExtractor
from atmosphere.dispatch.descriptors import live_descriptors
from atmosphere.dispatch.generation import runtime_config
from atmosphere.dispatch.grpc_api import DispatchServicer, serve_grpc
from atmosphere.dispatch.handlers import ExecutorOptions, RunExecutor, agent_descriptors
from atmosphere.dispatch.harness import HarnessConfig, SurfaceMode, resolve_app, runtime_state
from atmosphere.dispatch.memory_client import MemoryClient
from atmosphere.dispatch.pipeline import ModelPipeline
from atmosphere.dispatch.runtime.openai import is_http_url
from atmosphere.dispatch.settings import DispatchSettings
from atmosphere.sdk import PromptCache
from atmosphere.sdk.host import HarnessSwitch
from atmosphere.sdk.runtime import AgentRuntime, discover_runtimes, resolve_runtime
from atmosphere.service import Authenticator, load_service_app, open_service

NO_MODEL = "no model configured: set LLM_BASE_URL"
"""Why no runtime is active when the built-in one lacks a provider URL."""

WORKERS = "dispatch"
"""The durable consumer every dispatch instance pulls top-level runs from (sub-runs: `-nested-<n>`)."""


def run_queue_consumers(run_ack_wait: float, *, max_deliveries: int = 5) -> list[ConsumerSpec]:
    """One worker consumer per nesting level of `ATMO_RUNS` (`subjects.run_submit_level`).

    Each level gets its own `max_concurrent_runs` slots, so a coordinator waiting on its
    sub-runs never holds the slot they need: with one shared pool, as many coordinators as
    slots would each wait for a child that no slot is left to run.
    """
    return [
        ConsumerSpec(
            stream=subjects.RUNS_STREAM,
            durable=WORKERS if level == 0 else f"{WORKERS}-nested-{level}",
            filter_subject=subjects.run_submit_level(level),
            ack_wait_seconds=run_ack_wait,
            # A backstop behind the executor's own guard (which ends the run with an error at
            # `max_deliveries`): a run that fails before even that is not delivered forever.
            max_deliver=max_deliveries * 2,
            confirm_ack=True,
            # A run is handed over the moment it is queued, not when a batch pull expires.
            batch_fetch=False,
        )
        for level in range(MAX_NESTING + 1)
    ]


def harness_config(settings: DispatchSettings) -> HarnessConfig:
    """The app-wide harness settings, parsed once."""
    return HarnessConfig(
        switch=HarnessSwitch(
            enabled=HarnessSwitch.parse_enabled(settings.ai_harness_enabled),
            exclude_paths=HarnessSwitch.parse_paths(settings.ai_harness_exclude_paths),
        ),
        compaction=HarnessConfig.parse_compaction(settings.ai_harness_compaction),
        recent_window=settings.ai_compaction_recent_window,
        prompt_cache_default=PromptCache.parse(settings.ai_harness_prompt_cache_default),
        planning=SurfaceMode.parse(settings.llm.planning),
        filesystem=SurfaceMode.parse(settings.llm.filesystem),
        offload_threshold=HarnessConfig.parse_threshold(settings.llm.tool_output_offload_threshold),
    )


def _closed_conversations(extractor: FactExtractor, running: set[asyncio.Task[int]]) -> Router:
    router = Router()

    async def on_closed(closed: ConversationClosed, _: MessageContext) -> None:
        # Extraction calls the model: it runs beside the subscription, which stays free.
        task = asyncio.create_task(extractor.on_closed(closed))
        running.add(task)
        task.add_done_callback(running.discard)

    router.add(subjects.conversation_closed(), ConversationClosed, on_closed)
    return router


async def serve(settings: DispatchSettings, *, stop: asyncio.Event) -> None:
    """Run dispatch until `stop` is set."""
    app = load_service_app(settings.app, settings.app_dir)
    options = settings.dispatch
    # Every run slot of every nesting level may be in a model call at once.
    slots = options.max_concurrent_runs * (MAX_NESTING + 1)
    runtimes = discover_runtimes(runtime_config(settings.llm, max_concurrency=slots))
    runtime = resolve_runtime(runtimes)
    config = harness_config(settings)
    harnesses = resolve_app(
        app,
        config,
        runtime_name=runtime.name if runtime is not None else "",
        runtime_capabilities=runtime.capabilities() if runtime is not None else frozenset(),
    )
    runtime_block = runtime_info(runtime, runtimes, base_url=settings.llm.base_url)
    grpc_port = 0
    descriptors: list[AgentDescriptor] = []
    extractions: set[asyncio.Task[int]] = set()

    def info() -> dict[str, Any]:
        return {
            "agents": [d.name for d in descriptors],
            "app": settings.app,
            "runtime": runtime_block,
            "grpc": f"{options.grpc_host}:{grpc_port}" if grpc_port else None,
            "harness": runtime_state(config, harnesses),
            # Only when some agent genuinely has a browsable plan or file workspace.
            **({"hasWorkspace": True} if any(h.attached() and h.tools for h in harnesses.values()) else {}),
        }

    async with contextlib.AsyncExitStack() as stack:
        # Not `for runtime in runtimes`: that would rebind the resolved runtime (None without a
        # model) to the last one discovered, for the pipeline and the info alike.
        for discovered in runtimes:
            stack.push_async_callback(discovered.aclose)
        service = await stack.enter_async_context(open_service("dispatch", settings, info=info, stop=stop))
        bus: Bus = service.bus
        memory = MemoryClient(bus)
        pipeline = ModelPipeline(runtime, ConversationMemory(memory, config, runtime))
        descriptors[:] = agent_descriptors(app, pipeline, harnesses)
        await stack.enter_async_context(live_descriptors(bus, descriptors, max_age=settings.jetstream.agents_max_age))
        executor = RunExecutor(
            app,
            bus,
            pipeline,
            ExecutorOptions(
                governance_timeout=options.governance_timeout,
                approval_timeout=options.approval_timeout,
                offload_threshold=config.offload_threshold,
                max_deliveries=options.max_run_deliveries,
            ),
            harnesses=harnesses,
        )
        extractor = FactExtractor(app, harnesses, memory, runtime)
        await stack.enter_async_context(bus.serve(_closed_conversations(extractor, extractions), queue=WORKERS))
        queues = [
            await stack.enter_async_context(
                bus.consume(consumer, RunRequest, executor.on_work, max_inflight=options.max_concurrent_runs)
            )
            for consumer in run_queue_consumers(options.run_ack_wait, max_deliveries=options.max_run_deliveries)
        ]
        grpc_port = await stack.enter_async_context(
            serve_grpc(
                DispatchServicer(bus, descriptors, info, authenticator=Authenticator(settings.ingress.auth_tokens)),
                host=options.grpc_host,
                port=options.grpc_port,
                max_message_bytes=bus.max_payload,
                ready=lambda: service.health.ready,
            )
        )
        service.health.mark_ready()
        await stop.wait()
        for queue in queues:
            queue.stop()  # all levels at once; the stack's exits then wait for runs in hand only


def runtime_info(runtime: AgentRuntime | None, discovered: Sequence[AgentRuntime], *, base_url: str) -> dict[str, Any]:
    """The `runtime` block of the info: the runtime runs take, or why there is none.

    `state` is `ACTIVE`, or `INACTIVE(<why>)` with no name and no capabilities: a runtime that
    cannot run is never reported as if it could.
    """
    if runtime is None:
        return {
            "state": f"INACTIVE({why_no_runtime(discovered, base_url=base_url)})",
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


def why_no_runtime(discovered: Sequence[AgentRuntime], *, base_url: str) -> str:
    """Why no discovered runtime is available, in words that name the fix."""
    if not discovered:
        return "no runtime installed"
    if not base_url:
        return NO_MODEL
    if not is_http_url(base_url):
        # The value itself is not shown: a URL may carry credentials.
        return "LLM_BASE_URL is not an http(s) URL"
    names = ", ".join(sorted(r.name for r in discovered))
    return f"no runtime available among {names}"
