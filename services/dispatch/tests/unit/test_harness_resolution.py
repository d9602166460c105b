"""What the harness attaches to each agent, and the runtime-state map it reports (reference §1)."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from atmosphere.dispatch.harness import (
    AgentHarness,
    HarnessConfig,
    SurfaceMode,
    resolve_agent,
    resolve_app,
    runtime_state,
    subagent_harness,
    workspace_category,
)
from atmosphere.dispatch.settings import DispatchSettings, LlmSettings
from atmosphere.sdk import App, Harness, PromptCache, agent, ai_endpoint, coordinator, prompt, tool
from atmosphere.sdk.compaction import parse_strategy
from atmosphere.sdk.host import AgentSpec, AiCapability, HarnessSwitch, spec_of

FILE_TOOLS = ["ls", "read_file", "write_file", "edit_file", "glob", "grep", "delete", "rename"]
"""The reference's registration order."""
STATE_KEYS = {
    "conversation-memory",
    "long-term-memory",
    "prompt-cache-default",
    "compaction",
    "planning",
    "filesystem",
    "skills",
    "durable-runs",
    "delegation",
}

UNSET = HarnessConfig()
ON = HarnessConfig(switch=HarnessSwitch(enabled=True))
KILL = HarnessConfig(switch=HarnessSwitch(enabled=False))


def user_tool(name: str) -> Any:
    def impl(text: str) -> str:
        """A user tool that happens to share a built-in's name."""
        return text

    return tool(name=name)(impl)


def make_agent(name: str = "helper", **options: Any) -> AgentSpec:
    cls = type(name.capitalize(), (), {})
    return spec_of(agent(name=name, **options)(cls))


def make_coordinator(name: str = "boss", **options: Any) -> AgentSpec:
    member = make_agent(f"{name}-member")
    cls = type(name.capitalize(), (), {})
    return spec_of(coordinator(name=name, fleet=[member.name], **options)(cls))


def make_endpoint(path: str = "/api/chat", **options: Any) -> AgentSpec:
    cls = type("Endpoint", (), {})
    return spec_of(ai_endpoint(path=path, **options)(cls))


def make_headless(name: str = "cron") -> AgentSpec:
    cls = type(name.capitalize(), (), {})
    return spec_of(agent(name=name, headless=True)(cls))


# -- the plain agent -----------------------------------------------------------------------------


def test_a_plain_agent_gets_the_plan_and_the_eight_file_tools() -> None:
    harness = resolve_agent(make_agent(), UNSET)
    assert list(harness.tools) == ["write_todos", *FILE_TOOLS]
    assert harness.planning == "ACTIVE(builtin)"
    assert harness.filesystem == "ACTIVE(builtin)"
    assert harness.delegation == ""
    assert "delegate_task" not in harness.tools
    assert "task" not in harness.tools
    assert harness.conversation_memory
    assert harness.long_term_memory
    assert harness.prompt_cache is PromptCache.CONSERVATIVE
    assert (harness.category, harness.owner) == ("agents", "helper")
    assert harness.has_files
    assert harness.attached() == ["memory", "cache", "planning", "filesystem"]


def test_the_workspace_scope_names_category_owner_agent_and_conversation() -> None:
    scope = resolve_agent(make_agent("writer"), UNSET).scope("writer", "c1")
    assert (scope.category, scope.owner, scope.agent_id, scope.conversation_id) == ("agents", "writer", "writer", "c1")
    endpoint = resolve_agent(make_endpoint("/api/chat", harness=[Harness.ALL]), UNSET)
    assert (endpoint.category, endpoint.owner) == ("endpoints", "/api/chat")  # memory sanitizes it


def test_a_user_write_todos_wins_over_the_builtin() -> None:
    harness = resolve_agent(make_agent(tools=[user_tool("write_todos")]), UNSET)
    assert harness.planning == "ACTIVE(user-tool)"
    assert "write_todos" not in harness.tools
    assert list(harness.tools) == FILE_TOOLS
    # The browsable plan surface did not attach: the user's tool keeps its own state.
    assert "planning" not in harness.attached()


def test_some_file_tool_names_claimed_by_user_tools_leave_a_partial_builtin() -> None:
    harness = resolve_agent(make_agent(tools=[user_tool("read_file"), user_tool("grep")]), UNSET)
    assert harness.filesystem == "ACTIVE(builtin,partial)"
    assert [name for name in harness.tools if name != "write_todos"] == [
        "ls",
        "write_file",
        "edit_file",
        "glob",
        "delete",
        "rename",
    ]
    assert harness.has_files  # write_file is still the builtin


