"""The memory side of a run: history in, the turn recorded, facts recalled and extracted.

- **History**: loaded from memory at the start of a `session.stream()` (in pages; one that
  cannot be loaded fails the run with `HistoryUnavailableError` instead of running as if the
  conversation were new); with `summarizing` compaction, an over-long history is summarized
  here with the agent's own runtime (memory has no model) and stored back. A conversation the
  client keeps (the Chat Completions door: `client_turns`) never reaches memory: its turns are
  the history (summarized the same way when too long, not stored), and no turn is recorded.
- **Capture**: on `complete` the user message and the answer are appended; on an error only
  the user message (Atmosphere's rule); memory applies the compaction bound in the same write.
- **Long-term memory**: recalled facts go at the END of the system prompt (the stable prefix
  stays cacheable); when a conversation closes, facts are extracted with the runtime and handed
  to memory, which screens each through governance before storing it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from collections.abc import Sequence

from atmosphere.bus.errors import HistoryUnavailableError
from atmosphere.bus.runs import SinkHost
from atmosphere.contracts.memory.v1.memory_pb2 import Compaction, ConversationClosed
from atmosphere.contracts.run.v1.run_pb2 import RunEvent, RunSubmission
from atmosphere.dispatch.client_turns import ClientTurns
from atmosphere.dispatch.harness import AgentHarness, HarnessConfig
from atmosphere.dispatch.memory_client import MemoryClient
from atmosphere.sdk import AiRequest, App, ChatMessage, StreamingSession
from atmosphere.sdk import compaction as compacting
from atmosphere.sdk.runtime import AgentExecutionContext, AgentRuntime

log = logging.getLogger("atmosphere.dispatch")

MODEL_CALL_TIMEOUT = 30.0
"""Seconds a summarizing or fact-extraction model call may take by default (then: the fallback,
or nothing): `ATMOSPHERE_DISPATCH__MEMORY_MODEL_TIMEOUT`."""
MAX_RECALLED_FACTS = 20
ANONYMOUS = frozenset({"", "anonymous"})

EXTRACTION_SYSTEM_PROMPT = "You are a fact extraction assistant. You answer with JSON only."
EXTRACTION_PROMPT = (
    "Read the conversation below and list the durable facts it reveals about the user (name, preferences, "
    "circumstances, goals). Answer with ONLY a JSON array of short factual statements, for example "
    '["The user\'s name is Ada", "The user prefers Python"]. Answer [] if there are none. '
    "No opinions, no questions, no filler.\n\nConversation:\n"
)
_QUOTED = re.compile(r'"((?:[^"\\]|\\.)*)"')


def user_id_of(run: RunSubmission | ConversationClosed) -> str:
    """The principal's user id, or "" for an anonymous caller."""
    user = run.principal.user_id if run.HasField("principal") else ""
    return "" if user.strip().lower() in ANONYMOUS else user


def with_facts(system_prompt: str, facts: Sequence[str]) -> str:
    """`system_prompt` with the recalled facts appended (Atmosphere's wording)."""
    if not facts:
        return system_prompt
    block = "Known facts about this user:\n" + "\n".join(f"- {fact}" for fact in facts)
    return f"{system_prompt}\n\n{block}" if system_prompt else block


def parse_facts(text: str) -> list[str]:
    """The facts in a model's answer: the quoted strings of its first `[`…last `]` (fences tolerated)."""
    body = text.replace("```json", "").replace("```", "")
    start, end = body.find("["), body.rfind("]")
    if start < 0 or end <= start:
        return []
    facts = []
    for match in _QUOTED.finditer(body[start : end + 1]):
        try:
            fact = json.loads(f'"{match.group(1)}"')
        except json.JSONDecodeError:
            continue
        if isinstance(fact, str) and fact.strip():
            facts.append(fact.strip())
    return facts


async def model_text(
    runtime: AgentRuntime | None, *, agent: str, system_prompt: str, prompt: str, timeout: float = MODEL_CALL_TIMEOUT
) -> str | None:
    """One tool-less model answer as text (for summaries and fact extraction); None on failure or after `timeout` s."""
    if runtime is None:
        return None
    text: list[str] = []
    failed = False

    async def sink(event: RunEvent) -> None:
        nonlocal failed
        kind = event.WhichOneof("kind")
        if kind == "text_delta":
            text.append(event.text_delta.text)
        elif kind == "error":
            failed = True

    session = StreamingSession(SinkHost(sink), run_id="", session_id="", conversation_id="")
    ctx = AgentExecutionContext(
        run_id="", agent=agent, conversation_id="", request=AiRequest(message=prompt, system_prompt=system_prompt)
    )
    try:
        async with asyncio.timeout(timeout):
            await runtime.execute(ctx, session)
    except TimeoutError:
        log.warning("agent %s: a memory model call took longer than %gs", agent, timeout)
        return None
    except Exception:
        log.exception("agent %s: a memory model call failed", agent)
        return None
    return None if failed else "".join(text)


