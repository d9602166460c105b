"""The one definition of message budgets, of measuring and cutting text, and of text protobuf accepts."""

from __future__ import annotations

import pytest

from atmosphere.bus.sizes import (
    DEFAULT_MAX_PAYLOAD,
    ENVELOPE_ROOM,
    MIN_DATA_BYTES,
    MIN_REPLY_BYTES,
    REPLY_ROOM,
    clip,
    data_budget,
    head,
    reply_budget,
    utf8_len,
)
from atmosphere.bus.testing import FakeBus
from atmosphere.bus.text import has_lone_surrogate, replace_lone_surrogates
from atmosphere.contracts.tool.v1.tool_pb2 import ToolReply


def test_budgets_leave_room_below_the_broker_limit() -> None:
    assert DEFAULT_MAX_PAYLOAD == FakeBus().max_payload == 1 << 20
    assert data_budget(1 << 20) == (1 << 20) - ENVELOPE_ROOM
    assert reply_budget(1 << 20) == (1 << 20) - REPLY_ROOM
    assert REPLY_ROOM < ENVELOPE_ROOM
    # A tiny broker limit still leaves a usable budget; sends then fail clearly, not silently.
    assert data_budget(1024) == MIN_DATA_BYTES
    assert reply_budget(1024) == MIN_REPLY_BYTES


@pytest.mark.parametrize(
    ("text", "size"),
    [("", 0), ("abc", 3), ("é", 2), ("€", 3), ("😀", 4), ("a\ud800b", 5)],
    ids=["empty", "ascii", "2-byte", "3-byte", "4-byte", "lone-surrogate"],
)
def test_utf8_len_is_the_size_on_the_wire(text: str, size: int) -> None:
    assert utf8_len(text) == size


def test_head_cuts_between_characters() -> None:
    assert head("aé😀", 4) == "aé"
    assert head("aé😀", 7) == "aé😀"
    assert head("aé😀", 0) == ""
    assert head("aé😀", -5) == ""
    assert head("€€€", 8) == "€€"


@pytest.mark.parametrize("char", ["x", "ü", "😀"])
def test_clip_stays_within_the_bound_and_says_how_large_the_whole_was(char: str) -> None:
    whole = char * 1000
    text = clip(whole, 200, "the output")
    assert utf8_len(text) <= 200
    kept, _, marker = text.partition("\n")
    assert kept == char * len(kept)
    assert len(kept) > 0
    assert (
        marker
        == f"…[truncated: the output is {utf8_len(whole)} bytes; only the first {utf8_len(kept)} bytes are shown]"
    )


def test_clip_leaves_text_that_fits_untouched() -> None:
    assert clip("short", 5, "x") == "short"
    assert clip("", 0, "x") == ""


def test_lone_surrogates_are_found_and_replaced_so_protobuf_accepts_the_text() -> None:
    assert has_lone_surrogate("bad \ud800 text")
    assert has_lone_surrogate("\udfff")
    assert not has_lone_surrogate("good 😀 text")
    with pytest.raises(UnicodeEncodeError):  # what the replacement is for
        ToolReply(content="bad \ud800 text").SerializeToString()
    fixed = replace_lone_surrogates("bad \ud800 text \udc00")
    assert fixed == "bad ? text ?"
    assert ToolReply(content=fixed).SerializeToString()
    untouched = "good 😀 text"
    assert replace_lone_surrogates(untouched) is untouched