def test_all_eight_file_tool_names_claimed_means_user_tool_and_no_builtin_file_tools() -> None:
    harness = resolve_agent(make_agent(tools=[user_tool(name) for name in FILE_TOOLS]), UNSET)
    assert harness.filesystem == "ACTIVE(user-tool)"
    assert list(harness.tools) == ["write_todos"]
    assert not harness.has_files
    assert "filesystem" not in harness.attached()


# -- planning / filesystem modes -----------------------------------------------------------------


def test_native_planning_without_the_runtime_capability_is_inactive_and_registers_nothing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    config = HarnessConfig(planning=SurfaceMode.parse("native"))
    with caplog.at_level(logging.WARNING, "atmosphere.dispatch"):
        harness = resolve_agent(
            make_agent(),
            config,
            runtime_name="built-in",
            runtime_capabilities=frozenset({AiCapability.TOOL_CALLING, AiCapability.VIRTUAL_FILESYSTEM}),
        )
    assert harness.planning == "INACTIVE(native-unavailable)"
    assert "write_todos" not in harness.tools
    assert harness.filesystem == "ACTIVE(native:built-in)"  # auto + the capability
    assert harness.tools == {}
    assert list(harness.store_tools) == FILE_TOOLS  # the native file surface's store, not the plan's
    assert "PLANNING" in caplog.text
    state = runtime_state(config, {"helper": harness})
    assert state["planning"] == "INACTIVE(native-unavailable)"


@pytest.mark.parametrize(
    ("capability", "native_key", "builtin_names"),
    [
        (AiCapability.PLANNING, "planning", FILE_TOOLS),
        (AiCapability.VIRTUAL_FILESYSTEM, "filesystem", ["write_todos"]),
    ],
)
def test_auto_picks_the_native_surface_when_the_runtime_declares_it(
    capability: AiCapability, native_key: str, builtin_names: list[str]
) -> None:
    harness = resolve_agent(make_agent(), UNSET, runtime_name="deep", runtime_capabilities=frozenset({capability}))
    assert getattr(harness, native_key) == "ACTIVE(native:deep)"
    other = "filesystem" if native_key == "planning" else "planning"
    assert getattr(harness, other) == "ACTIVE(builtin)"
    # Never both surfaces: the native one offers the model no builtin tool; it keeps them as the
    # store its runtime writes through (the platform's record of the plan or the files).
    assert list(harness.tools) == builtin_names
    native_names = ["write_todos"] if capability is AiCapability.PLANNING else FILE_TOOLS
    assert list(harness.store_tools) == native_names
    assert harness.workspace_tools  # a workspace is in scope: the store is memory's
    assert native_key in harness.attached()


def test_builtin_mode_keeps_the_builtin_tools_on_a_native_capable_runtime() -> None:
    config = HarnessConfig(planning=SurfaceMode.parse("built-in"), filesystem=SurfaceMode.parse("BUILTIN"))
    both = frozenset({AiCapability.PLANNING, AiCapability.VIRTUAL_FILESYSTEM})
    harness = resolve_agent(make_agent(), config, runtime_name="deep", runtime_capabilities=both)
    assert (harness.planning, harness.filesystem) == ("ACTIVE(builtin)", "ACTIVE(builtin)")
    assert list(harness.tools) == ["write_todos", *FILE_TOOLS]
    native = resolve_agent(
        make_agent(), HarnessConfig(planning=SurfaceMode.NATIVE), runtime_name="deep", runtime_capabilities=both
    )
    assert native.planning == "ACTIVE(native:deep)"
    assert "write_todos" not in native.tools


@pytest.mark.parametrize(
    ("text", "mode"),
    [
        ("auto", SurfaceMode.AUTO),
        ("builtin", SurfaceMode.BUILTIN),
        ("built-in", SurfaceMode.BUILTIN),
        (" Built-In ", SurfaceMode.BUILTIN),
        ("native", SurfaceMode.NATIVE),
        ("NATIVE\n", SurfaceMode.NATIVE),
        ("", SurfaceMode.AUTO),
        ("nativ", SurfaceMode.AUTO),
        ("off", SurfaceMode.AUTO),
    ],
)
def test_surface_mode_parsing_is_lenient(text: str, mode: SurfaceMode) -> None:
    assert SurfaceMode.parse(text) is mode


