"""Ingress's error classes: each says its code and status; other services' errors are read by class."""

from __future__ import annotations

import pytest

from atmosphere.bus import RemoteError
from atmosphere.bus.errors import ServiceError, catalogue
from atmosphere.contracts.common.v1.common_pb2 import Error
from atmosphere.ingress import errors
from atmosphere.ingress.errors import (
    AdminBadRequestError,
    AdminSurfaceAbsentError,
    AdminUnavailableError,
    BodyError,
    BodyTooLargeError,
    IngressError,
    MalformedJsonError,
    MalformedRequestError,
    RequestTooLargeError,
)
from atmosphere.ingress.frames import error_frame
from atmosphere.ingress.http import _bus_failure


def test_every_ingress_code_is_namespaced_and_registered_once() -> None:
    mine = {code: cls for code, cls in catalogue().items() if cls.__module__ == errors.__name__}
    assert mine, "ingress registers its codes"
    assert all(code.startswith(("ingress.", "admin.")) for code in mine)
    assert all(issubclass(cls, IngressError) for cls in mine.values())


def test_a_too_large_request_is_a_malformed_one_answered_413() -> None:
    # One `except MalformedRequestError` catches both; the status follows from the class alone.
    too_large = RequestTooLargeError("big")
    assert isinstance(too_large, MalformedRequestError)
    assert (too_large.status, too_large.body()) == (413, {"error": "big", "code": "ingress.too_large"})
    assert MalformedRequestError("bad").status == 400


@pytest.mark.parametrize(
    ("body_error", "answer"),
    [
        (BodyError("cut off"), (400, "ingress.bad_request")),
        (BodyTooLargeError(1024), (413, "ingress.too_large")),
        (MalformedJsonError("nope"), (400, "ingress.malformed_json")),
    ],
)
def test_a_body_error_names_the_answer_it_gets(body_error: BodyError, answer: tuple[int, str]) -> None:
    answered = body_error.as_ingress_error()
    assert (answered.status, answered.code) == answer
    assert answered.message == body_error.message


def test_an_error_frame_takes_its_code_from_the_class() -> None:
    frame = error_frame(RequestTooLargeError("The message exceeds 1024 bytes"), session_id="s1")
    assert frame == {
        "type": "error",
        "data": "The message exceeds 1024 bytes",
        "code": "ingress.too_large",
        "recoverable": True,
        "sessionId": "s1",
        "seq": 0,
    }


@pytest.mark.parametrize(
    ("code", "answer"),
    [
        ("memory.not_found", AdminSurfaceAbsentError),
        ("tape.bad_request", AdminBadRequestError),
        ("memory.bad_request", AdminBadRequestError),
        ("internal", AdminUnavailableError),
    ],
)
def test_an_admin_read_refused_by_its_service_keeps_the_meaning(code: str, answer: type[IngressError]) -> None:
    remote = RemoteError(ServiceError.from_proto(Error(code=code, message="why")))
    assert type(_bus_failure("memory", remote)) is answer
