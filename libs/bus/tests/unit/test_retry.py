"""Idempotent requests ride out a responder that is not there yet; answers are final."""

from __future__ import annotations

import asyncio

import pytest

from atmosphere.bus import MessageContext, NoRespondersError, RemoteError, Router, ServiceError, request_retrying
from atmosphere.bus.testing import FakeBus
from atmosphere.contracts.run.v1.run_pb2 import RunEvent


class RefusedError(ServiceError):
    code = "test.refused"


def echo_router(*, refuse: bool = False) -> Router:
    router = Router()

    async def answer(request: RunEvent, _ctx: MessageContext) -> RunEvent:
        if refuse:
            raise RefusedError("no")
        return RunEvent(seq=request.seq + 1)

    router.add("retry.echo", RunEvent, answer)
    return router


async def test_a_responder_that_comes_back_within_the_deadline_answers() -> None:
    bus = FakeBus()

    async def late_responder() -> None:
        await asyncio.sleep(0.2)
        async with bus.serve(echo_router()):
            await asyncio.sleep(1.0)

    responder = asyncio.create_task(late_responder())
    reply = await request_retrying(bus, "retry.echo", RunEvent(seq=1), RunEvent, deadline=3.0)
    assert reply.seq == 2
    responder.cancel()


async def test_nobody_within_the_deadline_is_the_last_error() -> None:
    with pytest.raises(NoRespondersError):
        await request_retrying(FakeBus(), "retry.echo", RunEvent(), RunEvent, deadline=0.3)


async def test_an_error_answer_is_final() -> None:
    bus = FakeBus()
    async with bus.serve(echo_router(refuse=True)):
        with pytest.raises(RemoteError) as refused:
            await request_retrying(bus, "retry.echo", RunEvent(), RunEvent, deadline=5.0)
    assert refused.value.code == "test.refused"
    assert sum(1 for subject, _ in bus.published if subject == "retry.echo") == 1


class NotYetError(ServiceError):
    code = "test.not_yet"
    retryable = True


async def test_an_error_that_says_try_again_is_tried_again_until_it_answers() -> None:
    bus = FakeBus()
    refusals = [NotYetError("catching up"), NotYetError("catching up")]
    router = Router()

    async def answer(request: RunEvent, _ctx: MessageContext) -> RunEvent:
        if refusals:
            raise refusals.pop()
        return RunEvent(seq=request.seq + 1)

    router.add("retry.echo", RunEvent, answer)
    async with bus.serve(router):
        reply = await request_retrying(bus, "retry.echo", RunEvent(seq=1), RunEvent, deadline=5.0)
    assert reply.seq == 2
    assert sum(1 for subject, _ in bus.published if subject == "retry.echo") == 3


async def test_an_error_that_says_try_again_is_the_answer_once_the_deadline_passed() -> None:
    bus = FakeBus()
    router = Router()

    async def answer(_request: RunEvent, _ctx: MessageContext) -> RunEvent:
        raise NotYetError("still catching up")

    router.add("retry.echo", RunEvent, answer)
    async with bus.serve(router):
        with pytest.raises(RemoteError) as refused:
            await request_retrying(bus, "retry.echo", RunEvent(), RunEvent, deadline=0.5)
    assert refused.value.code == "test.not_yet"


async def test_a_responder_that_comes_back_is_found_within_a_quarter_second() -> None:
    # Nobody serves for a while: the waits between tries double, but never beyond 0.25 s while
    # the broker says nobody listens, so a responder that is back is asked at once, not a
    # whole second later.
    bus = FakeBus()
    asking = asyncio.create_task(request_retrying(bus, "retry.echo", RunEvent(seq=1), RunEvent, deadline=10.0))
    await asyncio.sleep(3.0)
    async with bus.serve(echo_router()):
        back = asyncio.get_running_loop().time()
        reply = await asking
        found = asyncio.get_running_loop().time() - back
    assert reply.seq == 2
    assert found <= 0.3, found
