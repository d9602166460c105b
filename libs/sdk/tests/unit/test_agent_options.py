"""Every keyword a declaration decorator takes reaches the class's `AgentSpec`, checked.

The three decorators gather their keywords into one `AgentOptions` and `record_spec` turns it
into the spec: a keyword dropped or crossed on the way would otherwise go unnoticed.
"""

from __future__ import annotations

import dataclasses

import pytest
from pydantic import BaseModel

from atmosphere.sdk import (
    AiBudget,
    AiInterceptor,
    Harness,
    McpServer,
    PermissionMode,
    PromptCache,
    RemoteAgent,
    RetryPolicy,
    ToolLoopPolicy,
    agent,
    ai_endpoint,
    coordinator,
    tool,
)
from atmosphere.sdk._spec import AgentOptions
from atmosphere.sdk.host import AgentSpec, spec_of


@tool
def lookup(city: str) -> str:
    """Look a city up."""
    return city


class Shout(AiInterceptor):
    """Changes nothing; only its presence is checked."""


class Answer(BaseModel):
    text: str


LOOP = ToolLoopPolicy.strict(3)
RETRY = RetryPolicy(max_retries=1)
BUDGET = AiBudget(max_steps=4)
DOCS = McpServer.http("docs", "http://127.0.0.1:9/mcp")
REMOTE = RemoteAgent("scout", "https://b.example/atmosphere/a2a/scout")


def declared(spec: AgentSpec) -> dict[str, object]:
    """The spec's fields that say how the agent behaves (its class and instances aside)."""
    fields = {f.name: getattr(spec, f.name) for f in dataclasses.fields(spec)}
    fields.pop("cls")
    fields["interceptors"] = [type(i) for i in spec.interceptors]
    return fields


def test_agent_hands_every_keyword_to_its_spec() -> None:
    @agent(
        name="full",
        system_prompt="Be brief.",
        description="Does it all.",
        tools=[lookup],
        mcp_servers=[DOCS],
        interceptors=[Shout],
        tool_loop=LOOP,
        retry=RETRY,
        budget=BUDGET,
        response_format=Answer,
        structured_output_retries=2,
        model="m-1",
        harness=[Harness.MEMORY],
        headless=True,
        max_history_messages=8,
        prompt_cache="aggressive",
        permission_mode="plan",
        runtime="langchain",
    )
    class Full: ...

    assert declared(spec_of(Full)) == {
        "name": "full",
        "prompt_method": None,
        "kind": "agent",
        "path": "/atmosphere/agent/full",
        "system_prompt": "Be brief.",
        "description": "Does it all.",
        "tools": (lookup,),
        "mcp_servers": (DOCS,),
        "fleet": (),
        "remotes": (),
        "interceptors": [Shout],
        "tool_loop": LOOP,
        "retry": RETRY,
        "budget": BUDGET,
        "response_format": Answer,
        "structured_output_retries": 2,
        "model": "m-1",
        "harness": (Harness.MEMORY,),
        "headless": True,
        "max_history_messages": 8,
        "conversation_memory": False,
        "prompt_cache": PromptCache.AGGRESSIVE,
        "permission_mode": PermissionMode.PLAN,
        "runtime": "langchain",
        "native": None,
    }


def test_coordinator_hands_every_keyword_to_its_spec() -> None:
    @agent(name="member")
    class Member:
        """A member."""

    @coordinator(
        name="boss",
        fleet=[Member, "other", REMOTE],
        system_prompt="Delegate.",
        tools=[lookup],
        mcp_servers=[DOCS],
        interceptors=[Shout()],
        tool_loop=LOOP,
        retry=RETRY,
        budget=BUDGET,
        model="m-2",
        harness=[],
        max_history_messages=4,
        prompt_cache=PromptCache.CONSERVATIVE,
        permission_mode=PermissionMode.DENY_ALL,
        runtime="pydantic-ai",
    )
    class Boss:
        """Runs the fleet."""

    assert declared(spec_of(Boss)) == {
        "name": "boss",
        "prompt_method": None,
        "kind": "coordinator",
        "path": "/atmosphere/agent/boss",
        "system_prompt": "Delegate.",
        "description": "Runs the fleet.",
        "tools": (lookup,),
        "mcp_servers": (DOCS,),
        "fleet": ("member", "other"),
        "remotes": (REMOTE,),
        "interceptors": [Shout],
        "tool_loop": LOOP,
        "retry": RETRY,
        "budget": BUDGET,
        "response_format": None,
        "structured_output_retries": 0,
        "model": "m-2",
        "harness": (),
        "headless": False,
        "max_history_messages": 4,
        "conversation_memory": False,
        "prompt_cache": PromptCache.CONSERVATIVE,
        "permission_mode": PermissionMode.DENY_ALL,
        "runtime": "pydantic-ai",
        "native": None,
    }


def test_ai_endpoint_hands_every_keyword_to_its_spec() -> None:
    @ai_endpoint(
        path="/api/ask",
        system_prompt="Answer.",
        description="Asks.",
        tools=[lookup],
        mcp_servers=[DOCS],
        interceptors=[Shout],
        tool_loop=LOOP,
        retry=RETRY,
        budget=BUDGET,
        response_format=Answer,
        structured_output_retries=1,
        model="m-3",
        harness=[Harness.ALL],
        conversation_memory=True,
        max_history_messages=6,
        prompt_cache="none",
        permission_mode="accept_edits",
        runtime="openai-agents",
    )
    class Ask: ...

    assert declared(spec_of(Ask)) == {
        "name": "ask",
        "prompt_method": None,
        "kind": "ai_endpoint",
        "path": "/api/ask",
        "system_prompt": "Answer.",
        "description": "Asks.",
        "tools": (lookup,),
        "mcp_servers": (DOCS,),
        "fleet": (),
        "remotes": (),
        "interceptors": [Shout],
        "tool_loop": LOOP,
        "retry": RETRY,
        "budget": BUDGET,
        "response_format": Answer,
        "structured_output_retries": 1,
        "model": "m-3",
        "harness": (Harness.ALL,),
        "headless": False,
        "max_history_messages": 6,
        "conversation_memory": True,
        "prompt_cache": PromptCache.NONE,
        "permission_mode": PermissionMode.ACCEPT_EDITS,
        "runtime": "openai-agents",
        "native": None,
    }


def test_the_options_are_frozen() -> None:
    options = AgentOptions(model="m")
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.model = "other"  # type: ignore[misc]
