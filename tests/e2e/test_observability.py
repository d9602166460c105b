"""What an operator sees of one run, from outside: metrics, one trace across the services, and logs.

`atmosphere dev` runs every service as its own process, exporting traces to a real OTLP
receiver (the collector's protocol, `atmosphere.testing.OtlpReceiver`) and writing JSON logs.
A run enters on HTTP (the OpenAI Responses endpoint) with a W3C `traceparent`, and its agent calls a tool;
then every service's `/metrics` is read with Prometheus's own text parser, the receiver's spans
are checked for one trace covering every hop, and the logs for the run's ids and for secrets.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from atmosphere.testing import (
    OtlpReceiver,
    ReceivedSpan,
    ScriptedModel,
    ToolCallScript,
    Turn,
    wait_until,
)

from .conftest import ROOT
from .dev_process import port_args, port_of, started, wait_for_banner

pytestmark = pytest.mark.timeout(240)

WORKERS = ("dispatch", "governance", "memory", "sandbox", "tape")
"""The services with a probe port, in the order `atmosphere dev` numbers them from the base."""

TRACE_ID = secrets.token_hex(16)
PARENT_SPAN = secrets.token_hex(8)
USER_TOKEN = "user-" + secrets.token_hex(12)
ADMIN_TOKEN = "admin-" + secrets.token_hex(12)


@contextmanager
def dev_stack(tmp_path: Path, env: dict[str, str]) -> Iterator[tuple[subprocess.Popen[bytes], Path, dict[str, int]]]:
    """`atmosphere dev` with the governed test app on free ports; its output in a file."""
    args = port_args()
    ports = {name: port_of(args, f"--{name}-port") for name in ("nats", "http", "grpc")}
    ports["probe"] = port_of(args, "--probe-base-port")
    argv = [str(Path(sys.executable).parent / "atmosphere"), "dev", "--app", "tests.e2e.apps.governed_app:app"]
    log = tmp_path / "dev.log"
    home = ["--home", str(tmp_path / "home"), "--no-model"]
    with started([*argv, *home, *args], cwd=ROOT, env=env, log=log) as process:
        yield process, log, ports


def samples(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Every sample of a `/metrics` body, parsed by Prometheus's own parser (which fails on bad text)."""
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def total(parsed: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str, **labels: str) -> float:
    """The sum of `name`'s samples whose labels include `labels`."""
    wanted = set(labels.items())
    return sum(value for (sample, have), value in parsed.items() if sample == name and wanted <= have)


