"""The SDK's two surfaces, pinned: what users import, and what hosts share.

A name added to (or dropped from) either surface fails here, so every change to what users
depend on is deliberate (as httpx's `tests/test_exported_members.py` does).
"""

from __future__ import annotations

import types

import atmosphere.sdk
import atmosphere.sdk.host

USER_SURFACE = [
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

HOST_SURFACE = [
    "APPROVED_ARGUMENT",
    "DEFAULT_TOOL_TIMEOUT",
    "MCP_SEPARATOR",
    "RETRY_SUFFIX",
    "AgentSpec",
    "AiCapability",
    "BudgetReason",
    "EventSink",
    "HarnessSwitch",
    "SessionHost",
    "ToolArgumentsError",
    "ToolSignal",
    "load_app",
    "mcp_governed_name",
    "mcp_server_of",
    "mcp_tool_name",
    "render_result",
    "spec_of",
]


def public_names(module: types.ModuleType) -> list[str]:
    """Every public name the module binds, submodules aside (they are imported, not exported)."""
    return sorted(
        name
        for name, value in vars(module).items()
        if not name.startswith("_") and name != "annotations" and not isinstance(value, types.ModuleType)
    )


def test_the_user_surface_is_exactly_this() -> None:
    assert sorted(atmosphere.sdk.__all__) == USER_SURFACE


def test_the_user_module_binds_nothing_it_does_not_export() -> None:
    assert public_names(atmosphere.sdk) == USER_SURFACE


def test_the_host_surface_is_exactly_this() -> None:
    assert sorted(atmosphere.sdk.host.__all__) == sorted(HOST_SURFACE)
    assert public_names(atmosphere.sdk.host) == sorted(HOST_SURFACE)


def test_the_surfaces_do_not_overlap() -> None:
    assert not set(USER_SURFACE) & set(HOST_SURFACE)


def test_every_exported_name_resolves() -> None:
    for name in USER_SURFACE:
        assert getattr(atmosphere.sdk, name) is not None
    for name in HOST_SURFACE:
        assert getattr(atmosphere.sdk.host, name) is not None