@pytest.mark.parametrize(
    ("text", "strategy"),
    [
        ("sliding-window", "sliding-window"),
        (" Summarizing ", "summarizing"),
        ("TOKEN-WINDOW", "token-window"),
        ("", "sliding-window"),
        ("fancy", "sliding-window"),
    ],
)
def test_compaction_parsing(text: str, strategy: str) -> None:
    assert parse_strategy(text) == strategy
    assert DispatchSettings(ai_harness_compaction=text).ai_harness_compaction == strategy


def test_compaction_accepts_underscores_as_the_sdk_does() -> None:
    # The SDK's one parser: `token_window` names the token window (dispatch's own used to fall back).
    assert DispatchSettings(ai_harness_compaction="token_window").ai_harness_compaction == "token-window"


@pytest.mark.parametrize(("text", "value"), [("12000", 12000), (" 500 ", 500), ("", 8000), ("lots", 8000)])
def test_offload_threshold_parsing(text: str, value: int) -> None:
    assert LlmSettings(tool_output_offload_threshold=text).tool_output_offload_threshold == value


def test_a_malformed_offload_threshold_is_logged_and_replaced_by_the_default(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="atmosphere.dispatch"):
        assert LlmSettings(tool_output_offload_threshold="lots").tool_output_offload_threshold == 8000
    assert "malformed tool-output offload threshold 'lots': using 8000" in caplog.text


@pytest.mark.parametrize(("text", "mode"), [(" Built-In ", SurfaceMode.BUILTIN), ("nativ", SurfaceMode.AUTO)])
def test_surface_settings_are_read_leniently(text: str, mode: SurfaceMode) -> None:
    llm = LlmSettings(planning=text, filesystem=text)
    assert (llm.planning, llm.filesystem) == (mode, mode)


def test_harness_switch_settings_are_typed() -> None:
    settings = DispatchSettings(
        ai_harness_enabled="TRUE", ai_harness_exclude_paths=" /a , ,/b,", ai_harness_prompt_cache_default=" Aggressive "
    )
    assert settings.ai_harness_enabled is True
    assert settings.ai_harness_exclude_paths == frozenset({"/a", "/b"})
    assert settings.ai_harness_prompt_cache_default is PromptCache.AGGRESSIVE
    assert DispatchSettings(ai_harness_enabled="no").ai_harness_enabled is False  # anything else: the kill switch
    assert DispatchSettings().ai_harness_enabled is None


def test_an_unknown_prompt_cache_default_is_an_invalid_setting() -> None:
    with pytest.raises(ValueError, match="prompt-cache default must be none, conservative or aggressive"):
        DispatchSettings(ai_harness_prompt_cache_default="always")


# -- delegation ------------------------------------------------------------------------------------


def test_a_coordinator_gets_delegate_task_and_task() -> None:
    harness = resolve_agent(make_coordinator(), UNSET)
    assert {"delegate_task", "task"} <= harness.tools.keys()
    assert harness.delegation == "ACTIVE"
    assert harness.category == "coordinators"
    assert harness.attached() == ["memory", "cache", "delegation", "planning", "filesystem"]
    state = runtime_state(UNSET, {"boss": harness})
    assert state["delegation"] == "ACTIVE"


def test_delegation_means_nothing_on_a_plain_agent_even_when_declared() -> None:
    harness = resolve_agent(make_agent(harness=[Harness.DELEGATION]), ON)
    assert harness.delegation == ""
    assert harness.tools == {}
    assert harness.attached() == []


def test_a_user_delegate_task_wins_and_task_still_registers() -> None:
    harness = resolve_agent(make_coordinator(tools=[user_tool("delegate_task")]), UNSET)
    assert harness.delegation == "ACTIVE(user-tool)"
    assert "delegate_task" not in harness.tools
    assert "task" in harness.tools
    both = resolve_agent(make_coordinator("chief", tools=[user_tool("delegate_task"), user_tool("task")]), UNSET)
    assert not {"delegate_task", "task"} & both.tools.keys()


# -- prompt cache ----------------------------------------------------------------------------------


