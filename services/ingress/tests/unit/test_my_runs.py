"""A user's own surface (`/api/me`, `/api/agents`, `/api/runs...`) and the admin list's filters, in-process.

The real ingress app (its lifespan as in production, `create_app(settings, bus=FakeBus)`) and the
real tape (its recorder, SQLite store and handlers) serving `atmo.tape.*` on the same bus; runs
are recorded through the tape's own recorder, requests go through httpx's ASGI transport.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from google.protobuf.timestamp_pb2 import Timestamp

from atmosphere.bus import RequestTimeoutError, subjects
from atmosphere.bus.testing import FakeBus
from atmosphere.config import TokenGrant
from atmosphere.contracts.dispatch.v1.dispatch_pb2 import AgentDescriptor
from atmosphere.contracts.run.v1.run_pb2 import Complete, InputMessage, RunEvent, RunInput, TextDelta
from atmosphere.ingress.api import create_app
from atmosphere.ingress.settings import IngressOptions, IngressSettings
from atmosphere.tape.agents import AgentDirectory
from atmosphere.tape.handlers import TapeHandlers
from atmosphere.tape.recorder import Recorder
from atmosphere.tape.store import TapeStore

ADMIN_TOKEN = "admin-token-1"
ADA = "token-ada-everything"
ADA_ECHO = "token-ada-echo-only"
BOB = "token-bob-everything"
ODD = "token-of-an-odd-user"
ODD_USER = "o'brien\"; DROP TABLE tape_run; --%_*"
GRANTS = (
    TokenGrant(token=ADA, user_id="ada", name="Ada", roles=("analyst",), tenant="acme"),
    TokenGrant(token=ADA_ECHO, user_id="ada", paths=("/atmosphere/agent/echo",)),
    TokenGrant(token=BOB, user_id="bob"),
    TokenGrant(token=ODD, user_id=ODD_USER),
)
LIMIT = 64 * 1024
AGENTS = {
    "shout": AgentDescriptor(
        name="shout", path="/atmosphere/agent/shout", kind="agent", description="Shouts.", runtime="rt"
    ),
    "echo": AgentDescriptor(
        name="echo",
        path="/atmosphere/agent/echo",
        kind="agent",
        description="Echoes.",
        runtime="rt",
        runtime_state="ACTIVE",
        pool="",
        capabilities=["streaming"],
        tools=["clock"],
        harness=["memory"],
    ),
}


class UnreadableDirectory(FakeBus):
    """A broker on which the agents bucket does not answer."""

    async def kv_items(self, bucket: str, message_type: Any) -> Any:
        if bucket == subjects.AGENTS_BUCKET:
            raise RequestTimeoutError(subjects.AGENTS_BUCKET, 1.0)
        return await super().kv_items(bucket, message_type)


def bearer(token: str) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"}


ADMIN = bearer(ADMIN_TOKEN)


@contextlib.asynccontextmanager
async def ingress(
    tmp_path: Path, *, grants: tuple[TokenGrant, ...] = GRANTS, tape: bool = True, bus: FakeBus | None = None
) -> AsyncIterator[tuple[httpx.AsyncClient, Recorder | None]]:
    """A client of the real ingress app and, with `tape`, the recorder of a real tape on the same bus."""
    bus = bus or FakeBus(max_payload=LIMIT)
    settings = IngressSettings(admin_token=ADMIN_TOKEN, ingress=IngressOptions(auth_tokens=grants))
    app = create_app(settings, bus=bus)
    async with contextlib.AsyncExitStack() as stack:
        await stack.enter_async_context(app.router.lifespan_context(app))
        for name, descriptor in AGENTS.items():
            await bus.kv_put(subjects.AGENTS_BUCKET, name, descriptor)
        recorder = None
        if tape:
            store = await stack.enter_async_context(TapeStore.open(tmp_path / "tape.db"))
            recorder = Recorder(store, directory=AgentDirectory(bus))
            await stack.enter_async_context(
                bus.serve(TapeHandlers(store, max_payload=LIMIT, recorder=recorder).router())
            )
        transport = httpx.ASGITransport(app=app)
        client = await stack.enter_async_context(httpx.AsyncClient(transport=transport, base_url="http://ingress"))
        yield client, recorder


def turn(run_id: str, *, owner: str, agent: str = "echo", at: int = 1_000, parent: str = "") -> list[RunEvent]:
    def event(seq: int, **kind: Any) -> RunEvent:
        ts = Timestamp()
        ts.FromMilliseconds(at + seq)
        return RunEvent(
            run_id=run_id, seq=seq, conversation_id="c1", agent=agent, owner=owner, parent_run_id=parent,
            timestamp=ts, **kind,
        )  # fmt: skip

    question = RunInput(messages=[InputMessage(role="user", content=f"question of {run_id}")], model="m1")
    return [
        event(1, input=question),
        event(2, text_delta=TextDelta(text=f"answer of {run_id}")),
        event(3, complete=Complete()),
    ]


async def record_runs(recorder: Recorder | None) -> None:
    """ada: a1 (echo, t=1000), a2 (shout, t=3000), a1's sub-run; bob: b1 (echo, t=2000); nobody's: anon (t=4000)."""
    assert recorder is not None
    await recorder.record(turn("a1", owner="ada", at=1_000))
    await recorder.record(turn("b1", owner="bob", at=2_000))
    await recorder.record(turn("a2", owner="ada", agent="shout", at=3_000))
    await recorder.record(turn("anon", owner="", at=4_000))
    await recorder.record(turn("a1-sub", owner="ada", at=5_000, parent="a1"))
    await recorder.record(turn("odd", owner=ODD_USER, at=6_000))


def ids(answer: httpx.Response) -> list[str]:
    assert answer.status_code == 200, answer.text
    return [r["runId"] for r in answer.json()]


# -- /api/me -----------------------------------------------------------------------------------


async def test_me_says_who_the_token_is_and_never_echoes_it(tmp_path: Path) -> None:
    async with ingress(tmp_path, tape=False) as (http, _):
        ada = await http.get("/api/me", headers=bearer(ADA))
        by_key = await http.get("/api/me", headers={"x-api-key": BOB})
        missing = await http.get("/api/me")
        unknown = await http.get("/api/me", headers=bearer("not-a-token-at-all"))
    assert (ada.status_code, ada.json()) == (
        200,
        {
            "authenticated": True,
            "authRequired": True,
            "userId": "ada",
            "name": "Ada",
            "tenant": "acme",
            "roles": ["analyst"],
        },
    )
    assert ADA not in ada.text
    assert by_key.json() == {
        "authenticated": True, "authRequired": True, "userId": "bob", "name": None, "tenant": None, "roles": [],
    }  # fmt: skip
    for refused in (missing, unknown):
        assert (refused.status_code, refused.json()["code"]) == (401, "ingress.unauthorized")
    assert "not-a-token-at-all" not in unknown.text


async def test_me_without_auth_is_anonymous(tmp_path: Path) -> None:
    async with ingress(tmp_path, grants=(), tape=False) as (http, _):
        me = await http.get("/api/me", headers=bearer("anything-at-all"))
    assert (me.status_code, me.json()) == (
        200,
        {"authenticated": False, "authRequired": False, "userId": None, "name": None, "tenant": None, "roles": []},
    )


# -- /api/agents -------------------------------------------------------------------------------

ECHO_ROW = {
    "name": "echo",
    "description": "Echoes.",
    "path": "/atmosphere/agent/echo",
    "kind": "agent",
    "runtime": "rt",
    "runtimeState": "ACTIVE",
    "pool": "default",
    "capabilities": ["streaming"],
    "tools": ["clock"],
    "harness": ["memory"],
}


async def test_agents_are_those_the_grant_covers_by_name(tmp_path: Path) -> None:
    async with ingress(tmp_path, tape=False) as (http, _):
        everything = await http.get("/api/agents", headers=bearer(ADA))
        echo_only = await http.get("/api/agents", headers=bearer(ADA_ECHO))
        anonymous = await http.get("/api/agents")
    assert everything.status_code == 200
    assert [a["name"] for a in everything.json()] == ["echo", "shout"]
    assert everything.json()[0] == ECHO_ROW
    assert everything.json()[1]["runtimeState"] == "ACTIVE"  # a runtime and no state: as the pools say
    assert echo_only.json() == [ECHO_ROW]
    assert (anonymous.status_code, anonymous.json()["code"]) == (401, "ingress.unauthorized")


async def test_agents_without_auth_are_all_and_an_unreadable_directory_is_503(tmp_path: Path) -> None:
    async with ingress(tmp_path, grants=(), tape=False) as (http, _):
        assert [a["name"] for a in (await http.get("/api/agents")).json()] == ["echo", "shout"]
    async with ingress(tmp_path, tape=False, bus=UnreadableDirectory(max_payload=LIMIT)) as (http, _):
        unreadable = await http.get("/api/agents", headers=bearer(ADA))
    assert (unreadable.status_code, unreadable.json()["code"]) == (503, "ingress.unavailable")


# -- /api/runs ---------------------------------------------------------------------------------


async def test_each_user_lists_only_their_own_runs_with_the_admins_rows(tmp_path: Path) -> None:
    async with ingress(tmp_path) as (http, recorder):
        await record_runs(recorder)
        ada = await http.get("/api/runs", headers=bearer(ADA))
        ada_echo = await http.get("/api/runs", headers=bearer(ADA_ECHO))
        bob = await http.get("/api/runs", headers=bearer(BOB))
        odd = await http.get("/api/runs", headers=bearer(ODD))
        admin = await http.get("/api/admin/tape/runs", headers=ADMIN)
        anonymous = await http.get("/api/runs")
    assert ids(ada) == ["a1-sub", "a2", "a1"]
    assert ids(ada_echo) == ["a1-sub", "a1"]  # her shout run: an agent this token does not cover
    assert ids(bob) == ["b1"]
    assert ids(odd) == ["odd"]  # a user id full of SQL metacharacters is a plain value
    assert ids(admin) == ["odd", "a1-sub", "anon", "a2", "b1", "a1"]
    admin_a1 = next(r for r in admin.json() if r["runId"] == "a1")
    assert ada.json()[2] == admin_a1  # the admin's row, owner included
    assert admin_a1["owner"] == "ada"
    assert next(r for r in admin.json() if r["runId"] == "anon")["owner"] is None
    assert (anonymous.status_code, anonymous.json()["code"]) == (401, "ingress.unauthorized")


async def test_own_runs_filter_by_agent_status_and_start_time(tmp_path: Path) -> None:
    async with ingress(tmp_path) as (http, recorder):
        await record_runs(recorder)

        async def mine(**params: Any) -> list[str]:
            return ids(await http.get("/api/runs", headers=bearer(ADA), params=params))

        assert await mine(agent="shout") == ["a2"]
        assert await mine(agent="echo", limit=1) == ["a1-sub"]
        assert await mine(status="COMPLETED") == ["a1-sub", "a2", "a1"]
        assert await mine(status="open") == []
        assert await mine(since=3_001) == ["a1-sub", "a2"]
        assert await mine(since=1_001, until=3_001) == ["a1"]
        assert await mine(since=9_000, until=1_000) == []


async def test_without_auth_every_run_is_the_callers(tmp_path: Path) -> None:
    async with ingress(tmp_path, grants=()) as (http, recorder):
        await record_runs(recorder)
        runs = await http.get("/api/runs")
        steps = await http.get("/api/runs/b1/steps")
        replay = await http.get("/api/runs/anon/replay")
    assert ids(runs) == ["odd", "a1-sub", "anon", "a2", "b1", "a1"]
    assert steps.json()["count"] == 3
    assert replay.json()["root"]["output"] == "answer of anon"


@pytest.mark.parametrize(
    ("query", "code"),
    [
        pytest.param("limit=0", "ingress.bad_request", id="limit-zero"),
        pytest.param("limit=1001", "ingress.bad_request", id="limit-over"),
        pytest.param("limit=" + "9" * 40, "ingress.bad_request", id="limit-huge"),
        pytest.param("limit=abc", "ingress.bad_request", id="limit-text"),
        pytest.param("since=-1", "ingress.bad_request", id="since-negative"),
        pytest.param("since=" + "9" * 30, "ingress.bad_request", id="since-huge"),
        pytest.param("until=253402300800000", "ingress.bad_request", id="until-after-9999"),
        pytest.param("status=RUNNING", "ingress.bad_request", id="status-unknown"),
        pytest.param("status=' OR 1=1 --", "ingress.bad_request", id="status-sql"),
        pytest.param("agent=a..b", "ingress.bad_request", id="agent-dots"),
        pytest.param("agent=echo' OR '1'='1", "ingress.bad_request", id="agent-sql"),
        pytest.param("agent=" + "a" * 200, "ingress.bad_request", id="agent-long"),
    ],
)
async def test_a_malformed_filter_is_a_clear_400(tmp_path: Path, query: str, code: str) -> None:
    async with ingress(tmp_path) as (http, _):
        answer = await http.get(f"/api/runs?{query}", headers=bearer(ADA))
    assert (answer.status_code, answer.json()["code"]) == (400, code), answer.text
    assert answer.json()["error"]


# -- a run's steps and replay ------------------------------------------------------------------


async def test_steps_and_replay_of_ones_own_run_are_the_admins(tmp_path: Path) -> None:
    async with ingress(tmp_path) as (http, recorder):
        await record_runs(recorder)
        steps = await http.get("/api/runs/a1/steps", headers=bearer(ADA), params={"fromSeq": 2})
        admin_steps = await http.get("/api/admin/tape/runs/a1/steps", headers=ADMIN, params={"fromSeq": 2})
        replay = await http.get("/api/runs/a1/replay", headers=bearer(ADA))
        admin_replay = await http.get("/api/admin/tape/runs/a1/replay", headers=ADMIN)
    assert steps.status_code == 200
    assert steps.json() == admin_steps.json()
    assert [s["kind"] for s in steps.json()["steps"]] == ["text", "complete"]
    assert steps.json()["run"]["owner"] == "ada"
    assert replay.status_code == 200
    assert replay.json() == admin_replay.json()
    assert replay.json()["root"]["output"] == "answer of a1"
    assert [c["runId"] for c in replay.json()["children"]] == ["a1-sub"]


@pytest.mark.parametrize("route", ["steps", "replay"])
async def test_a_run_the_caller_may_not_see_reads_exactly_as_an_unknown_one(tmp_path: Path, route: str) -> None:
    async with ingress(tmp_path) as (http, recorder):
        await record_runs(recorder)

        async def read(run_id: str, token: str) -> httpx.Response:
            return await http.get(f"/api/runs/{run_id}/{route}", headers=bearer(token))

        unknown = await read("no-such-run", BOB)
        refused = {
            "another user's": await read("a1", BOB),
            "an ownerless one": await read("anon", BOB),
            "an agent the grant does not cover": await read("a2", ADA_ECHO),
        }
        assert (await read("a2", ADA)).status_code == 200  # the same run, with a grant that covers it
        anonymous = await http.get(f"/api/runs/a1/{route}")
    assert (unknown.status_code, unknown.json()) == (
        404,
        {"error": "Unknown run no-such-run", "code": "ingress.unknown_run"},
    )
    for what, answer in refused.items():
        run_id = answer.url.path.split("/")[3]
        assert (answer.status_code, answer.json()) == (
            404,
            {"error": f"Unknown run {run_id}", "code": "ingress.unknown_run"},
        ), what
        assert answer.headers.keys() == unknown.headers.keys(), what
    assert (anonymous.status_code, anonymous.json()["code"]) == (401, "ingress.unauthorized")


@pytest.mark.parametrize(
    ("path", "code"),
    [
        pytest.param("/api/runs/a..b/steps", "ingress.bad_request", id="steps-dots"),
        pytest.param("/api/runs/a..b/replay", "ingress.bad_request", id="replay-dots"),
        pytest.param("/api/runs/" + "r" * 200 + "/steps", "ingress.bad_request", id="steps-long"),
        pytest.param("/api/runs/a1'%20OR%20'1'='1/replay", "ingress.bad_request", id="replay-sql"),
        pytest.param("/api/runs/a1/steps?fromSeq=-1", "ingress.bad_request", id="from-negative"),
        pytest.param("/api/runs/a1/steps?max=0", "ingress.bad_request", id="max-zero"),
        pytest.param("/api/runs/a1/steps?max=5001", "ingress.bad_request", id="max-over"),
    ],
)
async def test_a_malformed_run_read_is_a_clear_400(tmp_path: Path, path: str, code: str) -> None:
    async with ingress(tmp_path) as (http, recorder):
        await record_runs(recorder)
        answer = await http.get(path, headers=bearer(ADA))
    assert (answer.status_code, answer.json()["code"]) == (400, code), answer.text


async def test_without_a_tape_the_users_reads_are_absent_behind_the_user_token(tmp_path: Path) -> None:
    async with ingress(tmp_path, tape=False) as (http, _):
        answers = [
            await http.get(p, headers=bearer(ADA)) for p in ("/api/runs", "/api/runs/r1/steps", "/api/runs/r1/replay")
        ]
        anonymous = await http.get("/api/runs")
        with_the_admin_token = await http.get("/api/runs", headers=ADMIN)
    for answer in answers:
        assert (answer.status_code, answer.json()["code"]) == (404, "ingress.absent"), answer.url
    assert (anonymous.status_code, anonymous.json()["code"]) == (401, "ingress.unauthorized")
    assert (with_the_admin_token.status_code, with_the_admin_token.json()["code"]) == (401, "ingress.unauthorized")


# -- the admin's list filters ------------------------------------------------------------------


async def test_the_admin_list_filters_by_user_agent_and_start_time(tmp_path: Path) -> None:
    async with ingress(tmp_path) as (http, recorder):
        await record_runs(recorder)

        async def listed(**params: Any) -> list[str]:
            return ids(await http.get("/api/admin/tape/runs", headers=ADMIN, params=params))

        assert await listed(user="ada") == ["a1-sub", "a2", "a1"]
        assert await listed(user="bob", agent="echo") == ["b1"]
        assert await listed(user=ODD_USER) == ["odd"]
        assert await listed(user="' OR '1'='1") == []  # SQL in a user id is a user id nobody has
        assert await listed(agent="shout") == ["a2"]
        assert await listed(since=2_001, until=4_001) == ["a2", "b1"]
        assert await listed(user="ada", status="completed", limit=2) == ["a1-sub", "a2"]


@pytest.mark.parametrize(
    ("query", "code"),
    [
        pytest.param("agent=a..b", "admin.bad_request", id="agent-dots"),
        pytest.param("agent=" + "a" * 200, "ingress.bad_request", id="agent-long"),
        pytest.param("user=" + "u" * 257, "ingress.bad_request", id="user-long"),
        pytest.param("user=ada%00", "ingress.bad_request", id="user-nul"),
        pytest.param("user=ada%0Abob", "ingress.bad_request", id="user-newline"),
        pytest.param("since=-5", "ingress.bad_request", id="since-negative"),
        pytest.param("since=" + "9" * 30, "ingress.bad_request", id="since-huge"),
        pytest.param("until=abc", "ingress.bad_request", id="until-text"),
    ],
)
async def test_a_malformed_admin_filter_is_a_clear_400(tmp_path: Path, query: str, code: str) -> None:
    async with ingress(tmp_path) as (http, _):
        answer = await http.get(f"/api/admin/tape/runs?{query}", headers=ADMIN)
    assert (answer.status_code, answer.json()["code"]) == (400, code), answer.text
