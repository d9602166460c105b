"""1,200 concurrent resumes of one client's run: nobody else notices, the broker holds no consumer for them.

The whole system on a real nats-server, ingress with its default stream limits. Ada opens 1,200
SSE resumes of her own live run at once (what a client gone wrong, or a rolling update of
ingress, does): her share is served and the rest refused plainly (429, `ingress.too_many_streams`),
`ATMO_EVENTS` gains no consumer, bob's new WebSocket run streams its first frame within 2 s,
during the storm and after it, and ingress logs no traceback.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import websockets

from atmosphere.bus import NatsBus, subjects
from atmosphere.config import AuthOptions, TokenGrant
from atmosphere.ingress.settings import IngressOptions
from atmosphere.testing import run_stack, wait_until

from .conftest import service_map
from .wsclient import ws_url

ADA = TokenGrant(token="ada-resumes-a-lot", user_id="ada")
BOB = TokenGrant(token="bob-starts-a-run", user_id="bob")
RESUMES = 1200
PER_CLIENT = 256
"""`ATMOSPHERE_INGRESS__MAX_STREAMS_PER_CLIENT` by default."""
FIRST_FRAME_WITHIN = 2.0


def bearer(grant: TokenGrant) -> dict[str, str]:
    return {"Authorization": f"Bearer {grant.token}"}


async def consumers_on_events(bus: NatsBus) -> int:
    info = await bus.client.jetstream().stream_info(bus.stream_name(subjects.EVENTS_STREAM))
    return info.state.consumer_count


async def first_frame_after(url: str, grant: TokenGrant, prompt: str) -> tuple[float, list[dict[str, Any]]]:
    """Seconds from sending a new run's prompt to its first frame; and the run's frames."""
    async with websockets.connect(ws_url(url, "ticker"), additional_headers=bearer(grant)) as ws:
        sent = time.monotonic()
        await ws.send(prompt)
        frames = [json.loads(await asyncio.wait_for(ws.recv(), 30))]
        took = time.monotonic() - sent
        while frames[-1].get("type") not in {"complete", "error"}:
            frames.append(json.loads(await asyncio.wait_for(ws.recv(), 30)))
    return took, frames


STORM_CLIENT = Path(__file__).with_name("resume_storm_client.py")


async def start_storm(url: str, run_id: str) -> asyncio.subprocess.Process:
    """Ada's client, in a process of its own: `RESUMES` SSE resumes of `run_id` at once."""
    client = await asyncio.create_subprocess_exec(
        sys.executable, str(STORM_CLIENT), url, run_id, ADA.token, str(RESUMES),
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, limit=16 << 20,
    )  # fmt: skip
    assert client.stdout is not None
    assert (await asyncio.wait_for(client.stdout.readline(), 30)).strip() == b"launched"
    return client


async def storm_outcome(client: asyncio.subprocess.Process) -> dict[str, list[Any]]:
    """What each resume got, once every one was served or refused."""
    assert client.stdout is not None
    outcome: dict[str, list[Any]] = json.loads(await asyncio.wait_for(client.stdout.readline(), 120))
    return outcome


async def end_storm(client: asyncio.subprocess.Process) -> None:
    assert client.stdin is not None
    client.stdin.close()
    await asyncio.wait_for(client.wait(), 60)


@pytest.mark.alone
async def test_a_thousand_two_hundred_resumes_of_one_run_silence_nobody(
    nats_url: str, bus_namespace: str, nats_bus: NatsBus, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    services = service_map(
        nats_url,
        bus_namespace,
        tmp_path / "data",
        app="tests.e2e.apps.ticker:app",
        ingress={"ingress": IngressOptions(port=0, auth_tokens=(ADA, BOB))},
        dispatch={"ingress": AuthOptions(auth_tokens=(ADA, BOB))},
    )
    async with run_stack(services, bus=nats_bus) as stack:
        url = await stack.ingress_url()
        baseline = await consumers_on_events(nats_bus)
        async with httpx.AsyncClient(base_url=url, timeout=60) as http:
            # Ada's run: live and quiet for the whole storm (one word, then a minute's pause).
            started = await http.post("/atmosphere/agent/ticker/poll", content="2 60", headers=bearer(ADA))
            run_id = started.json()["runId"]

            async def her_first_word() -> bool:
                polled = await http.get(f"/atmosphere/runs/{run_id}/poll", params={"wait": 1}, headers=bearer(ADA))
                return any(f.get("type") == "streaming-text" for f in polled.json()["frames"])

            await wait_until(her_first_word, timeout=30, what="ada's run to start streaming")

            counts: list[int] = []
            storming = True

            async def watch_consumers() -> None:
                while storming:
                    counts.append(await consumers_on_events(nats_bus))
                    await asyncio.sleep(0.1)

            watcher = asyncio.create_task(watch_consumers())
            storm = await start_storm(url, run_id)
            try:
                # Bob's new runs, one after another for as long as ada's resumes pour in ...
                settling = asyncio.create_task(storm_outcome(storm))
                latencies: list[float] = []
                while not settling.done() or not latencies:
                    took, bobs_frames = await first_frame_after(url, BOB, "3 0")
                    latencies.append(took)
                    assert bobs_frames[-1]["type"] == "complete"
                outcome = await settling
                during = max(latencies)
                # ... and once every one of them is served or refused.
                after, _ = await first_frame_after(url, BOB, "3 0")
            finally:
                storming = False
                await end_storm(storm)
                await watcher

            # Her resumes ended: her share is hers again.
            async def resumable_again() -> bool:
                poll = await http.get(f"/atmosphere/runs/{run_id}/poll", params={"wait": 0}, headers=bearer(ADA))
                return poll.status_code == 200

            await wait_until(resumable_again, timeout=30, what="ada's slots to come back")

    served, refused = outcome["served"], outcome["refused"]
    print(
        f"\n{RESUMES} resumes: {len(served)} served, {len(refused)} refused; consumers on ATMO_EVENTS "
        f"{baseline} before, at most {max(counts)} during; bob's first frame within {during:.3f}s in "
        f"{len(latencies)} runs during the storm, {after:.3f}s after"
    )
    assert IngressOptions().max_streams_per_client == PER_CLIENT  # the default is what is shown
    assert outcome["other"] == []
    assert len(served) == PER_CLIENT
    assert len(refused) == RESUMES - PER_CLIENT
    assert all(first.startswith("id: 1\n") for first in served)
    assert {r["code"] for r in refused} == {"ingress.too_many_streams"}
    assert f"at most {PER_CLIENT} at once" in refused[0]["error"]
    assert max(counts) <= baseline, "resumes created consumers on ATMO_EVENTS"
    assert during < FIRST_FRAME_WITHIN
    assert after < FIRST_FRAME_WITHIN
    tracebacks = [r for r in caplog.records if r.exc_info is not None or "Traceback" in r.getMessage()]
    assert not tracebacks, [f"{r.name}: {r.getMessage()}" for r in tracebacks]
