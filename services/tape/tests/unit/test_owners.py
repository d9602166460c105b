"""Who owns a run: the tape records each run's owner, lists by owner, agent and time, and a read
naming an owner reaches that owner's runs only (any other reads as a run the tape never saw).

The real tape (its recorder, store and handlers) on a `FakeBus`, on a SQLite file.
"""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from google.protobuf.timestamp_pb2 import Timestamp

from atmosphere.bus import RemoteError, subjects
from atmosphere.bus.testing import FakeBus
from atmosphere.contracts.run.v1.run_pb2 import Complete, InputMessage, RunEvent, RunInput, TextDelta
from atmosphere.contracts.tape.v1.tape_pb2 import (
    GetStepsRequest,
    GetStepsResponse,
    ListRunsRequest,
    ListRunsResponse,
    ReplayRequest,
    ReplayResponse,
)
from atmosphere.tape.handlers import TapeHandlers
from atmosphere.tape.recorder import Recorder
from atmosphere.tape.schema import migrate
from atmosphere.tape.store import RunFilter, TapeStore, runs_query

LIMIT = 64 * 1024
HOSTILE_OWNER = "o'brien\"; DROP TABLE tape_run; --%_*"
"""A user id is any text a grant names: SQL's metacharacters included."""


def event(seq: int, run_id: str, *, owner: str, agent: str = "echo", at: int = 1_000, **kind: Any) -> RunEvent:
    ts = Timestamp()
    ts.FromMilliseconds(at + seq)
    return RunEvent(
        run_id=run_id,
        seq=seq,
        conversation_id="c",
        agent=agent,
        owner=owner,
        timestamp=ts,
        **kind,
    )


def turn(run_id: str, *, owner: str, agent: str = "echo", at: int = 1_000, parent: str = "") -> list[RunEvent]:
    messages = [InputMessage(role="user", content="Hi?")]
    events = [
        event(1, run_id, owner=owner, agent=agent, at=at, input=RunInput(messages=messages)),
        event(2, run_id, owner=owner, agent=agent, at=at, text_delta=TextDelta(text=f"answer of {run_id}")),
        event(3, run_id, owner=owner, agent=agent, at=at, complete=Complete()),
    ]
    for e in events:
        e.parent_run_id = parent
    return events


@pytest.fixture
async def tape(store: TapeStore) -> AsyncIterator[tuple[FakeBus, Recorder]]:
    bus = FakeBus(max_payload=LIMIT)
    recorder = Recorder(store)
    async with bus.serve(TapeHandlers(store, max_payload=LIMIT, recorder=recorder).router()):
        await recorder.record(turn("ada-1", owner="ada", at=1_000))
        await recorder.record(turn("bob-1", owner="bob", agent="shout", at=2_000))
        await recorder.record(turn("ada-2", owner="ada", agent="shout", at=3_000))
        await recorder.record(turn("anon-1", owner="", at=4_000))
        await recorder.record(turn("odd-1", owner=HOSTILE_OWNER, at=5_000))
        yield bus, recorder


async def listed(bus: FakeBus, **filters: Any) -> list[str]:
    reply = await bus.request(subjects.tape("runs"), ListRunsRequest(**filters), ListRunsResponse)
    return [r.run_id for r in reply.runs]


async def test_each_run_is_listed_with_its_owner(tape: tuple[FakeBus, Recorder]) -> None:
    bus, _ = tape
    reply = await bus.request(subjects.tape("runs"), ListRunsRequest(), ListRunsResponse)
    assert [(r.run_id, r.owner) for r in reply.runs] == [
        ("odd-1", HOSTILE_OWNER),
        ("anon-1", ""),
        ("ada-2", "ada"),
        ("bob-1", "bob"),
        ("ada-1", "ada"),
    ]


async def test_the_list_filters_by_owner_agent_status_and_start_time(tape: tuple[FakeBus, Recorder]) -> None:
    bus, _ = tape
    assert await listed(bus, owner="ada") == ["ada-2", "ada-1"]
    assert await listed(bus, owner="bob") == ["bob-1"]
    assert await listed(bus, owner="nobody") == []
    assert await listed(bus, owner=HOSTILE_OWNER) == ["odd-1"]  # matched exactly, never as SQL
    assert await listed(bus, agent="shout") == ["ada-2", "bob-1"]
    assert await listed(bus, owner="ada", agent="shout") == ["ada-2"]
    assert await listed(bus, owner="ada", status="completed") == ["ada-2", "ada-1"]
    assert await listed(bus, owner="ada", status="OPEN") == []
    # Started at 1_001, 2_001, 3_001...: `started_after` is inclusive, `started_before` exclusive.
    assert await listed(bus, started_after=2_001) == ["odd-1", "anon-1", "ada-2", "bob-1"]
    assert await listed(bus, started_after=2_001, started_before=3_001) == ["bob-1"]
    assert await listed(bus, owner="ada", started_before=3_001) == ["ada-1"]
    assert await listed(bus, started_after=2**62) == []
    assert await listed(bus, started_after=5_000, started_before=2_000) == []
    assert await listed(bus, owner="ada", limit=1) == ["ada-2"]