def test_cache_seeds_conservative_only_when_the_declaration_says_none() -> None:
    assert resolve_agent(make_agent(), UNSET).prompt_cache is PromptCache.CONSERVATIVE
    explicit = resolve_agent(make_agent(prompt_cache="aggressive"), UNSET)
    assert explicit.prompt_cache is PromptCache.AGGRESSIVE
    # Without the CACHE feature nothing is seeded.
    bare = resolve_agent(make_agent(harness=[Harness.MEMORY]), UNSET)
    assert bare.prompt_cache is PromptCache.NONE
    assert "cache" not in bare.attached()


@pytest.mark.parametrize("default", [PromptCache.AGGRESSIVE, PromptCache.NONE])
def test_cache_seeds_the_configured_default(default: PromptCache) -> None:
    config = HarnessConfig(prompt_cache_default=default)
    harness = resolve_agent(make_agent(), config)
    assert harness.prompt_cache is default
    assert ("cache" in harness.attached()) is (default is not PromptCache.NONE)
    assert resolve_agent(make_agent(prompt_cache="conservative"), config).prompt_cache is PromptCache.CONSERVATIVE
    assert runtime_state(config, {"helper": harness})["prompt-cache-default"] == default.value


def test_an_explicit_agent_policy_is_not_reported_as_the_app_default() -> None:
    # `prompt-cache-default` is the policy a NONE declaration gets; an agent that chose its own
    # policy seeds nothing, so it must not overwrite the reported default (runtime truth).
    agents = {"pinned": resolve_agent(make_agent("pinned", prompt_cache="aggressive"), UNSET)}
    assert runtime_state(UNSET, agents)["prompt-cache-default"] == "none"
    agents["seeded"] = resolve_agent(make_agent("seeded"), UNSET)
    agents["pinned2"] = resolve_agent(make_agent("pinned2", prompt_cache="aggressive"), UNSET)
    assert runtime_state(UNSET, agents)["prompt-cache-default"] == "conservative"


# -- the app-wide switch and the runtime-state seeds -----------------------------------------------


def _app() -> App:
    @agent(name="writer")
    class Writer:
        @prompt
        async def on(self, message: str, session: Any) -> None:
            await session.send(message)

    @coordinator(name="lead", fleet=[Writer])
    class Lead:
        pass

    @ai_endpoint(path="/api/bare")
    class Bare:
        pass

    return App([Writer, Lead, Bare])


def test_the_kill_switch_attaches_nothing_and_reports_the_disabled_seeds() -> None:
    harnesses = resolve_app(_app(), KILL, runtime_name="deep", runtime_capabilities=frozenset(AiCapability))
    assert set(harnesses) == {"writer", "lead", "bare"}
    for harness in harnesses.values():
        assert harness.features == frozenset()
        assert harness.tools == {}
        assert not harness.conversation_memory
        assert not harness.long_term_memory
        assert harness.prompt_cache is PromptCache.NONE
        assert (harness.planning, harness.filesystem, harness.delegation) == ("", "", "")
        assert harness.attached() == []
    assert runtime_state(KILL, harnesses) == {
        "conversation-memory": "INACTIVE(disabled)",
        "long-term-memory": "INACTIVE(disabled)",
        "prompt-cache-default": "none",
        "compaction": "sliding-window",
        "planning": "INACTIVE(disabled)",
        "filesystem": "INACTIVE(disabled)",
        "skills": "CONVENTION",
        "durable-runs": "INACTIVE(disabled)",
        "delegation": "INACTIVE(disabled)",
    }


def test_seeds_differ_for_app_wide_true_unset_and_kill_switch() -> None:
    assert runtime_state(ON, {}) == {
        "conversation-memory": "INACTIVE(no-endpoint)",
        "long-term-memory": "INACTIVE(no-endpoint)",
        "prompt-cache-default": "conservative",
        "compaction": "sliding-window",
        "planning": "INACTIVE(no-endpoint)",
        "filesystem": "INACTIVE(no-endpoint)",
        "skills": "CONVENTION",
        "durable-runs": "INACTIVE(disabled)",
        "delegation": "INACTIVE(no-coordinator)",
    }
    unset = runtime_state(UNSET, {})
    assert unset == runtime_state(KILL, {})
    assert set(unset) == STATE_KEYS
    assert {unset[k] for k in ("conversation-memory", "long-term-memory", "planning", "filesystem", "delegation")} == {
        "INACTIVE(disabled)"
    }
    assert unset["prompt-cache-default"] == "none"
    # The configured default and the compaction strategy show through whatever the switch says.
    configured = HarnessConfig(
        switch=HarnessSwitch(enabled=False), prompt_cache_default=PromptCache.AGGRESSIVE, compaction="summarizing"
    )
    assert runtime_state(configured, {})["prompt-cache-default"] == "aggressive"
    assert runtime_state(configured, {})["compaction"] == "summarizing"


