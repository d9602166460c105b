"""What Atmosphere users import to write agents.

    from atmosphere.sdk import App, StreamingSession, agent, prompt, tool

Declarations (`agent`, `coordinator`, `ai_endpoint`, `prompt`, `tool`; a coordinator's
`RemoteAgent` fleet members), the `App` that lists them, the `StreamingSession` a prompt answers
through, the harness, policy and permission knobs, the interceptor API, and the exceptions a tool
raises to steer its call. This surface is pinned
(`tests/unit/test_exported_members.py`); what the platform's services share lives in
`atmosphere.sdk.host`; an agent's tests run it on the services with `atmosphere.testing`
(the `atmosphere-ai-testing` distribution).
"""

from atmosphere.sdk._agent import agent, ai_endpoint, coordinator, prompt
from atmosphere.sdk._app import App
from atmosphere.sdk._harness import Harness, PromptCache
from atmosphere.sdk._hosted import hosted_agent
from atmosphere.sdk._mcp import McpServer
from atmosphere.sdk._permission import PermissionMode
from atmosphere.sdk._policies import AiBudget, OnMaxIterations, RetryPolicy, ToolLoopPolicy
from atmosphere.sdk._remote import RemoteAgent
from atmosphere.sdk._request import AiInterceptor, AiRequest, CacheHint, ChatMessage, MessageToolCall
from atmosphere.sdk._session import StreamingSession, TokenUsage
from atmosphere.sdk._tool import Tool, ToolKind, tool, tool_call_approved
from atmosphere.sdk.errors import ApprovalRequired, ModelRetry, SdkError, ToolError, UserError
from atmosphere.sdk.lifecycle import AgentLifecycleListener, ModelCall

__all__ = [
    "AgentLifecycleListener",
    "AiBudget",
    "AiInterceptor",
    "AiRequest",
    "App",
    "ApprovalRequired",
    "CacheHint",
    "ChatMessage",
    "Harness",
    "McpServer",
    "MessageToolCall",
    "ModelCall",
    "ModelRetry",
    "OnMaxIterations",
    "PermissionMode",
    "PromptCache",
    "RemoteAgent",
    "RetryPolicy",
    "SdkError",
    "StreamingSession",
    "TokenUsage",
    "Tool",
    "ToolError",
    "ToolKind",
    "ToolLoopPolicy",
    "UserError",
    "agent",
    "ai_endpoint",
    "coordinator",
    "hosted_agent",
    "prompt",
    "tool",
    "tool_call_approved",
]
