import pytest

from atmosphere.bus import MessageContext, RemoteError, Router, ServiceError
from atmosphere.bus._codec import decode, encode
from atmosphere.bus._router import run_route
from atmosphere.contracts.tape.v1.tape_pb2 import GetStepsRequest, GetStepsResponse


class UnknownRunError(ServiceError):
    code = "tape.unknown_run"


async def test_a_route_cannot_be_registered_twice() -> None:
    router = Router()

    @router.route("a.b", GetStepsRequest)
    async def first(_r: GetStepsRequest, _c: MessageContext) -> None:
        return None

    with pytest.raises(ValueError, match="already routed"):
        router.add("a.b", GetStepsRequest, first)


async def test_service_errors_become_typed_replies_and_other_errors_stay_private() -> None:
    router = Router()

    @router.route("typed", GetStepsRequest)
    async def typed(request: GetStepsRequest, _c: MessageContext) -> GetStepsResponse:
        raise UnknownRunError(f"no run {request.run_id}", details={"run_id": request.run_id})

    @router.route("crash", GetStepsRequest)
    async def crash(_r: GetStepsRequest, _c: MessageContext) -> GetStepsResponse:
        raise RuntimeError("secret database password in this message")

    typed_route, crash_route = router.routes
    data, wire = encode(GetStepsRequest(run_id="r9"))

    reply = await run_route(typed_route, "typed", data, wire)
    assert reply is not None
    with pytest.raises(RemoteError) as raised:
        decode(reply[0], reply[1], GetStepsResponse)
    assert (raised.value.code, raised.value.details) == ("tape.unknown_run", {"run_id": "r9"})

    reply = await run_route(crash_route, "crash", data, wire)
    assert reply is not None
    with pytest.raises(RemoteError) as raised:
        decode(reply[0], reply[1], GetStepsResponse)
    assert raised.value.code == "internal"
    assert "secret" not in raised.value.message


async def test_undecodable_requests_get_a_decode_error_reply() -> None:
    router = Router()
    router.add("x", GetStepsRequest, lambda r, c: None)  # type: ignore[arg-type,return-value]
    reply = await run_route(router.routes[0], "x", b"\xff\xff", None)
    assert reply is not None
    with pytest.raises(RemoteError) as raised:
        decode(reply[0], reply[1], GetStepsResponse)
    assert raised.value.code == "bus.decode"
