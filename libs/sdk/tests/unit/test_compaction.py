import logging

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from atmosphere.contracts.memory.v1.memory_pb2 import ChatMessage
from atmosphere.sdk import ChatMessage as Message
from atmosphere.sdk.compaction import (
    DEFAULT_WINDOW,
    LOCAL_SUMMARY_MAX_CHARS,
    MODEL_WINDOWS,
    SUMMARY_SYSTEM_PROMPT,
    SummaryPlan,
    apply_summary,
    compact,
    estimate_tokens,
    history_digest,
    local_summary,
    model_window,
    parse_strategy,
    sliding_window,
    split_for_summary,
    summary_header,
    summary_of,
    summary_prompt,
    token_window,
    token_window_keep,
)

SYS = Message("system", "You are helpful.")


def conversation(turns: int, *, size: int = 10) -> list[Message]:
    messages: list[Message] = []
    for i in range(turns):
        messages.append(Message("user", f"u{i}".ljust(size, ".")))
        messages.append(Message("assistant", f"a{i}".ljust(size, ".")))
    return messages


# --- strategy names -------------------------------------------------------------------------


def test_parse_strategy_names() -> None:
    assert parse_strategy("sliding-window") == "sliding-window"
    assert parse_strategy("summarizing") == "summarizing"
    assert parse_strategy("token-window") == "token-window"
    assert parse_strategy(" Token_Window ") == "token-window"
    assert parse_strategy(None) == "sliding-window"
    assert parse_strategy("") == "sliding-window"


def test_parse_strategy_unknown_warns_once(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="atmosphere.sdk.compaction"):
        assert parse_strategy("fancy-rag-compaction") == "sliding-window"
        assert parse_strategy("fancy-rag-compaction") == "sliding-window"
    warnings = [r for r in caplog.records if "fancy-rag-compaction" in r.getMessage()]
    assert len(warnings) == 1
    assert warnings[0].levelno == logging.WARNING


def test_message_rejects_unknown_roles() -> None:
    with pytest.raises(ValueError, match="unknown message role"):
        Message("robot", "hi")
    assert Message("tool", "result").role == "tool"


# --- sliding window -------------------------------------------------------------------------


def test_sliding_window_drops_oldest_non_system_first() -> None:
    messages = [SYS, *conversation(3)]
    kept = sliding_window(messages, 4)
    assert kept == [SYS, *messages[-3:]]


def test_sliding_window_within_bounds_is_unchanged_copy() -> None:
    messages = [SYS, *conversation(2)]
    kept = sliding_window(messages, 5)
    assert kept == messages
    assert kept is not messages


def test_sliding_window_only_system_messages_drops_oldest() -> None:
    s1, s2, s3 = (Message("system", f"s{i}") for i in range(1, 4))
    assert sliding_window([s1, s2, s3], 2) == [s2, s3]
    # Non-system messages go first, then the oldest system message.
    assert sliding_window([s1, Message("user", "u"), s2, s3], 2) == [s2, s3]


def test_sliding_window_rejects_a_zero_bound() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        sliding_window([SYS], 0)


# --- token window ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("model", "window"),
    [
        ("gpt-4o", 128_000),
        ("gpt-4o-mini", 128_000),
        ("gpt-4o-mini-2024-07-18", 128_000),
        ("openai/gpt-4o", 128_000),
        ("GPT-4O", 128_000),
        ("llama3.1", 128_000),
        ("llama3.1:8b", 128_000),
        ("llama3.2-vision", 128_000),
        ("o3", 200_000),
        ("o3-mini", 200_000),
        ("gemini-2.5-flash", 1_000_000),
        ("gemini-2.5-pro-preview-05-06", 1_000_000),
        ("o3x", 4_000),
        ("gpt-4", 4_000),
        ("mistral-small", 4_000),
        ("", 4_000),
        (None, 4_000),
    ],
)
def test_model_windows(model: str | None, window: int) -> None:
    assert model_window(model) == window


def test_catalog_and_default() -> None:
    assert DEFAULT_WINDOW == 4_000
    assert set(MODEL_WINDOWS) == {
        "gpt-4o",
        "gpt-4o-mini",
        "llama3.1",
        "llama3.2",
        "o3",
        "gemini-2.5-flash",
        "gemini-2.5-pro",
    }


