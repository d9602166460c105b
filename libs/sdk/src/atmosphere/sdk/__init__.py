"""What Atmosphere users import to write agents."""

from atmosphere.sdk._agent import AgentSpec, agent, ai_endpoint, coordinator, prompt, spec_of
from atmosphere.sdk._app import App, load_app
from atmosphere.sdk._capability import AiCapability
from atmosphere.sdk._harness import Harness, HarnessSwitch, PromptCache
from atmosphere.sdk._policies import AiBudget, BudgetReason, OnMaxIterations, RetryPolicy, ToolLoopPolicy
from atmosphere.sdk._request import AiInterceptor, AiRequest, CacheHint, ChatMessage
from atmosphere.sdk._session import EventSink, Streamer, StreamingSession, TokenUsage
from atmosphere.sdk._tool import DEFAULT_TOOL_TIMEOUT, Tool, ToolArgumentsError, ToolKind, render_result, tool
from atmosphere.sdk.errors import SdkError, UserError

__all__ = [
    "DEFAULT_TOOL_TIMEOUT",
    "AgentSpec",
    "AiBudget",
    "AiCapability",
    "AiInterceptor",
    "AiRequest",
    "App",
    "BudgetReason",
    "CacheHint",
    "ChatMessage",
    "EventSink",
    "Harness",
    "HarnessSwitch",
    "OnMaxIterations",
    "PromptCache",
    "RetryPolicy",
    "SdkError",
    "Streamer",
    "StreamingSession",
    "TokenUsage",
    "Tool",
    "ToolArgumentsError",
    "ToolKind",
    "ToolLoopPolicy",
    "UserError",
    "agent",
    "ai_endpoint",
    "coordinator",
    "load_app",
    "prompt",
    "render_result",
    "spec_of",
    "tool",
]
