import pytest

from atmosphere.bus import DecodeError, Headers, RemoteError
from atmosphere.bus._codec import TYPE_HEADER, decode, encode
from atmosphere.contracts.common.v1.common_pb2 import Error
from atmosphere.contracts.run.v1.run_pb2 import RunEvent, TextDelta
from atmosphere.contracts.tape.v1.tape_pb2 import GetStepsRequest


def test_headers_round_trip() -> None:
    headers = Headers(
        traceparent="00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
        msg_id="r1:3",
    )
    wire = headers.to_wire("x.Y")
    assert wire[TYPE_HEADER] == "x.Y"
    assert wire["Nats-Msg-Id"] == "r1:3"
    assert Headers.from_wire(wire) == headers


def test_empty_headers_send_nothing_but_the_type() -> None:
    assert Headers().to_wire(None) == {}
    assert Headers().to_wire("a.B") == {TYPE_HEADER: "a.B"}
    assert Headers.from_wire(None) == Headers()


def test_headers_nobody_reads_are_ignored() -> None:
    # Submissions once carried `atmo-run-id` and `atmo-principal`; nothing trusts such headers.
    assert Headers.from_wire({"atmo-principal": "anything", "atmo-run-id": "r"}) == Headers()


def test_encode_then_decode() -> None:
    event = RunEvent(run_id="r", seq=2, text_delta=TextDelta(text="hi"))
    data, wire = encode(event, Headers(msg_id="r:2"))
    assert decode(data, wire, RunEvent) == event


def test_an_error_payload_raises_remote_error_with_its_code() -> None:
    data, wire = encode(Error(code="tape.unknown", message="no such run", retryable=True, details={"id": "x"}))
    with pytest.raises(RemoteError) as raised:
        decode(data, wire, GetStepsRequest)
    assert raised.value.code == "tape.unknown"
    assert raised.value.message == "no such run"
    assert raised.value.retryable is True
    assert raised.value.details == {"id": "x"}


def test_only_errors_declare_their_type_and_a_mismatch_is_a_decode_error() -> None:
    data, wire = encode(GetStepsRequest(run_id="r"))
    assert wire is None  # nothing to say: no header block at all
    with pytest.raises(DecodeError, match="payload is a"):
        decode(data, {TYPE_HEADER: GetStepsRequest.DESCRIPTOR.full_name}, RunEvent)


def test_bytes_that_are_not_protobuf_are_a_decode_error() -> None:
    with pytest.raises(DecodeError):
        decode(b"\xff\xff\xff\xff", None, RunEvent)
    assert isinstance(DecodeError("x", "y"), ValueError)
