"""A console's backend through the real stack: two users, each seeing only their own runs.

All six services' real `serve()` on a real nats-server, token grants on ingress and dispatch.
Ada runs `echo` and Bob runs `shout` over SSE; the tape records each run's owner from its
events. Each user's `/api/runs` lists their own run only, the other's run id reads as an unknown
run on steps and replay, no token is 401, and the admin's list shows both with their owners and
filters by user, agent, status and start time. Hostile values are refused with clear 400s.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from atmosphere.bus import NatsBus
from atmosphere.config import AuthOptions, TokenGrant
from atmosphere.ingress.settings import IngressOptions
from atmosphere.testing import run_stack, wait_until

from .conftest import service_map

ADMIN = "admin-token-console"
ADA = "token-ada-console"
BOB = "token-bob-console"
GRANTS = (
    TokenGrant(token=ADA, user_id="ada", name="Ada", roles=("analyst",)),
    TokenGrant(token=BOB, user_id="bob", paths=("/atmosphere/agent/shout",)),
)


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def sse_run(http: httpx.AsyncClient, token: str, agent: str, message: str) -> str:
    """Run `message` on `agent` as the token's user; the run id."""
    answer = await http.post(f"/atmosphere/agent/{agent}", content=message, headers=bearer(token))
    frames = [json.loads(line[6:]) for line in answer.text.splitlines() if line.startswith("data: ")]
    assert frames[-1]["type"] == "complete", frames
    assert frames[0]["key"] == "X-Atmosphere-Run-Id", frames
    return str(frames[0]["value"])


def ids(answer: httpx.Response) -> list[str]:
    assert answer.status_code == 200, answer.text
    return [r["runId"] for r in answer.json()]


@pytest.mark.timeout(180)
async def test_each_user_sees_only_their_own_runs_and_the_admin_sees_both(
    nats_url: str, bus_namespace: str, nats_bus: NatsBus, tmp_path: Path
) -> None:
    services = service_map(
        nats_url,
        bus_namespace,
        tmp_path / "data",
        app="tests.e2e.cross_user_app:app",
        ingress={"ingress": IngressOptions(port=0, auth_tokens=GRANTS), "admin_token": ADMIN},
        dispatch={"ingress": AuthOptions(auth_tokens=GRANTS)},
    )
    async with (
        run_stack(services, bus=nats_bus) as stack,
        httpx.AsyncClient(base_url=await stack.ingress_url(), timeout=20) as http,
    ):
        before = int(time.time() * 1000) - 1
        adas = await sse_run(http, ADA, "echo", "hello from ada")
        bobs = await sse_run(http, BOB, "shout", "hello from bob")

        async def both_recorded() -> bool:
            runs = (await http.get("/api/admin/tape/runs", headers=bearer(ADMIN))).json()
            return {(r["runId"], r["status"]) for r in runs} >= {(adas, "COMPLETED"), (bobs, "COMPLETED")}

        await wait_until(both_recorded, what="the tape to record both runs")

        # Who is calling, and what they may use.
        me = (await http.get("/api/me", headers=bearer(ADA))).json()
        assert me == {
            "authenticated": True,
            "authRequired": True,
            "userId": "ada",
            "name": "Ada",
            "tenant": None,
            "roles": ["analyst"],
        }
        assert (await http.get("/api/me")).status_code == 401
        assert "shout" in [a["name"] for a in (await http.get("/api/agents", headers=bearer(ADA))).json()]
        assert [a["name"] for a in (await http.get("/api/agents", headers=bearer(BOB))).json()] == ["shout"]

        # Each user's own runs, and nobody else's.
        ada_runs = await http.get("/api/runs", headers=bearer(ADA))
        assert ids(ada_runs) == [adas]
        assert (ada_runs.json()[0]["owner"], ada_runs.json()[0]["agent"]) == ("ada", "echo")
        assert ids(await http.get("/api/runs", headers=bearer(BOB))) == [bobs]
        no_token = await http.get("/api/runs")
        assert (no_token.status_code, no_token.json()["code"]) == (401, "ingress.unauthorized")

        # Their own run's steps and replay; the other's reads exactly as an unknown run.
        steps = await http.get(f"/api/runs/{adas}/steps", headers=bearer(ADA))
        assert [s["kind"] for s in steps.json()["steps"]] == ["metadata", "text", "complete"]
        replay = await http.get(f"/api/runs/{bobs}/replay", headers=bearer(BOB))
        assert replay.json()["root"]["output"] == "HELLO FROM BOB"
        for route in ("steps", "replay"):
            unknown = await http.get(f"/api/runs/no-such-run/{route}", headers=bearer(ADA))
            assert unknown.json() == {"error": "Unknown run no-such-run", "code": "ingress.unknown_run"}
            for token, others in ((ADA, bobs), (BOB, adas)):
                refused = await http.get(f"/api/runs/{others}/{route}", headers=bearer(token))
                assert (refused.status_code, refused.json()) == (
                    404,
                    {"error": f"Unknown run {others}", "code": "ingress.unknown_run"},
                )
            anonymous = await http.get(f"/api/runs/{adas}/{route}")
            assert anonymous.status_code == 401

        # The admin sees both, with their owners, and filters.
        async def admin_list(**params: Any) -> list[dict[str, Any]]:
            answer = await http.get("/api/admin/tape/runs", headers=bearer(ADMIN), params=params)
            assert answer.status_code == 200, answer.text
            return list(answer.json())

        owners = {r["runId"]: r["owner"] for r in await admin_list()}
        assert (owners[adas], owners[bobs]) == ("ada", "bob")
        assert [r["runId"] for r in await admin_list(user="ada")] == [adas]
        assert [r["runId"] for r in await admin_list(agent="shout")] == [bobs]
        assert [r["runId"] for r in await admin_list(user="bob", agent="echo")] == []
        assert {r["runId"] for r in await admin_list(status="COMPLETED", since=before)} == {adas, bobs}
        assert await admin_list(since=before + 3_600_000) == []
        assert await admin_list(user="ada' OR '1'='1") == []
        assert (await http.get("/api/admin/tape/runs?user=ada")).status_code == 401  # the admin token, not a user's
        assert (await http.get("/api/admin/tape/runs?user=ada", headers=bearer(ADA))).status_code == 401

        # Hostile values: clear 400s, never a 500.
        for path, headers in (
            ("/api/runs?limit=0", bearer(ADA)),
            ("/api/runs?limit=100000", bearer(ADA)),
            ("/api/runs?since=" + "9" * 25, bearer(ADA)),
            ("/api/runs?status=DROP%20TABLE", bearer(ADA)),
            ("/api/runs?agent=echo%27%20OR%201=1", bearer(ADA)),
            ("/api/runs/a..b/steps", bearer(ADA)),
            ("/api/runs/" + "r" * 300 + "/replay", bearer(ADA)),
            ("/api/admin/tape/runs?user=" + "u" * 300, bearer(ADMIN)),
            ("/api/admin/tape/runs?until=-1", bearer(ADMIN)),
            ("/api/admin/tape/runs?agent=a..b", bearer(ADMIN)),
        ):
            answer = await http.get(path, headers=headers)
            assert answer.status_code == 400, (path, answer.text)
            assert answer.json()["code"].endswith(".bad_request"), (path, answer.text)
