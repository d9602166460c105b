"""A governance outage costs runs no slot time, and its end is noticed at once (FakeBus, no mocks of ours).

While nobody serves governance, the first questions ride out what may be a restart (retrying
until the timeout); once the outage is older than that, a question gets one try and is refused
at once, so the run queue does not back up behind runs that wait for nothing. The first answer
after an outage lets every waiting question through, not one backoff later.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator

import pytest

from atmosphere.bus.errors import GovernanceUnavailableError, NoRespondersError
from atmosphere.bus.testing import FakeBus
from atmosphere.contracts.common.v1.common_pb2 import Principal
from atmosphere.contracts.run.v1.run_pb2 import RunSubmission
from atmosphere.dispatch.governance_client import GovernanceClient

from .conftest import Policy, governance_router

TIMEOUT = 1.0


def submission(n: int = 1) -> RunSubmission:
    return RunSubmission(run_id=f"run-{n}", agent="assistant", message="hi", principal=Principal(user_id="ada"))


@contextlib.asynccontextmanager
async def governance(bus: FakeBus) -> AsyncIterator[Policy]:
    policy = Policy()
    async with bus.serve(governance_router(policy), queue="governance"):
        yield policy


async def timed_admission(client: GovernanceClient, n: int) -> tuple[float, BaseException | None]:
    started = time.monotonic()
    try:
        await client.admit(submission(n))
    except GovernanceUnavailableError as exc:
        return time.monotonic() - started, exc
    return time.monotonic() - started, None


async def test_an_outage_older_than_the_timeout_refuses_runs_at_once_fail_closed() -> None:
    client = GovernanceClient(FakeBus(), timeout=TIMEOUT)
    # The first run of an outage rides out what could be a restart: it waits the whole timeout.
    waited, refused = await timed_admission(client, 1)
    assert isinstance(refused, GovernanceUnavailableError)
    assert waited >= TIMEOUT * 0.9
    # The outage is now older than the timeout: the next runs are refused without holding a slot.
    for n in range(2, 5):
        waited, refused = await timed_admission(client, n)
        assert isinstance(refused, GovernanceUnavailableError), n
        assert refused.message == "Request denied: governance is unavailable (fail-closed)"
        assert refused.details == {"retry_after": "1"}  # the OpenAI door's Retry-After
        assert waited < 0.2, waited


async def test_a_broker_away_longer_than_the_timeout_is_no_governance_outage() -> None:
    bus = FakeBus()
    client = GovernanceClient(bus, timeout=TIMEOUT)
    bus.connected = False  # the broker is away: questions fail on this side of the wire
    _, refused = await timed_admission(client, 1)
    assert isinstance(refused, GovernanceUnavailableError)
    assert client.availability.silent_for() == 0.0  # nothing learnt of governance
    bus.connected = True
    # Back, before governance has resubscribed: the next run rides that out instead of being
    # refused at once as if governance had been silent for the whole broker outage.
    admitted = asyncio.create_task(timed_admission(client, 2))
    await asyncio.sleep(0.3)
    async with governance(bus) as policy:
        waited, refused = await admitted
    assert refused is None
    assert waited >= 0.25
    assert [a.run_id for a in policy.admissions] == ["run-2"]


async def test_the_first_run_after_an_outage_is_admitted_and_the_outage_is_over() -> None:
    bus = FakeBus()
    client = GovernanceClient(bus, timeout=TIMEOUT)
    await timed_admission(client, 1)  # an outage, older than the timeout
    assert client.availability.silent_for() >= TIMEOUT * 0.9
    async with governance(bus) as policy:
        waited, refused = await timed_admission(client, 2)
        assert refused is None
        assert waited < 0.2
        assert [a.run_id for a in policy.admissions] == ["run-2"]
        assert client.availability.silent_for() == 0.0


async def test_questions_waiting_in_an_outage_go_through_the_moment_governance_answers() -> None:
    bus = FakeBus()
    client = GovernanceClient(bus, timeout=5.0)
    waiting = [asyncio.create_task(timed_admission(client, n)) for n in range(8)]
    await asyncio.sleep(0.9)  # each is between two tries now, whatever its backoff
    async with governance(bus):
        back = time.monotonic()
        # One question gets an answer (the next run's, here): every waiting one is woken by it.
        assert (await timed_admission(client, 99))[1] is None
        results = await asyncio.gather(*waiting)
        woken = time.monotonic() - back
    assert all(refused is None for _, refused in results)
    assert woken < 0.25, woken


async def test_a_refused_tool_check_in_an_outage_is_no_answer() -> None:
    client = GovernanceClient(FakeBus(), timeout=TIMEOUT)
    with pytest.raises(NoRespondersError):
        await client.check_tool(submission(), "read_record", "{}")
    assert client.availability.silent_for() > 0
