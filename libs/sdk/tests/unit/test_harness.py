"""Harness selection: every row of the precedence table, the tri-state flag, the declarations."""

from __future__ import annotations

import pytest

from atmosphere.sdk import Harness, PromptCache, UserError, agent, ai_endpoint, coordinator
from atmosphere.sdk.host import HarnessSwitch, spec_of

ALL = frozenset({Harness.MEMORY, Harness.CACHE, Harness.DELEGATION, Harness.PLANNING, Harness.FILESYSTEM})
NONE: frozenset[Harness] = frozenset()
PATH = "/atmosphere/agent/a"


@pytest.mark.parametrize(
    ("enabled", "excluded", "declared", "kind", "expected"),
    [
        # 1. The kill switch beats everything, including an explicit declaration.
        (False, (), (Harness.ALL,), "agent", NONE),
        (False, (), (Harness.MEMORY,), "coordinator", NONE),
        (False, (), (), "ai_endpoint", NONE),
        # 2. An excluded path beats the declaration (only the kill switch is stronger).
        (None, (PATH,), (Harness.ALL,), "agent", NONE),
        (True, (PATH,), (), "ai_endpoint", NONE),
        # 3. A non-empty declaration resolves by expansion, whatever the flag.
        (None, (), (Harness.ALL,), "agent", ALL),
        (True, (), (Harness.ALL,), "coordinator", ALL),
        (None, (), (Harness.MEMORY, Harness.PLANNING), "agent", {Harness.MEMORY, Harness.PLANNING}),
        (None, (), (Harness.CACHE,), "ai_endpoint", {Harness.CACHE}),
        (None, (), (Harness.ALL, Harness.MEMORY), "agent", ALL),
        # 4. App-wide true upgrades a bare @ai_endpoint, not an explicit empty @agent/@coordinator.
        (True, (), (), "ai_endpoint", ALL),
        (True, (), (), "agent", NONE),
        (True, (), (), "coordinator", NONE),
        # 5. Unset: an empty declaration stays bare.
        (None, (), (), "ai_endpoint", NONE),
        (None, (), (), "agent", NONE),
        # An exclusion elsewhere does not touch this path.
        (None, ("/atmosphere/agent/other",), (Harness.ALL,), "agent", ALL),
    ],
)
def test_precedence(
    enabled: bool | None, excluded: tuple[str, ...], declared: tuple[Harness, ...], kind: str, expected: set[Harness]
) -> None:
    switch = HarnessSwitch(enabled=enabled, exclude_paths=frozenset(excluded))
    assert switch.features_for(PATH, declared, kind=kind) == frozenset(expected)


def test_no_path_means_no_harness() -> None:
    assert HarnessSwitch(enabled=True).features_for(None, (Harness.ALL,), kind="agent") == NONE


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (None, None),
        ("", None),
        ("  ", None),
        ("true", True),
        ("TRUE", True),
        (" True ", True),
        ("false", False),
        ("yes", False),
        ("1", False),
        ("on", False),
    ],
)
def test_only_a_literal_true_is_on_and_anything_else_is_the_kill_switch(
    text: str | None, expected: bool | None
) -> None:
    assert HarnessSwitch.parse_enabled(text) is expected


def test_exclude_paths_and_expansion() -> None:
    assert HarnessSwitch.parse_paths(" /a , ,/b,") == frozenset({"/a", "/b"})
    assert Harness.expand([Harness.ALL]) == ALL
    assert Harness.ALL not in Harness.expand([Harness.ALL])
    assert Harness.expand(None) == NONE


def test_declaration_defaults() -> None:
    @agent(name="a")
    class A: ...

    @coordinator(name="c", fleet=[A])
    class C: ...

    @ai_endpoint(path="/x/e")
    class E: ...

    @agent(name="bare", harness=[])
    class Bare: ...

    assert spec_of(A).harness == (Harness.ALL,)
    assert spec_of(C).harness == (Harness.ALL,)
    assert spec_of(E).harness == ()
    assert spec_of(E).conversation_memory is False
    assert spec_of(Bare).harness == ()
    assert spec_of(A).max_history_messages == 20
    assert spec_of(A).prompt_cache is PromptCache.NONE


def test_misuse_is_refused_at_declaration() -> None:
    with pytest.raises(UserError, match="harness must be a list"):
        agent(name="x", harness=Harness.ALL)(type("X", (), {}))  # type: ignore[arg-type]
    with pytest.raises(UserError, match="max_history_messages"):
        agent(name="y", max_history_messages=1)(type("Y", (), {}))
    with pytest.raises(UserError, match="prompt_cache"):
        agent(name="z", prompt_cache="sometimes")(type("Z", (), {}))
    assert PromptCache.parse(" Aggressive ") is PromptCache.AGGRESSIVE
    assert PromptCache.parse("") is None
    with pytest.raises(ValueError, match="none, conservative or aggressive"):
        PromptCache.parse("always")
