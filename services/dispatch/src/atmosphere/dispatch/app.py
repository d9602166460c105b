"""Dispatch's wiring: load the app, resolve a runtime, pull runs, serve gRPC."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from atmosphere.bus import Bus, ConsumerSpec, MessageContext, Router, subjects
from atmosphere.bus.runs import MAX_NESTING
from atmosphere.contracts.dispatch.v1.dispatch_pb2 import AgentDescriptor
from atmosphere.contracts.memory.v1.memory_pb2 import ConversationClosed
from atmosphere.contracts.run.v1.run_pb2 import RunRequest
from atmosphere.dispatch.conversation import ConversationMemory, FactExtractor
from atmosphere.dispatch.generation import runtime_config
from atmosphere.dispatch.grpc_api import DispatchServicer, serve_grpc
from atmosphere.dispatch.handlers import ExecutorOptions, RunExecutor, agent_descriptors
from atmosphere.dispatch.harness import HarnessConfig, SurfaceMode, resolve_app, runtime_state
from atmosphere.dispatch.memory_client import MemoryClient
from atmosphere.dispatch.pipeline import ModelPipeline
from atmosphere.dispatch.settings import DispatchSettings
from atmosphere.sdk import HarnessSwitch, PromptCache, load_app
from atmosphere.sdk.runtime import AgentRuntime, discover_runtimes, resolve_runtime
from atmosphere.service import Authenticator, open_service

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
    app = load_app(settings.app, app_dir=settings.app_dir)
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
    grpc_port = 0
    descriptors: list[AgentDescriptor] = []
    extractions: set[asyncio.Task[int]] = set()

    def info() -> dict[str, Any]:
        return {
            "agents": [d.name for d in descriptors],
            "app": settings.app,
            "runtime": _runtime_info(runtime),
            "grpc": f"{options.grpc_host}:{grpc_port}" if grpc_port else None,
            "harness": runtime_state(config, harnesses),
            # Only when some agent genuinely has a browsable plan or file workspace.
            **({"hasWorkspace": True} if any(h.attached() and h.tools for h in harnesses.values()) else {}),
        }

    async with contextlib.AsyncExitStack() as stack:
        for runtime in runtimes:
            stack.push_async_callback(runtime.aclose)
        service = await stack.enter_async_context(open_service("dispatch", settings, info=info, stop=stop))
        bus: Bus = service.bus
        memory = MemoryClient(bus)
        pipeline = ModelPipeline(runtime, ConversationMemory(memory, config, runtime))
        descriptors[:] = agent_descriptors(app, pipeline, harnesses)
        for descriptor in descriptors:
            await bus.kv_put(subjects.AGENTS_BUCKET, descriptor.name, descriptor)
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
            )
        )
        service.health.mark_ready()
        await stop.wait()
        for queue in queues:
            queue.stop()  # all levels at once; the stack's exits then wait for runs in hand only


def _runtime_info(runtime: AgentRuntime | None) -> dict[str, Any] | None:
    if runtime is None:
        return None
    return {
        "name": runtime.name,
        "model": runtime.config.model or None,
        "capabilities": sorted(c.value for c in runtime.capabilities()),
    }
