"""What every ingress route shares, built once in the app's lifespan."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from atmosphere.bus import Bus
from atmosphere.ingress.auth import AdminGate, Authenticator
from atmosphere.ingress.conversations import ConversationTracker
from atmosphere.ingress.directory import AgentDirectory
from atmosphere.ingress.openai_retries import CompletionRetries
from atmosphere.ingress.pacing import Drain
from atmosphere.ingress.settings import IngressSettings
from atmosphere.service import ServiceRuntime, StreamSlots


@dataclass
class IngressState:
    """The bus, the agent directory, auth, and the OpenAI endpoint's concurrency permits and retries."""

    settings: IngressSettings
    runtime: ServiceRuntime
    directory: AgentDirectory
    authenticator: Authenticator
    admin_gate: AdminGate
    openai_permits: asyncio.Semaphore
    completions: CompletionRetries
    """OpenAI completions a retry may attach to."""
    conversations: ConversationTracker
    drain: Drain
    """Set when ingress stops: open streams end and say where to resume."""
    streams: StreamSlots
    """The run streams followed now, per client and in total (`stream_limits.py`)."""

    @property
    def bus(self) -> Bus:
        """The connected bus."""
        return self.runtime.bus

    @classmethod
    def build(cls, settings: IngressSettings, runtime: ServiceRuntime, *, drain: Drain | None = None) -> IngressState:
        """Everything from the settings and the running service."""
        return cls(
            settings=settings,
            runtime=runtime,
            directory=AgentDirectory(runtime.bus),
            authenticator=Authenticator(settings.ingress.auth_tokens),
            admin_gate=AdminGate(settings.admin_http_read_auth_required, settings.admin_token),
            openai_permits=asyncio.Semaphore(settings.ai_openai_max_concurrent),
            completions=CompletionRetries(runtime.bus, retry_grace=settings.ai_openai_retry_grace),
            conversations=ConversationTracker(runtime.bus, idle_timeout=settings.ingress.conversation_idle_timeout),
            drain=drain or Drain(),
            streams=StreamSlots(per_client=settings.ingress.max_streams_per_client, total=settings.ingress.max_streams),
        )
