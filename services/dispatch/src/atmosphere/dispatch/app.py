"""Dispatch's wiring: load the app, resolve a runtime, pull runs, serve gRPC."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from atmosphere.bus import ConsumerSpec, subjects
from atmosphere.contracts.run.v1.run_pb2 import RunRequest
from atmosphere.dispatch.generation import runtime_config
from atmosphere.dispatch.grpc_api import DispatchServicer, serve_grpc
from atmosphere.dispatch.handlers import ExecutorOptions, RunExecutor, agent_descriptors
from atmosphere.dispatch.pipeline import ModelPipeline
from atmosphere.dispatch.settings import DispatchSettings
from atmosphere.sdk import load_app
from atmosphere.sdk.runtime import AgentRuntime, discover_runtimes, resolve_runtime
from atmosphere.service import open_service

WORKERS = "dispatch"
"""The durable consumer every dispatch instance pulls runs from."""


async def serve(settings: DispatchSettings, *, stop: asyncio.Event) -> None:
    """Run dispatch until `stop` is set."""
    app = load_app(settings.app, app_dir=settings.app_dir)
    options = settings.dispatch
    runtimes = discover_runtimes(runtime_config(settings.llm, max_concurrency=options.max_concurrent_runs))
    pipeline = ModelPipeline(resolve_runtime(runtimes))
    descriptors = agent_descriptors(app, pipeline)
    grpc_port = 0

    def info() -> dict[str, Any]:
        return {
            "agents": [d.name for d in descriptors],
            "app": settings.app,
            "runtime": _runtime_info(pipeline.runtime),
            "grpc": f"{options.grpc_host}:{grpc_port}" if grpc_port else None,
        }

    async with contextlib.AsyncExitStack() as stack:
        for runtime in runtimes:
            stack.push_async_callback(runtime.aclose)
        service = await stack.enter_async_context(open_service("dispatch", settings, info=info))
        bus = service.bus
        for descriptor in descriptors:
            await bus.kv_put(subjects.AGENTS_BUCKET, descriptor.name, descriptor)
        executor = RunExecutor(
            app,
            bus,
            pipeline,
            ExecutorOptions(governance_timeout=options.governance_timeout, approval_timeout=options.approval_timeout),
        )
        consumer = ConsumerSpec(
            stream=subjects.RUNS_STREAM,
            durable=WORKERS,
            filter_subject=subjects.run_submit_all(),
            ack_wait_seconds=options.run_ack_wait,
            confirm_ack=True,
        )
        await stack.enter_async_context(
            bus.consume(consumer, RunRequest, executor.on_work, max_inflight=options.max_concurrent_runs)
        )
        grpc_port = await stack.enter_async_context(
            serve_grpc(DispatchServicer(bus, descriptors, info), host=options.grpc_host, port=options.grpc_port)
        )
        service.health.mark_ready()
        await stop.wait()


def _runtime_info(runtime: AgentRuntime | None) -> dict[str, Any] | None:
    if runtime is None:
        return None
    return {
        "name": runtime.name,
        "model": runtime.config.model or None,
        "capabilities": sorted(c.value for c in runtime.capabilities()),
    }
