"""A service's log lines name the run their code works for and the span it runs in."""

from __future__ import annotations

import io
import json
import logging
import os
import socket

from opentelemetry.sdk.trace import TracerProvider

from atmosphere.bus.telemetry import bind_run
from atmosphere.config import LogSettings, log_handler
from atmosphere.service.log_context import log_context


def test_nothing_is_named_outside_a_run_and_a_span() -> None:
    assert log_context() == {}


def test_a_bound_run_is_named() -> None:
    with bind_run("run-1", "echo"):
        assert log_context() == {"run_id": "run-1", "agent": "echo"}
    with bind_run("run-2"):
        assert log_context() == {"run_id": "run-2"}
    assert log_context() == {}


def test_the_current_span_is_named_in_w3c_form() -> None:
    tracer = TracerProvider().get_tracer("test")
    with tracer.start_as_current_span("run") as span, bind_run("run-1", "echo"):
        context = span.get_span_context()
        fields = log_context()
    assert fields == {
        "run_id": "run-1",
        "agent": "echo",
        "trace_id": f"{context.trace_id:032x}",
        "span_id": f"{context.span_id:016x}",
    }
    assert len(fields["trace_id"]) == 32
    assert len(fields["span_id"]) == 16


def lines_of(*, json_format: bool) -> tuple[logging.Logger, io.StringIO]:
    stream = io.StringIO()
    handler = log_handler(
        LogSettings(json=json_format), service="memory", replica="pod-1:7", context=log_context, stream=stream
    )
    logger = logging.getLogger(f"test.log_context.{json_format}")
    logger.handlers[:] = [handler]
    logger.propagate = False
    logger.setLevel(logging.INFO)
    return logger, stream


def test_lines_logged_inside_a_run_and_span_carry_both_text_and_json() -> None:
    tracer = TracerProvider().get_tracer("test")
    for json_format in (False, True):
        logger, stream = lines_of(json_format=json_format)
        logger.info("before")
        with tracer.start_as_current_span("handler") as span, bind_run("run-9", "assistant"):
            logger.info("inside")
        logger.info("after")
        context = span.get_span_context()
        trace_id, span_id = f"{context.trace_id:032x}", f"{context.span_id:016x}"
        before, inside, after = stream.getvalue().splitlines()
        if json_format:
            entries = [json.loads(line) for line in (before, inside, after)]
            assert [e.get("run_id") for e in entries] == [None, "run-9", None]
            assert (entries[1]["agent"], entries[1]["trace_id"], entries[1]["span_id"]) == (
                "assistant",
                trace_id,
                span_id,
            )
            assert all((e["service"], e["replica"]) == ("memory", "pod-1:7") for e in entries)
        else:
            assert before.endswith(": before")
            assert inside.endswith(f": inside run=run-9 agent=assistant trace={trace_id} span={span_id}")
            assert after.endswith(": after")
            assert all(" memory[pod-1:7] " in line for line in (before, inside, after))


def test_the_replica_is_the_instance_the_health_answer_reports() -> None:
    from atmosphere.service._health import process_instance

    assert process_instance() == f"{socket.gethostname()}:{os.getpid()}"
