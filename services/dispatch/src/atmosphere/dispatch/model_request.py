"""What one model exchange of a run asks: built live, or the journal's seed of it on a resume.

A live request is the agent's (system prompt, model, response format, cache hint) with the
conversation's history, through the user's interceptors and then the harness's recalled facts.
A durable run journals it (`run_input.seed_json`) so a resumed run asks exactly what it asked
before. An interceptor's failure is raised as `InterceptorFailedError`; history that cannot be
loaded as `HistoryUnavailableError` (never answered as if the conversation were new).
"""

from __future__ import annotations

import contextlib
import logging

from atmosphere.bus.errors import InterceptorFailedError
from atmosphere.contracts.journal.v1.journal_pb2 import EffectKind
from atmosphere.dispatch.client_turns import ClientTurns
from atmosphere.dispatch.effects import RunEffects
from atmosphere.dispatch.model_side import cache_hint
from atmosphere.dispatch.run_input import seed_json, seeded
from atmosphere.dispatch.run_scope import RunScope
from atmosphere.sdk import AiRequest, ChatMessage

log = logging.getLogger("atmosphere.dispatch")


class ModelRequests:
    """The model requests of one run's exchanges."""

    def __init__(self, scope: RunScope, rounds: RunEffects | None) -> None:
        """Build requests for `scope`'s run; `rounds`: the journal's handles when inputs are journaled."""
        self._scope = scope
        self._rounds = rounds

    async def next(self, message: str, client: ClientTurns) -> AiRequest:
        """The request for `message` (`client`: the turns the client sent along)."""
        effects = self._rounds
        if effects is None:
            return await self._live(message, client)
        key, digest, seed = effects.input()
        if seed is not None:
            with contextlib.suppress(ValueError):  # an unreadable seed is built live again
                return seeded(self._base(message, ()), seed.payload)
        await effects.journal.pending(EffectKind.EFFECT_KIND_RUN_INPUT, key, digest)
        request = await self._live(message, client)
        run = self._scope.request
        payload = seed_json(
            request,
            conversation_id=run.conversation_id,
            user_id=run.principal.user_id,
            path=run.path,
            tools_digest=digest,
        )
        await effects.journal.commit(key, payload)
        return request

    async def _live(self, message: str, client: ClientTurns) -> AiRequest:
        """The request through the interceptors and recalled facts."""
        scope = self._scope
        run, harness = scope.request, scope.agent.harness
        memory = scope.services.model_side.conversation
        history = client.turns if memory is None else await memory.history(run, harness, client)
        request = self._base(message, history)
        for interceptor in scope.spec.interceptors:
            try:
                request = await interceptor.pre_process(request)
            except Exception:
                log.exception("interceptor %s failed on run %s", type(interceptor).__name__, run.run_id)
                raise InterceptorFailedError(f"Interceptor {type(interceptor).__name__} failed") from None
        if memory is not None:
            # The harness's long-term memory runs after the user's interceptors, as Atmosphere's does.
            request = await memory.recall(run, harness, request)
        return request

    def _base(self, message: str, history: tuple[ChatMessage, ...]) -> AiRequest:
        """The agent's request for `message` before interceptors and recalled facts."""
        scope = self._scope
        spec, run = scope.spec, scope.request
        return AiRequest(
            message=message,
            system_prompt=spec.system_prompt,
            history=history,
            model=spec.model,
            metadata=dict(run.metadata),
            response_format=spec.response_format,
            cache_hint=cache_hint(spec, scope.agent.harness, run),
        )