def test_estimate_tokens_is_chars_over_four_at_least_one() -> None:
    assert estimate_tokens(Message("user", "")) == 1
    assert estimate_tokens(Message("user", "abc")) == 1
    assert estimate_tokens(Message("user", "x" * 40)) == 10
    assert estimate_tokens(Message("user", "x" * 43)) == 10


def test_token_window_long_messages_unknown_model() -> None:
    # 1,500 tokens each: an unknown model's 4,000-token window holds the newest two.
    messages = [Message("user", f"{i}" * 6_000) for i in range(5)]
    assert token_window(messages, 20, "some-unknown-model") == messages[-2:]


def test_token_window_keeps_system_then_newest_in_both_budgets() -> None:
    big_sys = Message("system", "s" * 4_000)  # 1,000 tokens
    messages = [big_sys, *(Message("user", f"{i}" * 4_000) for i in range(5))]
    # 4,000 - 1,000 for the system message leaves room for three 1,000-token messages.
    assert token_window(messages, 20, None) == [big_sys, *messages[-3:]]
    # The message budget binds first.
    assert token_window(messages, 2, None) == [big_sys, messages[-1]]


def test_token_window_newest_message_too_big_keeps_only_system() -> None:
    messages = [SYS, Message("user", "short"), Message("assistant", "x" * 20_000)]
    assert token_window(messages, 20, None) == [SYS]


def test_token_window_is_contiguous() -> None:
    # A message that does not fit ends the window: an older small one is not picked up.
    roles = ["user", "assistant", "user"]
    assert token_window_keep(roles, [4, 400, 4], 10, 50) == [2]


def test_token_window_many_system_messages() -> None:
    systems = [Message("system", f"s{i}") for i in range(4)]
    assert token_window([*systems, Message("user", "u")], 2, None) == systems[-2:]


# --- summarizing ----------------------------------------------------------------------------


def test_local_summary_format() -> None:
    old = [
        Message("user", "x" * 150),
        Message("assistant", "short answer"),
        Message("user", "line one\nline two"),
        Message("tool", "y" * 100),
    ]
    assert local_summary(old) == "\n".join(
        [
            "user: " + "x" * 100 + "...",
            "assistant: short answer",
            "user: line one line two",
            "tool: " + "y" * 100,
        ]
    )


def test_local_summary_carries_a_previous_summary_and_stays_bounded() -> None:
    previous = Message("system", f"{summary_header(2)}\nuser: hello\nassistant: hi")
    assert local_summary([previous, Message("user", "next")]) == "user: hello\nassistant: hi\nuser: next"
    many = [Message("user", f"{i:04d}" + "z" * 150) for i in range(200)]
    summary = local_summary(many)
    assert len(summary) <= LOCAL_SUMMARY_MAX_CHARS
    assert summary.endswith("0199" + "z" * 96 + "...")  # the newest lines are the ones kept


def test_split_for_summary_budget() -> None:
    s2 = Message("system", "second system")
    history = [SYS, s2, *conversation(6)]  # 2 system + 12 others
    assert split_for_summary(history, 14) is None  # fits
    plan = split_for_summary(history, 10)
    assert plan is not None
    # recentBudget = 10 - 2 - 1 = 7; window = min(6, 7) = 6
    assert plan.system == (SYS, s2)
    assert plan.recent == tuple(history[-6:])
    assert plan.old == tuple(history[2:-6])
    assert plan.summarized_count == 6
    wide = split_for_summary(history, 10, recent_window=10)
    assert wide is not None
    assert len(wide.recent) == 7  # window = min(10, 7)


def test_split_for_summary_without_room_for_a_summary() -> None:
    systems = [Message("system", f"s{i}") for i in range(4)]
    history = [*systems, *conversation(2)]
    assert split_for_summary(history, 5) is None  # 5 - 4 - 1 = 0
    # compact falls back to the sliding window
    assert compact(history, strategy="summarizing", max_messages=5) == [*systems, history[-1]]


def test_apply_summary_shape() -> None:
    history = [SYS, *conversation(10)]
    plan = split_for_summary(history, 8)
    assert plan is not None
    compacted = apply_summary(plan, "  they talked  ")
    assert len(compacted) == 8
    assert compacted[0] == SYS
    assert compacted[1] == Message("system", "[Conversation summary of 14 earlier messages]\nthey talked")
    assert compacted[2:] == history[-6:]
    assert summary_of(compacted[1]) == (14, "they talked")
    assert summary_of(SYS) is None
    assert summary_of(Message("user", compacted[1].content)) is None


