"""Every runtime through the platform: an agent per runtime, and each framework's own object hosted.

`on-<runtime>` is the same agent (three tools: `lookup` answers, `forbidden` is denied by the
test's policy, `transfer` needs the client's approval) pinned to each runtime (`on-built-in` to
none: the default pool). `hosted-<framework>` serves a real object of that framework, built the
way its users build one (`tests/e2e/apps/hosted/<framework>.py`), with three tools of its own:
`native_lookup`, `native_forbidden` (denied by the policy too) and `native_transfer` (the
operator's tool permissions say `confirm`). Every tool writes one line to a ledger file
(`ATMOSPHERE_ADAPTERS_LEDGER`) when it runs: what must never happen for a denied call.

This module imports no framework: each hosted object is named by its import path, so only the
pool that runs it imports its framework, and the pools of the pinned environment (CrewAI,
Semantic Kernel, LlamaIndex, in `.venvs/pinned`) load the same app as the others.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from atmosphere.sdk import App, Harness, agent, hosted_agent, tool

LEDGER_ENV = "ATMOSPHERE_ADAPTERS_LEDGER"
RUNTIMES = (
    "built-in",
    "langchain",
    "langgraph",
    "pydantic-ai",
    "openai-agents",
    "anthropic",
    "cohere",
    "adk",
    "agentscope",
    "crewai",
    "semantic-kernel",
    "llamaindex",
)
FRAMEWORKS = (
    "langchain",
    "langgraph",
    "pydantic-ai",
    "openai-agents",
    "adk",
    "agentscope",
    "crewai",
    "semantic-kernel",
    "llamaindex",
)
"""The runtimes that host a framework object of their own (Anthropic's and Cohere's SDKs have none)."""


def ran(line: str) -> None:
    """Record that a tool ran (the ledger is the test's evidence)."""
    with Path(os.environ[LEDGER_ENV]).open("a", encoding="utf-8") as ledger:
        ledger.write(line + "\n")


@tool(idempotent=True)
async def lookup(city: str) -> str:
    """Current weather for a city.

    Args:
        city: The city's name.
    """
    ran(f"lookup {city}")
    return f"sunny in {city}"


@tool
async def forbidden(target: str) -> str:
    """Something the policy never lets run.

    Args:
        target: What it would act on.
    """
    ran(f"forbidden {target}")
    return "it ran"


@tool(requires_approval=True)
async def transfer(amount: int) -> str:
    """Move money: a human approves it first.

    Args:
        amount: How much.
    """
    ran(f"transfer {amount}")
    return f"transferred {amount}"


def _on(runtime: str) -> type[Any]:
    cls = type(f"On{runtime.title().replace('-', '')}", (), {"__doc__": f"The test agent on the {runtime} runtime."})
    pinned = None if runtime == "built-in" else runtime
    decorate = agent(name=f"on-{runtime}", tools=[lookup, forbidden, transfer], harness=[], runtime=pinned)
    return decorate(cls)


def native_lookup_text(city: str) -> str:
    ran(f"native_lookup {city}")
    return f"cloudy in {city}"


def native_forbidden_text(target: str) -> str:
    ran(f"native_forbidden {target}")
    return "it ran"


def native_transfer_text(amount: int) -> str:
    ran(f"native_transfer {amount}")
    return f"moved {amount}"


@agent(name="planner-agentscope", tools=[lookup], harness=[Harness.PLANNING], runtime="agentscope")
class PlannerOnAgentScope:
    """Plans with AgentScope's own task list, which the platform stores as the agent's plan."""


ADK_FILES = hosted_agent(
    "files-adk",
    "tests.e2e.apps.hosted.adk_files_hosted:hosted",
    runtime="adk",
    harness=[Harness.MEMORY, Harness.FILESYSTEM],
)
"""An ADK agent saving an artifact, which lands in the conversation's file workspace."""
CREW = hosted_agent("crew-crewai", "tests.e2e.apps.hosted.crewai_team_hosted:hosted", runtime="crewai")
"""A two-agent crew (a researcher, then a writer), each agent's progress streamed."""


def hosted(framework: str) -> type[Any]:
    """`hosted-<framework>`: its object, imported only by its pool."""
    module = framework.replace("-", "_")
    return hosted_agent(f"hosted-{framework}", f"tests.e2e.apps.hosted.{module}_hosted:hosted", runtime=framework)


app = App(
    agents=[
        *(_on(runtime) for runtime in RUNTIMES),
        *(hosted(framework) for framework in FRAMEWORKS),
        PlannerOnAgentScope,
        ADK_FILES,
        CREW,
    ]
)