@pytest.mark.parametrize(
    "request_",
    [
        pytest.param(ListRunsRequest(started_after=-1), id="negative-after"),
        pytest.param(ListRunsRequest(started_before=-5), id="negative-before"),
        pytest.param(ListRunsRequest(owner="o" * 5000), id="long-owner"),
        pytest.param(ListRunsRequest(agent="a" * 5000), id="long-agent"),
    ],
)
async def test_a_malformed_list_is_refused(tape: tuple[FakeBus, Recorder], request_: ListRunsRequest) -> None:
    bus, _ = tape
    with pytest.raises(RemoteError) as refused:
        await bus.request(subjects.tape("runs"), request_, ListRunsResponse)
    assert refused.value.code == "tape.bad_request"


async def steps(bus: FakeBus, run_id: str, owner: str = "") -> GetStepsResponse:
    return await bus.request(subjects.tape("steps"), GetStepsRequest(run_id=run_id, owner=owner), GetStepsResponse)


async def test_steps_for_an_owner_reach_only_that_owners_runs(tape: tuple[FakeBus, Recorder]) -> None:
    bus, _ = tape
    own = await steps(bus, "ada-1", "ada")
    assert (own.run.owner, [s.kind for s in own.steps]) == ("ada", ["input", "text", "complete"])
    assert await steps(bus, "no-such-run", "ada") == GetStepsResponse(run_id="no-such-run")
    for run_id in ("bob-1", "anon-1"):
        # Another's run, and an ownerless one, read exactly as a run the tape never saw.
        assert await steps(bus, run_id, "ada") == GetStepsResponse(run_id=run_id)
    assert (await steps(bus, "odd-1", HOSTILE_OWNER)).count == 3
    assert (await steps(bus, "bob-1")).count == 3  # no owner named: every run (the admin's read)


async def replay(bus: FakeBus, run_id: str, owner: str = "") -> ReplayResponse:
    return await bus.request(subjects.tape("replay"), ReplayRequest(run_id=run_id, owner=owner), ReplayResponse)


async def test_a_replay_for_an_owner_reaches_only_that_owners_runs_and_children(
    tape: tuple[FakeBus, Recorder],
) -> None:
    bus, recorder = tape
    await recorder.record(turn("ada-child", owner="ada", at=6_000, parent="ada-1"))
    await recorder.record(turn("bob-child", owner="bob", at=7_000, parent="ada-1"))
    own = await replay(bus, "ada-1", "ada")
    assert (own.present, own.root.output, own.run_count) == (True, "answer of ada-1", 2)
    assert [c.run_id for c in own.children] == ["ada-child"]
    everyone = await replay(bus, "ada-1")
    assert [c.run_id for c in everyone.children] == ["ada-child", "bob-child"]
    for run_id in ("bob-1", "anon-1", "no-such-run"):
        answer = await replay(bus, run_id, "ada")
        assert answer == ReplayResponse(run_id=run_id, present=False)
    with pytest.raises(RemoteError) as refused:
        await replay(bus, "ada-1", "o" * 5000)
    assert refused.value.code == "tape.bad_request"


async def test_the_first_owner_named_stays_the_runs(store: TapeStore) -> None:
    recorder = Recorder(store)
    await recorder.record([event(1, "r", owner="", text_delta=TextDelta(text="a"))])
    assert (run := await store.run("r")) is not None
    assert run.owner == ""
    await recorder.record([event(2, "r", owner="ada", text_delta=TextDelta(text="b"))])
    await recorder.record([event(3, "r", owner="mallory", complete=Complete())])
    assert (run := await store.run("r")) is not None
    assert (run.owner, run.status) == ("ada", "COMPLETED")
    assert await store.run("r", owner="mallory") is None


async def test_a_database_from_before_owners_gains_the_column_and_its_index(tmp_path: Path) -> None:
    path = tmp_path / "tape.db"
    async with TapeStore.open(path) as store:
        await Recorder(store).record(turn("old", owner="ada"))
    with sqlite3.connect(path) as db:  # as the previous tape left it: no owner column, no index
        db.execute("DROP INDEX idx_tape_run_owner_started")
        db.execute("ALTER TABLE tape_run DROP COLUMN owner")
    async with TapeStore.open(path) as store:
        old = await store.run("old")
        assert await migrate(store.db) == []  # a second open adds nothing
        await Recorder(store).record([event(4, "old", owner="ada", text_delta=TextDelta(text="late"))])
        again = await store.run("old")
    assert old is not None
    assert (old.owner, old.status) == ("", "COMPLETED")  # steps never said who: nobody's
    assert again is not None
    assert again.owner == "ada"  # its next event names its owner
    with sqlite3.connect(path) as db:
        indexes = {row[1] for row in db.execute("PRAGMA index_list(tape_run)")}
    assert "idx_tape_run_owner_started" in indexes


async def test_an_owners_runs_newest_first_are_read_through_the_owner_index(store: TapeStore) -> None:
    for where in (RunFilter(owner="ada"), RunFilter(owner="ada", status="COMPLETED", started_after=5)):
        sql, parameters = runs_query(where, 10)
        async with store.db.execute(f"EXPLAIN QUERY PLAN {sql}", parameters) as cursor:
            plan = " ".join(str(row[-1]) for row in await cursor.fetchall())
        assert "idx_tape_run_owner_started" in plan, plan
        assert "TEMP B-TREE" not in plan, plan  # the index gives the order: no sort