def test_apply_summary_blank_falls_back_to_local() -> None:
    plan = SummaryPlan(system=(), old=(Message("user", "hello"),), recent=(Message("user", "now"),), summarized_count=1)
    assert apply_summary(plan, "   ")[0].content == "[Conversation summary of 1 earlier messages]\nuser: hello"
    assert apply_summary(plan, None) == apply_summary(plan, "")


def test_previous_summary_is_merged_and_counts_accumulate() -> None:
    history = [SYS, *conversation(10)]
    first = compact(history, strategy="summarizing", max_messages=8, summary="round one")
    grown = [*first, *conversation(4, size=3)]
    plan = split_for_summary(grown, 8)
    assert plan is not None
    assert plan.old[0] == first[1]  # the previous summary is summarized again
    assert plan.summarized_count == 14 + 8
    second = apply_summary(plan, "round two")
    assert [m for m in second if summary_of(m)] == [Message("system", f"{summary_header(22)}\nround two")]


def test_summary_prompt_wording() -> None:
    assert "summarizer" in SUMMARY_SYSTEM_PROMPT
    previous = Message("system", f"{summary_header(4)}\nBob likes tea.")
    prompt = summary_prompt([previous, Message("user", "I am Bob"), Message("assistant", "x" * 5_000)])
    for words in ("facts", "decisions", "names", "open questions", "summary only"):
        assert words in prompt
    assert "Bob likes tea." in prompt
    assert "[Conversation summary" not in prompt
    assert "user: I am Bob" in prompt
    assert "assistant: " + "x" * 2_000 + "...\n" not in prompt
    assert prompt.endswith("assistant: " + "x" * 2_000 + "...")


# --- compact() over long conversations ------------------------------------------------------


@pytest.mark.parametrize("strategy", ["sliding-window", "summarizing", "token-window", "unknown"])
def test_compact_each_turn_of_a_200_turn_conversation(strategy: str) -> None:
    history: list[Message] = [SYS]
    appended: list[Message] = []
    for turn in conversation(200, size=300):
        appended.append(turn)
        history = compact([*history, turn], strategy=strategy, max_messages=20, model="gpt-4o")
        assert len(history) <= 20
        assert history[0] == SYS
        summaries = [m for m in history if summary_of(m)]
        assert len(summaries) <= 1
        verbatim = [m for m in history if m.role != "system"]
        assert verbatim == appended[-len(verbatim) :]
        if summaries:
            count, _ = summary_of(summaries[0]) or (0, "")
            assert count + len(verbatim) == len(appended)


@settings(max_examples=200, deadline=None, database=None)
@given(
    roles=st.lists(st.sampled_from(["system", "user", "assistant", "tool"]), max_size=40),
    max_messages=st.integers(min_value=1, max_value=25),
    strategy=st.sampled_from(["sliding-window", "summarizing", "token-window"]),
    size=st.integers(min_value=0, max_value=3_000),
)
def test_compact_is_always_bounded(roles: list[str], max_messages: int, strategy: str, size: int) -> None:
    messages = [Message(role, f"{i}" + "x" * size) for i, role in enumerate(roles)]
    compacted = compact(messages, strategy=strategy, max_messages=max_messages)
    assert len(compacted) <= max_messages
    assert sum(1 for m in compacted if summary_of(m)) <= 1
    if strategy != "summarizing":  # a subsequence in the original order
        it = iter(messages)
        assert all(any(m is c for m in it) for c in compacted)


def test_history_digest_is_one_wire_contract_for_every_message_type() -> None:
    # Dispatch digests memory's wire messages, memory its stored ones: both must agree, bit for bit.
    turns = [("user", "hi"), ("assistant", "hé")]
    expected = "e18930cf37f9bebc19edcfe8236fdc71e0afcb234709b6ada50aae0cfbe18fff"  # sha256 of role NUL content NUL ...
    assert history_digest([Message(r, c) for r, c in turns]) == expected
    assert history_digest([ChatMessage(role=r, content=c) for r, c in turns]) == expected
    assert history_digest([]) == history_digest(iter([]))
    assert history_digest([Message("user", "a\ud800")]) != history_digest([Message("user", "a?")])