def test_an_unset_switch_upgrades_only_what_attached() -> None:
    harnesses = resolve_app(_app(), UNSET)
    assert harnesses["bare"] == AgentHarness(
        category="endpoints", owner="/api/bare", max_history_messages=20
    )  # bare by default
    state = runtime_state(UNSET, harnesses)
    assert set(state) == STATE_KEYS
    assert state["conversation-memory"] == "ACTIVE"
    assert state["long-term-memory"].startswith("ACTIVE(")
    assert state["prompt-cache-default"] == "conservative"
    assert state["planning"] == "ACTIVE(builtin)"
    assert state["filesystem"] == "ACTIVE(builtin)"
    assert state["delegation"] == "ACTIVE"
    assert (state["skills"], state["durable-runs"]) == ("CONVENTION", "INACTIVE(disabled)")


def test_an_ai_endpoint_is_bare_by_default_and_full_under_app_wide_true() -> None:
    bare = resolve_agent(make_endpoint(), UNSET)
    assert bare.features == frozenset()
    assert bare.tools == {}
    assert not bare.conversation_memory
    assert bare.attached() == []
    full = resolve_agent(make_endpoint(), ON)
    assert full.features == Harness.expand([Harness.ALL])
    assert list(full.tools) == ["write_todos", *FILE_TOOLS]  # no delegation: not a coordinator
    assert full.conversation_memory
    assert full.long_term_memory
    assert full.prompt_cache is PromptCache.CONSERVATIVE
    assert full.attached() == ["memory", "cache", "planning", "filesystem"]
    state = runtime_state(ON, {"chat": full})
    assert state["delegation"] == "INACTIVE(no-coordinator)"
    assert state["planning"] == "ACTIVE(builtin)"


def test_an_agent_opting_down_stays_bare_even_under_app_wide_true() -> None:
    assert resolve_agent(make_agent(harness=[]), ON).features == frozenset()
    assert resolve_agent(make_agent(harness=[Harness.PLANNING]), ON).tools.keys() == {"write_todos"}


def test_an_excluded_path_gets_nothing() -> None:
    config = HarnessConfig(switch=HarnessSwitch(enabled=True, exclude_paths=frozenset({"/api/chat"})))
    assert resolve_agent(make_endpoint("/api/chat"), config).features == frozenset()
    assert resolve_agent(make_endpoint("/api/other"), config).features == Harness.expand([Harness.ALL])


def test_endpoint_conversation_memory_wins_even_under_the_kill_switch() -> None:
    harness = resolve_agent(make_endpoint(conversation_memory=True), KILL)
    assert harness.conversation_memory
    assert not harness.long_term_memory
    assert harness.tools == {}
    assert harness.attached() == ["memory"]
    # Only an endpoint has that switch: a plain agent under the kill switch keeps nothing.
    assert not resolve_agent(make_agent(), KILL).conversation_memory


def test_a_headless_agent_gets_nothing(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, "atmosphere.dispatch"):
        harness = resolve_agent(make_headless(), ON)
    assert harness.features == frozenset()
    assert harness.tools == {}
    assert not harness.conversation_memory
    assert harness.prompt_cache is PromptCache.NONE
    assert harness.attached() == []
    assert "headless" in caplog.text
    assert runtime_state(UNSET, {"cron": harness}) == runtime_state(UNSET, {})


def test_the_subagent_harness_has_only_its_plan_and_files() -> None:
    harness = subagent_harness()
    assert list(harness.tools) == ["write_todos", *FILE_TOOLS]
    assert harness.category == "subagents"
    assert not harness.conversation_memory
    assert not harness.long_term_memory
    assert harness.delegation == ""
    assert harness.attached() == ["planning", "filesystem"]


# -- owners and categories -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kind", "category"),
    [("agent", "agents"), ("coordinator", "coordinators"), ("ai_endpoint", "endpoints"), ("other", "agents")],
)
def test_workspace_category(kind: str, category: str) -> None:
    assert workspace_category(kind) == category
