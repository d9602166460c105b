"""Keeping this dispatch's agent descriptors in `ATMO_AGENTS`, and saying how each agent's tools are gated.

The bucket's entries expire `max_age` seconds after their last write (the layout's
`agents_max_age_seconds`), so a descriptor lives only while some dispatch keeps rewriting it:
every third of the age, here. When the last dispatch serving an agent stops or dies, the agent
drops out of every list (`/atmosphere/v1/models`, `/api/admin/agents`) and ingress refuses
prompts to it up front, instead of accepting them for a worker that will never come. Several
replicas serving one agent simply rewrite the same entry.

An agent's MCP servers' tools are in its descriptor's `tools` only while a sandbox lists them
(`listed`, asked again at every rewrite): runtime truth, not what was declared.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from typing import Any

from atmosphere.bus import Bus, BusError, subjects
from atmosphere.contracts.dispatch.v1.dispatch_pb2 import AgentDescriptor
from atmosphere.dispatch.permissions import ToolPermissions
from atmosphere.sdk import App

log = logging.getLogger("atmosphere.dispatch")

REFRESHES_PER_AGE = 3
"""Rewrites per max age: two may be late or lost (a broker restart) before an agent drops out."""

Listed = Callable[[], Awaitable[Mapping[str, Sequence[str]]]]
"""The tools listed now beyond an agent's own (its MCP servers' while they answer), by agent."""


async def publish_descriptors(bus: Bus, descriptors: Sequence[AgentDescriptor], listed: Listed | None = None) -> None:
    """Write every descriptor once (its expiry starts again), with the tools `listed` now."""
    extra = await listed() if listed is not None else {}
    for descriptor in descriptors:
        tools = [name for name in extra.get(descriptor.name, ()) if name not in descriptor.tools]
        if tools:
            current = AgentDescriptor()
            current.CopyFrom(descriptor)
            current.tools.extend(tools)
            descriptor = current  # noqa: PLW2901 - the one written
        await bus.kv_put(subjects.AGENTS_BUCKET, descriptor.name, descriptor)


@contextlib.asynccontextmanager
async def live_descriptors(
    bus: Bus, descriptors: Sequence[AgentDescriptor], *, max_age: float, listed: Listed | None = None
) -> AsyncIterator[None]:
    """Publish `descriptors` now, then rewrite them every `max_age / 3` seconds until the context ends.

    The first write must succeed (a dispatch whose agents cannot be found is not ready); a later
    one that fails is logged and tried again at the next tick. `max_age` 0 means entries never
    expire: they are written once.
    """
    await publish_descriptors(bus, descriptors, listed)
    if max_age <= 0:
        yield
        return
    interval = max_age / REFRESHES_PER_AGE
    refresher = asyncio.create_task(_refresh(bus, descriptors, interval, listed), name="agent-descriptors")
    try:
        yield
    finally:
        refresher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await refresher


async def _refresh(bus: Bus, descriptors: Sequence[AgentDescriptor], interval: float, listed: Listed | None) -> None:
    failing = False
    while True:
        await asyncio.sleep(interval)
        try:
            await publish_descriptors(bus, descriptors, listed)
        except BusError as exc:
            if not failing:  # once per outage, not once per tick
                log.warning("agent descriptors could not be rewritten (%s); retrying every %.1fs", exc, interval)
            failing = True
        except Exception:
            # Never let the refresher die: its agents would silently drop out of every list.
            log.exception("rewriting the agent descriptors failed unexpectedly; retrying")
        else:
            if failing:
                log.info("agent descriptors rewritten again")
            failing = False


def permissions_info(app: App, permissions: ToolPermissions) -> dict[str, Any]:
    """How tool calls are gated here, for the service info: each agent's mode, the configured permissions.

    The modes are the declared ones (`@agent(permission_mode=...)`); a request may make its own
    run's mode stricter, never looser. Tool permissions are listed only when some are configured.
    """
    info: dict[str, Any] = {"permissionModes": {name: spec.permission_mode.name for name, spec in app.agents.items()}}
    if permissions.rules:
        info["toolPermissions"] = {pattern: str(permission) for pattern, permission in permissions.rules.items()}
    return info