async def scrape(ports: dict[str, int]) -> dict[str, dict[tuple[str, frozenset[tuple[str, str]]], float]]:
    """Every service's parsed `/metrics`: the workers' probe ports, ingress's HTTP port (admin token)."""
    scraped = {}
    async with httpx.AsyncClient(timeout=10) as client:
        for offset, name in enumerate(WORKERS):
            reply = await client.get(f"http://127.0.0.1:{ports['probe'] + offset}/metrics")
            assert reply.status_code == 200, (name, reply.text)
            assert reply.headers["content-type"].startswith("text/plain"), reply.headers
            scraped[name] = samples(reply.text)
        ingress = f"http://127.0.0.1:{ports['http']}/metrics"
        refused = await client.get(ingress)
        assert refused.status_code == 401, refused.text  # the admin token is set: ingress's port is public
        assert refused.json()["code"] == "admin.unauthorized"
        reply = await client.get(ingress, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
        assert reply.status_code == 200, reply.text
        scraped["ingress"] = samples(reply.text)
    return scraped


def root_of(span: ReceivedSpan, spans: list[ReceivedSpan]) -> ReceivedSpan:
    """The span's farthest ancestor among `spans` (the caller's span is its parent when the tree is whole)."""
    by_id = {s.span_id: s for s in spans}
    while span.parent_span_id in by_id:
        span = by_id[span.parent_span_id]
    return span


def spans_by_service(spans: list[ReceivedSpan]) -> dict[str, list[ReceivedSpan]]:
    by: dict[str, list[ReceivedSpan]] = {}
    for span in spans:
        by.setdefault(span.service, []).append(span)
    return by


async def test_a_runs_metrics_trace_and_logs_as_an_operator_sees_them(tmp_path: Path) -> None:
    provider = ScriptedModel().script(
        Turn.tool_calls(ToolCallScript("read_record", {"record_id": "r-7"}, call_id="call_read")),
        Turn.text("Record r-7 is active.", usage=(40, 6)),
    )
    receiver = OtlpReceiver()
    async with provider.serving(), receiver.serving():
        env = {
            **os.environ,
            "LLM_BASE_URL": provider.base_url,
            "LLM_API_KEY": "sk-provider-" + "k" * 16,
            "GOVERNED_APP_CALLS": str(tmp_path / "calls.txt"),
            "ATMOSPHERE_ADMIN_TOKEN": ADMIN_TOKEN,
            "ATMOSPHERE_INGRESS__AUTH_TOKENS": json.dumps([{"token": USER_TOKEN, "user_id": "alice"}]),
            "ATMOSPHERE_LOG__JSON": "true",
            "ATMOSPHERE_LOG__LEVEL": "DEBUG",  # each service's line per request it handles for a run
            "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint,
            "OTEL_BSP_SCHEDULE_DELAY": "100",  # milliseconds: spans reach the receiver at once
        }
        with dev_stack(tmp_path, env) as (process, log, ports):
            await wait_for_banner(process, log)
            before = await scrape(ports)

            url = f"http://127.0.0.1:{ports['http']}"
            traceparent = f"00-{TRACE_ID}-{PARENT_SPAN}-01"
            async with httpx.AsyncClient(base_url=url, timeout=60) as client:
                # The Responses API: its conversation is memory's (a chat completion's is its client's).
                reply = await client.post(
                    "/atmosphere/v1/responses",
                    json={"model": "records", "input": "Is record r-7 active?"},
                    headers={"Authorization": f"Bearer {USER_TOKEN}", "traceparent": traceparent},
                )
                # A rejected token is refused, and must not reach any log either.
                rejected = await client.post(
                    "/atmosphere/v1/chat/completions",
                    json={"model": "records", "messages": [{"role": "user", "content": "hi"}]},
                    headers={"Authorization": "Bearer wrong-" + USER_TOKEN},
                )
            assert reply.status_code == 200, reply.text
            assert reply.json()["output"][0]["content"][0]["text"] == "Record r-7 is active."
            assert rejected.status_code == 401, rejected.text
            run_id = reply.json()["id"].removeprefix("resp_")

            # Metrics: each service's series parse, and the named ones moved with this run. The tape
            # records a little behind the stream: scraped again until it has recorded the run's steps.
            after = await scrape(ports)

            async def tape_has_the_run() -> bool:
                nonlocal after
                after = await scrape(ports)
                name = "atmosphere_tape_events_recorded_total"
                return total(after["tape"], name) - total(before["tape"], name) >= 5

            await wait_until(tape_has_the_run, timeout=30, interval=0.2, what="the tape to record the run")

            def moved(service: str, name: str, **labels: str) -> float:
                return total(after[service], name, **labels) - total(before[service], name, **labels)

            assert moved("dispatch", "atmosphere_ai_prompts_total", agent="records") == 1
            assert moved("dispatch", "atmosphere_runs_total", agent="records", outcome="complete") == 1
            assert moved("dispatch", "atmosphere_ai_prompt_duration_seconds_count", agent="records") == 1
            assert moved("dispatch", "atmosphere_ai_response_duration_seconds_count", agent="records") == 1
            assert moved("dispatch", "atmosphere_ai_streaming_texts_total", agent="records") >= 1
            assert moved("dispatch", "atmosphere_ai_tool_duration_seconds_count", tool="read_record", outcome="ok") == 1
            assert moved("dispatch", "atmosphere_ai_tokens_total", type="input") == 10 + 40
            assert moved("dispatch", "atmosphere_ai_tokens_total", type="output") == 5 + 6
            assert (
                moved("dispatch", "gen_ai_client_operation_duration_seconds_count", gen_ai_operation_name="chat") == 2
            )
            assert moved("dispatch", "gen_ai_client_token_usage_count", gen_ai_token_type="input") == 2
            assert moved("dispatch", "atmosphere_bus_request_duration_seconds_count", family="tool") == 1
            assert moved("dispatch", "atmosphere_bus_request_duration_seconds_count", family="gov.admit") >= 1
            # Each worker service's own series moved with the run, a counter and a histogram each.
            check_tool = {"kind": "check_tool", "outcome": "admit"}
            assert moved("governance", "atmosphere_governance_decisions_total", **check_tool) == 1
            assert moved("governance", "atmosphere_governance_decision_duration_seconds_count", kind="admit") == 1
            assert moved("sandbox", "atmosphere_sandbox_executions_total", kind="tool", outcome="ok") == 1
            assert moved("sandbox", "atmosphere_sandbox_execution_duration_seconds_count", kind="tool") == 1
            assert moved("memory", "atmosphere_memory_history_writes_total", op="append") >= 1
            assert moved("tape", "atmosphere_tape_events_recorded_total") >= 5  # run id, tool start/result, text...
            assert moved("tape", "atmosphere_tape_batch_size_count") >= 1
            for service in (*WORKERS, "ingress"):
                assert total(after[service], "process_cpu_seconds_total") > 0, service
            for store in ("memory", "governance"):  # the replicated stores caught up with their logs
                assert total(after[store], "atmosphere_replica_lag") == 0, store
            assert "atmosphere_ingress_run_streams" in {name for name, _ in after["ingress"]}

            # Traces: one trace, the caller's, across ingress, dispatch, the model, the tool,
            # governance, memory and the sandbox.
            everywhere = {f"atmosphere-{name}" for name in ("ingress", "dispatch", "governance", "memory", "sandbox")}

            async def whole_trace() -> bool:
                spans = receiver.trace(TRACE_ID)
                # Whole: every service's part, and every span's parent too (the HTTP request's span ends
                # last); then each descends from the caller's span: one tree, rooted at the traceparent.
                return (
                    everywhere <= spans_by_service(spans).keys()
                    and "execute_tool read_record" in {span.name for span in spans}
                    and all(root_of(span, spans).parent_span_id == PARENT_SPAN for span in spans)
                )

            await wait_until(whole_trace, timeout=30, interval=0.2, what="the run's whole trace at the receiver")
            spans = receiver.trace(TRACE_ID)
            by_service = spans_by_service(spans)
            by_id = {span.span_id: span for span in spans}
            run = next(s for s in by_service["atmosphere-dispatch"] if s.name == "invoke_agent records")
            assert run.attributes["atmosphere.run.id"] == run_id
            assert run.attributes["gen_ai.usage.input_tokens"] == 50
            assert run.attributes["gen_ai.response.finish_reasons"] == ["stop"]
            chats = [s for s in by_service["atmosphere-dispatch"] if s.name.startswith("chat ")]
            assert len(chats) == 2, chats
            for chat in chats:
                assert chat.attributes["gen_ai.operation.name"] == "chat"
                assert chat.attributes["gen_ai.provider.name"] == "built-in"
                assert chat.attributes["gen_ai.request.model"]
                assert chat.parent_span_id == run.span_id
            assert sorted(c.attributes["gen_ai.usage.output_tokens"] for c in chats) == [5, 6]
            tool = next(s for s in spans if s.name == "execute_tool read_record")
            assert tool.attributes["gen_ai.tool.call.id"] == "call_read"
            sandbox = [s for s in by_service["atmosphere-sandbox"] if s.name == "handle tool"]
            assert sandbox
            # The sandbox handled the request the tool call's span made (dispatch's `request tool`).
            assert all(by_id[s.parent_span_id].parent_span_id == tool.span_id for s in sandbox), sandbox
            assert any(s.name.startswith("handle gov.") for s in by_service["atmosphere-governance"])
            assert any(s.name.startswith("handle mem.") for s in by_service["atmosphere-memory"])
            assert any(s.kind == 2 for s in by_service["atmosphere-ingress"])  # SERVER: the HTTP request

            os.killpg(process.pid, signal.SIGINT)
            assert process.wait(60) == 0, log.read_text()[-4000:]

    # Logs: JSON lines naming their service; the run's lines on each service carry its run id
    # and trace id; no token of this test appears anywhere.
    text = log.read_text()
    for secret in (USER_TOKEN, ADMIN_TOKEN, env["LLM_API_KEY"]):
        assert secret not in text
    assert "Is record r-7 active?" not in text  # nor the prompt, even at DEBUG
    lines = []
    for raw in text.splitlines():
        _, _, body = raw.partition("| ")
        if body.startswith("{"):
            lines.append(json.loads(body))
    assert {line["service"] for line in lines} >= {*WORKERS, "ingress"}
    assert all(line.get("replica") for line in lines)
    for service in ("ingress", "dispatch", "governance", "memory", "sandbox", "tape"):
        of_run = [line for line in lines if line["service"] == service and line.get("run_id") == run_id]
        assert of_run, f"no log line of {service} names run {run_id}"
        if service != "tape":  # the tape reads the run's events, which carry no trace (per-token cost)
            assert any(line.get("trace_id") == TRACE_ID for line in of_run), of_run
    assert re.search(rf'"trace_id": "{TRACE_ID}"', text)
