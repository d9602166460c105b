"""`DirectReader`: paging, a replica that lags the leader, a broker that does not answer, refusals.

The server side is a scripted stand-in for nats-server's direct-get answers (the real server is
in `tests/contract/test_bus_replay.py`); these are the answers a cluster gives only by chance.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from nats.aio.msg import Msg

from atmosphere.bus import BusError
from atmosphere.bus._direct import MAX_PAGES_IN_FLIGHT, PAGE_MESSAGES, DirectReader, StoredMessage

Answer = Callable[[dict[str, Any]], list[tuple[bytes, dict[str, str]]]]


class ScriptedServer:
    """Answers each direct get with the next script entry (the last one repeats)."""

    def __init__(self, *answers: Answer) -> None:
        self.answers = list(answers)
        self.requests: list[dict[str, Any]] = []
        self._callback: Callable[[Msg], Awaitable[None]] | None = None

    def new_inbox(self) -> str:
        return "_INBOX.test"

    async def subscribe(self, subject: str, *, cb: Callable[[Msg], Awaitable[None]], **_: Any) -> None:
        assert subject == "_INBOX.test.*"
        self._callback = cb

    async def publish(self, subject: str, payload: bytes, *, reply: str) -> None:
        assert subject == "$JS.API.DIRECT.GET.S"
        request = json.loads(payload)
        self.requests.append(request)
        answer = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        callback = self._callback
        assert callback is not None
        for data, headers in answer(request):
            await callback(Msg(None, subject=reply, data=data, headers=headers))  # type: ignore[arg-type]


def stored(*seqs: int, pending: int = 0) -> Answer:
    def answer(_request: dict[str, Any]) -> list[tuple[bytes, dict[str, str]]]:
        messages = [(str(s).encode(), {"Nats-Sequence": str(s), "Nats-Num-Pending": "0"}) for s in seqs]
        return [*messages, (b"", {"Status": "204", "Description": "EOB", "Nats-Num-Pending": str(pending)})]

    return answer


def status(code: str, description: str = "") -> Answer:
    return lambda _request: [(b"", {"Status": code, "Description": description})]


def silent(_request: dict[str, Any]) -> list[tuple[bytes, dict[str, str]]]:
    return []


async def read(
    server: ScriptedServer, *, through: int, leader_holds: int | None = None, patience: float = 2.0
) -> list[int]:
    async def more_to_read(next_seq: int) -> bool:
        return leader_holds is not None and leader_holds >= next_seq

    reader = DirectReader(server, patience=patience)  # type: ignore[arg-type]
    return [m.seq async for m in reader.read("S", "s.r1", through=through, more_to_read=more_to_read)]


async def test_pages_follow_one_another_from_the_last_sequence_read() -> None:
    server = ScriptedServer(stored(1, 3, pending=2), stored(7, 9))
    assert await read(server, through=9, leader_holds=9) == [1, 3, 7, 9]
    assert [r["seq"] for r in server.requests] == [1, 4]
    assert {r["next_by_subj"] for r in server.requests} == {"s.r1"}
    assert {r["batch"] for r in server.requests} == {PAGE_MESSAGES}


async def test_a_replica_behind_the_leader_is_asked_again_until_it_caught_up() -> None:
    # The replica answering first has 1-2, then nothing at 3 yet; the leader holds 4.
    server = ScriptedServer(stored(1, 2), status("404", "Message Not Found"), stored(3, 4))
    assert await read(server, through=4, leader_holds=4) == [1, 2, 3, 4]


async def test_messages_removed_meanwhile_end_the_read() -> None:
    server = ScriptedServer(stored(1, 2))
    assert await read(server, through=5, leader_holds=None) == [1, 2]


async def test_what_was_stored_after_the_read_began_is_left_out() -> None:
    server = ScriptedServer(stored(1, 2, 3, 4))
    assert await read(server, through=2, leader_holds=4) == [1, 2]


async def test_no_replica_serving_direct_gets_yet_is_waited_out() -> None:
    server = ScriptedServer(status("503"), status("503"), stored(1))
    assert await read(server, through=1, leader_holds=1) == [1]


async def test_a_broker_that_never_answers_fails_within_the_patience() -> None:
    server = ScriptedServer(silent)
    started = time.monotonic()
    with pytest.raises(BusError, match="no answer"):
        await read(server, through=3, leader_holds=3, patience=0.3)
    assert time.monotonic() - started < 5  # loose for a loaded machine, below the default patience (10 s)


async def test_a_replica_that_stays_behind_fails_within_the_patience() -> None:
    server = ScriptedServer(stored(1), status("404"))
    with pytest.raises(BusError, match="stalled"):
        await read(server, through=3, leader_holds=3, patience=0.3)


async def test_a_refused_request_fails_at_once() -> None:
    server = ScriptedServer(status("408", "Bad Request"))
    with pytest.raises(BusError, match="408 Bad Request"):
        await read(server, through=3, leader_holds=3)
    assert len(server.requests) == 1


async def test_answers_to_a_page_given_up_on_are_dropped() -> None:
    reader = DirectReader(ScriptedServer(stored(1)), patience=1.0)  # type: ignore[arg-type]

    async def more_to_read(_next_seq: int) -> bool:
        return False

    reading = reader.read("S", "s.r1", through=1, more_to_read=more_to_read)
    got: list[StoredMessage] = [m async for m in reading]
    assert [m.seq for m in got] == [1]
    assert reader._pages == {}


class SlowServer(ScriptedServer):
    """Answers every page `delay` seconds after it was asked (each page in its own time)."""

    def __init__(self, answer: Answer, delay: float) -> None:
        super().__init__(answer)
        self.delay = delay
        self.answering: set[asyncio.Task[None]] = set()

    async def publish(self, subject: str, payload: bytes, *, reply: str) -> None:
        async def later() -> None:
            await asyncio.sleep(self.delay)
            await ScriptedServer.publish(self, subject, payload, reply=reply)

        task = asyncio.create_task(later())
        self.answering.add(task)
        task.add_done_callback(self.answering.discard)


async def test_a_read_queued_behind_a_burst_of_pages_is_not_given_up_on() -> None:
    # Four rounds of pages ahead of the last reads (2 s in the connection's own queue) and a
    # patience of 1.5 s: the queue is no broker's silence, so the last reads still get their page
    # (with a second to spare for the page itself, however slow the machine).
    server = SlowServer(stored(1, 2), delay=0.5)
    reader = DirectReader(server, patience=1.5)  # type: ignore[arg-type]

    async def one() -> list[int]:
        async def more_to_read(_next: int) -> bool:
            return False

        return [m.seq async for m in reader.read("S", "s.r1", through=2, more_to_read=more_to_read)]

    reads = 4 * MAX_PAGES_IN_FLIGHT + 1
    results = await asyncio.gather(*(one() for _ in range(reads)))
    assert results == [[1, 2]] * reads
