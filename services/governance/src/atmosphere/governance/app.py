"""Governance's wiring: the policy plane, the decision log, the screens, governance's log, the responders."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from functools import partial

from atmosphere.bus import Bus, ServiceError, subjects
from atmosphere.bus.errors import ReplicaBehindError
from atmosphere.contracts.governance.v1.governance_pb2 import GovernanceLogEntry
from atmosphere.governance import metrics
from atmosphere.governance.handlers import GovernanceHandlers, MemorySafety, runtime_info
from atmosphere.governance.injection import Breach
from atmosphere.governance.plane import GovernancePlane, load_policies
from atmosphere.governance.policies import Policy, PolicyFileError, registered_policies
from atmosphere.governance.pricing import PricingTable
from atmosphere.governance.replication import GovernanceJournal, GovernanceLog, GovernanceReplica
from atmosphere.governance.screening import Screening
from atmosphere.governance.screens import LlmEndpoint, ToolOutputMode, build_classifier
from atmosphere.governance.settings import GovernanceSettings
from atmosphere.governance.store import DecisionLog, Retention
from atmosphere.service import load_service_app, open_service
from atmosphere.service.replica import ReplicaLog, ReplicaPosition, replica_name

log = logging.getLogger("atmosphere.governance")


def code_policies(settings: GovernanceSettings) -> list[Policy]:
    """The app's Python policies (`App(policies=...)`, then `register_policy`), importing the app if named.

    Raises:
        PolicyFileError: one of them is not a policy.
    """
    found: list[object] = []
    if settings.app:
        found.extend(load_service_app(settings.app, settings.app_dir).policies)
    found.extend(registered_policies())
    policies: list[Policy] = []
    for item in found:
        if not isinstance(item, Policy):
            raise PolicyFileError(f"code: {item!r} is not a policy (needs identity, evaluate and release)")
        if all(item is not other for other in policies):
            policies.append(item)
    return policies


def build_plane(settings: GovernanceSettings) -> GovernancePlane:
    """The plane of every policy in force; a file that does not parse raises `PolicyFileError`."""
    code = code_policies(settings)
    files = settings.governance.policy_files
    reread = partial(load_policies, settings.app_dir, files, code)
    return GovernancePlane(
        reread(),
        pricing=PricingTable.load(settings.governance.pricing_file),
        reload_from=reread,
        slot_ttl=settings.governance.slot_ttl,
    )


def build_screening(settings: GovernanceSettings) -> Screening:
    """The screens as configured; a tier that cannot run raises `TierUnavailable` (governance stops)."""
    options, tier = settings.governance, settings.ai_injection_screen_tier
    endpoint = (
        LlmEndpoint(options.classifier_base_url, options.classifier_model, options.classifier_api_key or None)
        if options.classifier_base_url and options.classifier_model
        else None
    )
    return Screening(
        tool_output_mode=ToolOutputMode(settings.ai_tool_injection_screen_mode),
        document_breach=Breach(settings.ai_rag_safety_on_breach),
        document_fail_open=settings.ai_rag_safety_fail_open,
        tier=tier,
        classifier=None if tier == "RULE_BASED" else build_classifier(tier, llm=endpoint),
    )


async def serve(settings: GovernanceSettings, *, stop: asyncio.Event, bus: Bus | None = None) -> None:
    """Run governance until `stop` is set, on `bus` when given (else on a connection to `settings.nats`)."""
    if settings.ai_memory_safety_tier.strip().upper() != "RULE_BASED":
        log.warning("memory safety tier %s is not available here: using RULE_BASED", settings.ai_memory_safety_tier)
    safety = MemorySafety(
        enabled=settings.ai_memory_safety_enabled,
        breach=Breach(settings.ai_memory_safety_on_breach),
        fail_open=settings.ai_memory_safety_fail_open,
    )
    screening = build_screening(settings)
    # Before anything is served: a policy file that does not parse stops governance (fail-closed).
    plane = build_plane(settings)
    metrics.observe(plane)
    retention = Retention(settings.governance.decision_log_max_rows, settings.governance.decision_log_max_age_days)
    async with (
        DecisionLog.open(settings.db_path, retention) as decisions,
        open_service(
            "governance", settings, info=lambda: runtime_info(safety, plane, screening), stop=stop, bus=bus
        ) as runtime,
        replicated(
            runtime.bus,
            decisions,
            plane,
            replica=replica_name(settings.db_path.parent, "governance"),
            position=ReplicaPosition(settings.db_path.parent, "governance"),
            safety=safety,
            screening=screening,
        ) as handlers,
        runtime.bus.serve(handlers.router(), queue="governance"),
    ):
        runtime.health.mark_ready()
        await stop.wait()


@contextlib.asynccontextmanager
async def replicated(
    bus: Bus,
    decisions: DecisionLog,
    plane: GovernancePlane,
    *,
    replica: str,
    position: ReplicaPosition | None = None,
    safety: MemorySafety | None = None,
    screening: Screening | None = None,
) -> AsyncIterator[GovernanceHandlers]:
    """Governance's responders as replica `replica`, applying governance's log while the context is open.

    `ATMO_GOVERNANCE` is the store of record: every replica applies every decision and state
    change, in order, so N replicas keep one decision log and one set of counters. The
    responders are returned once this replica took up its own store and applied what the log held.
    `position` keeps how far it applied beside its store (None: in memory, a test's replica).
    """
    state = GovernanceReplica(decisions, plane, name=replica)
    # What this replica applied before a restart (spend, the kill switch, policy swaps, the
    # counters' windows) counts before anything is decided.
    await state.restore()
    entries: GovernanceLog = ReplicaLog(
        bus,
        stream=subjects.GOVERNANCE_LOG_STREAM,
        filter_subject=subjects.governance_log_all(),
        position=position or ReplicaPosition(None, "governance"),
        message_type=GovernanceLogEntry,
        apply=state.apply,
        outcomes=(ServiceError,),
    )
    handlers = GovernanceHandlers(
        decisions,
        safety,
        plane=plane,
        screening=screening,
        max_payload=bus.max_payload,
        journal=GovernanceJournal(state, log=entries),
    )
    async with entries.applying():
        await catch_up(entries)
        yield handlers


async def catch_up(entries: GovernanceLog) -> None:
    """Apply what the log already holds before taking requests (a new replica starts from its start)."""
    try:
        await entries.caught_up()
    except ReplicaBehindError:
        log.warning("governance is still applying %s; reads wait for it", subjects.GOVERNANCE_LOG_STREAM)
