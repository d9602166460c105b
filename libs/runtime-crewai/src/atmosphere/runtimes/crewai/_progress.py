"""From CrewAI's event bus to the run's stream: progress, text, tool-call argument deltas, usage.

CrewAI publishes every event it emits to the stream sinks of the emitting context
(`crewai.events.stream_context`), synchronously and in order, in whatever thread emitted it. The
run registers one sink (`Forwarder.sink`) in the context its crew runs in, which every thread of
the crew inherits, so a run reads its own crew's events only, however many crews run in the
process. The sink turns each event it cares for into a `RunEvent` and posts it on the run's
`Bridge`, which sends them in the same order.

What the client sees, before the answer's end:

- `agent_step` events, one per step of the crew, `step_name` one of `crewai.task.started`,
  `crewai.agent.started`, `crewai.agent.completed`, `crewai.agent.failed`,
  `crewai.task.completed`, `crewai.task.failed`; `description` a line for people (`researcher started task 1/2: Find
  sources`), `data` a JSON object: `agent` (the role), `task` (its name, or its description's
  start), `taskIndex` (1-based), `taskCount`, and on completion `output` (the answer,
  cut at `MAX_OUTPUT` characters, `truncated: true` when it was), on failure `error`;
- `text_delta`s of the final task's model text as it streams (the other tasks' answers are in
  their `crewai.task.completed` step);
- `tool_call_delta`s of every agent's tool calls as their arguments stream;
- one `usage` per model call of the crew (every agent's, CrewAI's own internal calls too), as the
  provider reported it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from crewai.events.types.agent_events import (
    AgentExecutionCompletedEvent,
    AgentExecutionErrorEvent,
    AgentExecutionStartedEvent,
)
from crewai.events.types.llm_events import LLMCallCompletedEvent, LLMCallType, LLMStreamChunkEvent
from crewai.events.types.task_events import TaskCompletedEvent, TaskFailedEvent, TaskStartedEvent
from crewai.types.usage_metrics import UsageMetrics

from atmosphere.contracts.run.v1.run_pb2 import AgentStep, RunEvent, TextDelta, ToolCallDelta
from atmosphere.runtimes.crewai._bridge import Bridge
from atmosphere.sdk import TokenUsage

MAX_OUTPUT = 4000
"""Characters of a task's answer an `agent_step` carries (the whole answer is the final text or the tape's)."""
MAX_LABEL = 80
"""Characters of a task's description that name a task without a name."""

TASK_STARTED = "crewai.task.started"
AGENT_STARTED = "crewai.agent.started"
AGENT_COMPLETED = "crewai.agent.completed"
AGENT_FAILED = "crewai.agent.failed"
TASK_COMPLETED = "crewai.task.completed"
TASK_FAILED = "crewai.task.failed"


@dataclass(frozen=True, slots=True)
class TaskLabel:
    """How the progress events name one task of the crew."""

    index: int
    count: int
    name: str


def task_labels(tasks: Sequence[Any]) -> dict[str, TaskLabel]:
    """Each task of a crew by its id: its place and its name (or its description's start)."""
    count = len(tasks)
    labels: dict[str, TaskLabel] = {}
    for index, task in enumerate(tasks, start=1):
        name = task.name or " ".join(str(task.description).split())
        labels[str(task.id)] = TaskLabel(index, count, name if len(name) <= MAX_LABEL else name[: MAX_LABEL - 1] + "…")
    return labels


class Forwarder:
    """One run's sink on CrewAI's events (see the module)."""

    def __init__(self, bridge: Bridge, tasks: Mapping[str, TaskLabel], final_task: str, model: str) -> None:
        """Post to `bridge`; `final_task` is the id of the task whose text is the answer.

        Usage is reported as `model`'s unless the event names its model.
        """
        self._bridge = bridge
        self._tasks = tasks
        self._final_task = final_task
        self._model = model
        self.streamed_answer = False
        """Whether any text of the final task's model was sent (else the crew's answer is sent at the end)."""

    def sink(self, source: Any, event: Any) -> None:
        """Called by CrewAI for each event of the run, in the emitting thread."""
        del source
        if isinstance(event, LLMStreamChunkEvent):
            self._chunk(event)
        elif isinstance(event, LLMCallCompletedEvent):
            self._usage(event)
        elif isinstance(event, TaskStartedEvent):
            self._step(TASK_STARTED, event, "{agent} started task {index}/{count}: {task}")
        elif isinstance(event, AgentExecutionStartedEvent):
            self._step(AGENT_STARTED, event, "{agent} is working on task {index}/{count}: {task}")
        elif isinstance(event, AgentExecutionCompletedEvent):
            self._step(AGENT_COMPLETED, event, "{agent} finished task {index}/{count}: {task}", event.output)
        elif isinstance(event, AgentExecutionErrorEvent):
            self._step(AGENT_FAILED, event, "{agent} failed task {index}/{count}: {task}", error=event.error)
        elif isinstance(event, TaskCompletedEvent):
            self._step(TASK_COMPLETED, event, "Task {index}/{count} done: {task}", event.output.raw)
        elif isinstance(event, TaskFailedEvent):
            self._step(TASK_FAILED, event, "Task {index}/{count} failed: {task}", error=event.error)

    def _chunk(self, event: LLMStreamChunkEvent) -> None:
        if not event.chunk:
            return
        call = event.tool_call
        if call is not None or event.call_type is LLMCallType.TOOL_CALL:
            if call is not None and call.id:
                delta = ToolCallDelta(
                    call_id=call.id, tool_name=call.function.name or "", arguments_fragment=event.chunk
                )
                self._bridge.post(RunEvent(tool_call_delta=delta))
            return
        if event.task_id == self._final_task:
            self.streamed_answer = True
            self._bridge.post(RunEvent(text_delta=TextDelta(text=event.chunk)))

    def _usage(self, event: LLMCallCompletedEvent) -> None:
        metrics = UsageMetrics.from_provider_dict(event.usage)
        if metrics is None or not (metrics.prompt_tokens or metrics.completion_tokens):
            return
        usage = TokenUsage(
            input=metrics.prompt_tokens,
            output=metrics.completion_tokens,
            cached_input=metrics.cached_prompt_tokens,
            total=metrics.prompt_tokens + metrics.completion_tokens,
            model=event.model or self._model,
        )
        self._bridge.post(RunEvent(usage=usage.to_proto()))

    def _step(self, name: str, event: Any, line: str, output: str | None = None, *, error: str | None = None) -> None:
        task = getattr(event, "task", None)
        label = self._tasks.get(str(event.task_id or getattr(task, "id", "")))
        agent = event.agent_role or _role(getattr(event, "agent", None) or getattr(task, "agent", None))
        data: dict[str, Any] = {"agent": agent}
        if label is not None:
            data |= {"task": label.name, "taskIndex": label.index, "taskCount": label.count}
        if output is not None:
            data["output"] = output[:MAX_OUTPUT]
            if len(output) > MAX_OUTPUT:
                data["truncated"] = True
        if error is not None:
            data["error"] = error[:MAX_OUTPUT]
        description = line.format(
            agent=agent or "An agent",
            index=label.index if label else "?",
            count=label.count if label else "?",
            task=label.name if label else "",
        )
        step = AgentStep(step_name=name, description=description, data_json=json.dumps(data, ensure_ascii=False))
        self._bridge.post(RunEvent(agent_step=step))


def _role(agent: Any) -> str:
    """An agent's role (agent events carry the agent itself; task events, through their task)."""
    role = getattr(agent, "role", None)
    return role if isinstance(role, str) else ""
