"""The tape's admin routes end to end in-process: the real ingress app and the real tape on one `FakeBus`.

The ingress app runs its lifespan as in production (`create_app(settings, bus=FakeBus)`), the
tape's handlers serve `atmo.tape.*` on the same bus from a real SQLite store, and the runs are
recorded through the tape's own recorder; requests go through httpx's ASGI transport.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
from google.protobuf.timestamp_pb2 import Timestamp

from atmosphere.bus import subjects
from atmosphere.bus.testing import FakeBus
from atmosphere.contracts.dispatch.v1.dispatch_pb2 import AgentDescriptor
from atmosphere.contracts.run.v1.run_pb2 import Complete, InputMessage, RunEvent, RunInput, TextDelta, ToolStart
from atmosphere.ingress.api import create_app
from atmosphere.ingress.settings import IngressSettings
from atmosphere.tape.agents import AgentDirectory
from atmosphere.tape.handlers import TapeHandlers
from atmosphere.tape.recorder import Recorder
from atmosphere.tape.store import TapeStore

ADMIN_TOKEN = "admin-token-1"
ADMIN = {"authorization": f"Bearer {ADMIN_TOKEN}"}
LIMIT = 64 * 1024


@contextlib.asynccontextmanager
async def admin(tmp_path: Path, *, tape: bool = True) -> AsyncIterator[tuple[httpx.AsyncClient, Recorder | None]]:
    """An HTTP client of the real ingress app and, with `tape`, the recorder of a tape serving the same bus."""
    bus = FakeBus(max_payload=LIMIT)
    app = create_app(IngressSettings(admin_token=ADMIN_TOKEN), bus=bus)
    async with contextlib.AsyncExitStack() as stack:
        await stack.enter_async_context(app.router.lifespan_context(app))
        recorder = None
        if tape:
            await bus.kv_put(
                subjects.AGENTS_BUCKET,
                "echo",
                AgentDescriptor(name="echo", path="/atmosphere/agent/echo", runtime="rt"),
            )
            store = await stack.enter_async_context(TapeStore.open(tmp_path / "tape.db"))
            recorder = Recorder(store, directory=AgentDirectory(bus))
            await stack.enter_async_context(
                bus.serve(TapeHandlers(store, max_payload=LIMIT, recorder=recorder).router())
            )
        transport = httpx.ASGITransport(app=app)
        client = await stack.enter_async_context(httpx.AsyncClient(transport=transport, base_url="http://ingress"))
        yield client, recorder


def event(seq: int, run_id: str, *, at: int = 1_000, parent: str = "", **kind: Any) -> RunEvent:
    ts = Timestamp()
    ts.FromMilliseconds(at + seq)
    return RunEvent(
        run_id=run_id, seq=seq, conversation_id="c1", agent="echo", parent_run_id=parent, timestamp=ts, **kind
    )


def turn(run_id: str, *, at: int = 1_000, parent: str = "", answer: str = "Noon.") -> list[RunEvent]:
    messages = [InputMessage(role="system", content="Be brief."), InputMessage(role="user", content="Time?")]
    return [
        event(1, run_id, at=at, parent=parent, input=RunInput(messages=messages, model="m1")),
        event(2, run_id, at=at, parent=parent, tool_start=ToolStart(tool_name="clock", arguments_json="{}")),
        event(3, run_id, at=at, parent=parent, text_delta=TextDelta(text=answer)),
        event(4, run_id, at=at, parent=parent, complete=Complete()),
        event(5, run_id, at=at, parent=parent, text_delta=TextDelta(text="after the end")),
    ]


async def test_the_run_list_says_model_runtime_endpoint_and_dropped_steps(tmp_path: Path) -> None:
    async with admin(tmp_path) as (http, recorder):
        assert recorder is not None
        await recorder.record(turn("root"))
        runs = await http.get("/api/admin/tape/runs", headers=ADMIN)
        steps = await http.get("/api/admin/tape/runs/root/steps", headers=ADMIN)
    assert runs.status_code == 200
    assert runs.json() == [
        {
            "runId": "root",
            "tapeId": "c1",
            "parentRunId": None,
            "status": "COMPLETED",
            "agent": "echo",
            "owner": None,  # an anonymous run
            "model": "m1",
            "runtime": "rt",
            "endpoint": "/atmosphere/agent/echo",
            "startedAt": 1_001,
            "endedAt": 1_004,
            "stepCount": 4,
            "droppedSteps": 1,
            "truncated": False,
        }
    ]
    assert [s["kind"] for s in steps.json()["steps"]] == ["input", "tool-start", "text", "complete"]


async def test_the_replay_is_the_run_and_the_runs_it_started(tmp_path: Path) -> None:
    async with admin(tmp_path) as (http, recorder):
        assert recorder is not None
        await recorder.record(turn("root"))
        await recorder.record(turn("child-2", at=3_000, parent="root", answer="B"))
        await recorder.record(turn("child-1", at=2_000, parent="root", answer="A"))
        replay = await http.get("/api/admin/tape/runs/root/replay", headers=ADMIN)
    assert replay.status_code == 200
    tree = replay.json()
    assert (tree["present"], tree["runCount"]) == (True, 3)
    assert tree["root"] == {
        "runId": "root",
        "parentRunId": None,
        "status": "COMPLETED",
        "model": "m1",
        "runtime": "rt",
        "endpoint": "/atmosphere/agent/echo",
        "startedAt": 1_001,
        "endedAt": 1_004,
        "input": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Time?"}],
        "output": "Noon.",
        "tools": [{"name": "clock", "arguments": "{}"}],
    }
    assert [(c["runId"], c["parentRunId"], c["output"]) for c in tree["children"]] == [
        ("child-1", "root", "A"),
        ("child-2", "root", "B"),
    ]
    assert "childrenOmitted" not in tree


async def test_an_unknown_run_is_not_present_and_bad_requests_are_refused(tmp_path: Path) -> None:
    async with admin(tmp_path) as (http, _):
        unknown = await http.get("/api/admin/tape/runs/nope/replay", headers=ADMIN)
        malformed = await http.get("/api/admin/tape/runs/a..b/replay", headers=ADMIN)
        too_long = await http.get(f"/api/admin/tape/runs/{'r' * 200}/replay", headers=ADMIN)
        anonymous = await http.get("/api/admin/tape/runs/nope/replay")
    assert (unknown.status_code, unknown.json()) == (200, {"runId": "nope", "present": False})
    assert (malformed.status_code, malformed.json()["code"]) == (400, "admin.bad_request")
    assert (too_long.status_code, too_long.json()["code"]) == (400, "admin.bad_request")
    assert (anonymous.status_code, anonymous.json()["code"]) == (401, "admin.unauthorized")


async def test_without_a_tape_the_replay_surface_is_absent(tmp_path: Path) -> None:
    async with admin(tmp_path, tape=False) as (http, _):
        absent = await http.get("/api/admin/tape/runs/r1/replay", headers=ADMIN)
    assert (absent.status_code, absent.json()["code"]) == (404, "admin.absent")


async def test_a_replay_too_large_for_one_message_says_what_it_left_out(tmp_path: Path) -> None:
    history = [InputMessage(role="user", content=f"message {i} " + "x" * 100) for i in range(3000)]
    async with admin(tmp_path) as (http, recorder):
        assert recorder is not None
        await recorder.record(
            [
                event(1, "big", input=RunInput(messages=history)),
                event(2, "big", text_delta=TextDelta(text="y" * 90_000)),
            ]
        )
        for i in range(30):
            await recorder.record(turn(f"kid-{i:02d}", at=5_000 + i, parent="big", answer="z" * 5_000))
        replay = await http.get("/api/admin/tape/runs/big/replay", headers=ADMIN)
    tree = replay.json()
    assert replay.status_code == 200
    root = tree["root"]
    assert root["inputOmitted"] > 0
    assert root["clipped"] is True
    assert root["input"][-1]["content"].startswith("message 2999")
    assert tree["runCount"] == 31
    assert len(tree["children"]) + tree.get("childrenOmitted", 0) == 30
