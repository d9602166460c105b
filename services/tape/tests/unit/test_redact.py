"""With `redact` on, personal data never reaches the database: nested payloads and coalesced text alike."""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

from atmosphere.contracts.run.v1.run_pb2 import Content, InputMessage, RunEvent, RunInput, TextDelta, ToolStart
from atmosphere.tape.recorder import Recorder
from atmosphere.tape.redact import Redactor
from atmosphere.tape.store import TapeStore


def event(seq: int, **kind: Any) -> RunEvent:
    return RunEvent(run_id="r1", seq=seq, **kind)


async def stored(store: TapeStore) -> list[dict[str, Any]]:
    return [json.loads(s.payload) for s in await store.steps("r1", from_seq=0, limit=100)]


async def test_pii_is_masked_in_every_stored_string(store: TapeStore) -> None:
    recorder = Recorder(store, redactor=Redactor(enabled=True))
    arguments = json.dumps({"to": "alice@example.com", "cc": ["bob@example.org"], "n": 3})
    await recorder.record(
        [
            event(
                1, input=RunInput(messages=[InputMessage(role="user", content="I am 123-45-6789, call 555-123-4567")])
            ),
            event(2, tool_start=ToolStart(tool_name="mail", arguments_json=arguments)),
            event(3, text_delta=TextDelta(text="Card 4111 1111 ")),
            event(4, text_delta=TextDelta(text="1111 1111 on file.")),  # split over two deltas
        ]
    )
    await recorder.record([event(5, text_delta=TextDelta(text=" Mail carol@example.net."))])
    steps = await stored(store)
    assert steps[0]["messages"][0]["content"] == "I am [REDACTED], call [REDACTED]"
    assert json.loads(steps[1]["argumentsJson"]) == {"to": "[REDACTED]", "cc": ["[REDACTED]"], "n": 3}
    assert steps[2] == {"text": "Card [REDACTED] on file. Mail [REDACTED]."}
    raw = "".join(s.payload for s in await store.steps("r1", from_seq=0, limit=100))
    assert "example" not in raw
    assert "4111" not in raw


def digest_with_ten_digits() -> bytes:
    """Data whose SHA-256 hex digest holds ten decimal digits in a row (what a phone pattern finds)."""
    return next(
        data
        for data in (str(i).encode() for i in range(100_000))
        if re.search(r"[0-9]{10}", hashlib.sha256(data).hexdigest())
    )


async def test_digests_are_not_mistaken_for_phone_numbers_and_redaction_is_off_by_default(store: TapeStore) -> None:
    data = digest_with_ten_digits()
    content = Content(content_type="file", mime_type="text/plain", data=data, file_name="bob@example.com.txt")
    await Recorder(store, redactor=Redactor(enabled=True)).record([event(1, content=content)])
    await Recorder(store).record([event(2, text_delta=TextDelta(text="alice@example.com"))])
    descriptor, text = await stored(store)
    assert descriptor["fileName"] == "[REDACTED]"
    assert descriptor["sha256"] == hashlib.sha256(data).hexdigest()
    assert text == {"text": "alice@example.com"}


def test_the_redactor_keeps_the_payload_when_nothing_matches() -> None:
    payload = {"text": "nothing personal", "n": 1}
    assert Redactor(enabled=True).payload(payload) is payload
    assert Redactor(enabled=True).payload({"sha256": "5551234567" * 6})["sha256"] == "5551234567" * 6
