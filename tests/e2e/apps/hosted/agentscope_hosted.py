"""An AgentScope `Agent` with its own model (AgentScope requires one), pointed at the test's provider."""

from __future__ import annotations

import os

from agentscope.agent import Agent, InjectionConfig
from agentscope.credential import OpenAICredential
from agentscope.message import TextBlock
from agentscope.model import OpenAIChatModel
from agentscope.permission import PermissionBehavior, PermissionDecision
from agentscope.tool import FunctionTool, ToolBase, ToolChunk, Toolkit
from pydantic import SecretStr

from tests.e2e.apps.adapters_app import native_forbidden_text, native_lookup_text, native_transfer_text


def _chunk(text: str) -> ToolChunk:
    return ToolChunk(content=[TextBlock(text=text)])  # AgentScope 2 types a function tool's result


def native_lookup(city: str) -> ToolChunk:
    """Current weather for a city, the framework's own way.

    Args:
        city: The city's name.
    """
    return _chunk(native_lookup_text(city))


def native_forbidden(target: str) -> ToolChunk:
    """Something the policy never lets run.

    Args:
        target: What it would act on.
    """
    return _chunk(native_forbidden_text(target))


def native_transfer(amount: int) -> ToolChunk:
    """Move money (the operator's tool permissions make a human confirm it).

    Args:
        amount: How much.
    """
    return _chunk(native_transfer_text(amount))


# AgentScope would ask a user to confirm each custom tool; allowed here: the platform's policy decides.
_allowed = PermissionDecision(behavior=PermissionBehavior.ALLOW, message="the platform gates it")
_tools: list[ToolBase] = [
    FunctionTool(native_lookup, name="native_lookup", permission=_allowed),
    FunctionTool(native_forbidden, name="native_forbidden", permission=_allowed),
    FunctionTool(native_transfer, name="native_transfer", permission=_allowed),
]
_model = OpenAIChatModel(
    credential=OpenAICredential(
        api_key=SecretStr("user-key"), base_url=os.environ.get("LLM_BASE_URL") or "http://127.0.0.1:9/v1"
    ),
    model="fake-model",
    max_retries=0,
)
hosted = Agent(
    name="agentscope",
    system_prompt="You answer briefly.",
    model=_model,
    toolkit=Toolkit(tools=_tools),
    injection_config=InjectionConfig(inject_runtime_state=False),  # no time hints in the scripted requests
)