class ConversationMemory:
    """History and facts for the runs of this dispatch instance."""

    def __init__(
        self,
        memory: MemoryClient,
        config: HarnessConfig,
        runtime: AgentRuntime | None,
        *,
        model_call_timeout: float = MODEL_CALL_TIMEOUT,
    ) -> None:
        """Use `memory` for storage and `runtime` for summaries (each given `model_call_timeout` s)."""
        self._memory = memory
        self._config = config
        self._runtime = runtime
        self._model_call_timeout = model_call_timeout

    def compaction(self, harness: AgentHarness, model: str | None) -> Compaction:
        """How this agent's history is bounded."""
        return Compaction(
            strategy=self._config.compaction, max_messages=harness.max_history_messages, model=model or ""
        )

    async def history(self, run: RunSubmission, harness: AgentHarness, client: ClientTurns) -> tuple[ChatMessage, ...]:
        """The history to send with this run's prompt: memory's and then the client's turns.

        A conversation the client keeps is its turns alone (summarized here when too long, and
        never stored); a model gateway's exchange too (memory keeps turns as text, which would
        lose the calls that bind each result to its call, and a provider refuses a result bound
        to none).

        Raises:
            HistoryUnavailableError: the stored history could not be loaded.
        """
        if not harness.conversation_memory or client.exchange:
            return client.turns
        if client.keeps_conversation:
            if self._config.compaction == "summarizing":
                return tuple(await self._summarized(run, harness, list(client.turns), store=False))
            return client.turns
        loaded = await self._memory.load_history(run.agent, run.conversation_id)
        if self._config.compaction == "summarizing":
            loaded = await self._summarized(run, harness, loaded, store=True)
        return (*loaded, *client.turns)

    async def _summarized(
        self, run: RunSubmission, harness: AgentHarness, loaded: list[ChatMessage], *, store: bool
    ) -> list[ChatMessage]:
        """`loaded` with its older part summarized when too long; `store`: written back to memory."""
        plan = compacting.split_for_summary(
            loaded, harness.max_history_messages, recent_window=self._config.recent_window
        )
        if plan is None:
            return loaded
        summary = await model_text(
            self._runtime,
            agent=run.agent,
            system_prompt=compacting.SUMMARY_SYSTEM_PROMPT,
            prompt=compacting.summary_prompt(plan.old),
            timeout=self._model_call_timeout,
        )
        if not summary or not summary.strip():
            summary = compacting.local_summary(plan.old)
        compacted = compacting.apply_summary(plan, summary.strip())
        if store:
            # Guarded: a turn another prompt appended meanwhile is not overwritten (then the next
            # load summarizes again).
            await self._memory.replace_history(run.agent, run.conversation_id, compacted, base=loaded)
        return compacted

    async def record(
        self,
        run: RunSubmission,
        harness: AgentHarness,
        *,
        user: str,
        answer: str | None,
        model: str | None,
        client_kept: bool,
    ) -> None:
        """Append the turn (only the user message when the run failed); `client_kept`: nothing to append."""
        if not harness.conversation_memory or client_kept:
            return
        await self._memory.append_turn(
            agent=run.agent,
            conversation_id=run.conversation_id,
            run_id=run.run_id,
            user=user,
            assistant=answer,
            compaction=self.compaction(harness, model),
        )

    async def recall(self, run: RunSubmission, harness: AgentHarness, request: AiRequest) -> AiRequest:
        """`request` with the user's known facts at the end of its system prompt."""
        user = user_id_of(run)
        if not harness.long_term_memory or not user:
            return request
        facts = await self._memory.facts(user, MAX_RECALLED_FACTS)
        return request.with_system_prompt(with_facts(request.system_prompt, facts)) if facts else request


class FactExtractor:
    """Extracts long-term facts when ingress announces that a conversation closed."""

    def __init__(
        self,
        app: App,
        harnesses: dict[str, AgentHarness],
        memory: MemoryClient,
        runtime: AgentRuntime | None,
        *,
        model_call_timeout: float = MODEL_CALL_TIMEOUT,
    ) -> None:
        """Extract for `app`'s agents that have long-term memory (each model call given `model_call_timeout` s)."""
        self._app = app
        self._harnesses = harnesses
        self._memory = memory
        self._runtime = runtime
        self._model_call_timeout = model_call_timeout

    async def on_closed(self, closed: ConversationClosed) -> int:
        """Extract and store the facts of one closed conversation; how many were stored."""
        harness = self._harnesses.get(closed.agent)
        user = user_id_of(closed)
        if harness is None or not harness.long_term_memory or not user or self._runtime is None:
            return 0
        try:
            history = await self._memory.load_history(closed.agent, closed.conversation_id)
        except HistoryUnavailableError as exc:
            log.warning("conversation %s: no facts extracted: %s", closed.conversation_id, exc.message)
            return 0
        if not history:
            return 0
        transcript = "\n".join(f"{m.role}: {m.content}" for m in history if m.role in {"user", "assistant"})
        answer = await model_text(
            self._runtime,
            agent=closed.agent,
            system_prompt=EXTRACTION_SYSTEM_PROMPT,
            prompt=EXTRACTION_PROMPT + transcript,
            timeout=self._model_call_timeout,
        )
        facts = parse_facts(answer or "")
        if not facts:
            return 0
        stored = await self._memory.save_facts(
            user_id=user, facts=facts, agent=closed.agent, conversation_id=closed.conversation_id
        )
        log.info("conversation %s: %d of %d extracted facts stored", closed.conversation_id, stored, len(facts))
        return stored
