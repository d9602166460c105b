"""Log lines name their process and, where there is one, the run and span; secrets never show."""

from __future__ import annotations

import io
import json
import logging
import sys
from collections.abc import Callable, Iterator, Mapping

import pytest
from pydantic import BaseModel, Field, SecretStr

from atmosphere.config import (
    AuthOptions,
    LogSettings,
    NatsSettings,
    ServiceSettings,
    TokenGrant,
    configure_logging,
    log_handler,
    secret_values,
)

RUN = {
    "run_id": "run-7",
    "agent": "echo",
    "trace_id": "0af7651916cd43dd8448eb211c80319c",
    "span_id": "b7ad6b7169203331",
}


class Lines:
    """A logger whose lines go through a handler of `log_handler`, and what it wrote."""

    def __init__(self, handler: logging.Handler, stream: io.StringIO) -> None:
        self.logger = logging.getLogger(f"test.logging.{id(self)}")
        self.logger.propagate = False
        self.logger.setLevel(logging.DEBUG)
        self.logger.addHandler(handler)
        self._stream = stream

    def written(self) -> list[str]:
        return self._stream.getvalue().splitlines()


MakeLines = Callable[..., Lines]


@pytest.fixture
def lines() -> Iterator[MakeLines]:
    made: list[Lines] = []

    def make(*, json_format: bool, context: Mapping[str, str] | None = None, redact: tuple[str, ...] = ()) -> Lines:
        stream = io.StringIO()
        handler = log_handler(
            LogSettings(json=json_format),
            service="dispatch",
            replica="pod-1:7",
            context=(lambda: context) if context is not None else None,
            redact=redact,
            stream=stream,
        )
        made.append(Lines(handler, stream))
        return made[-1]

    yield make
    for each in made:
        each.logger.handlers.clear()


def test_a_text_line_names_the_service_and_replica_and_adds_the_run_and_span_at_its_end(lines: MakeLines) -> None:
    out = lines(json_format=False, context=RUN)
    out.logger.warning("run %s failed: %s", "run-7", "agent.failed")
    [line] = out.written()
    assert " WARNING dispatch[pod-1:7] " in line
    assert line.endswith(
        ": run run-7 failed: agent.failed run=run-7 agent=echo"
        " trace=0af7651916cd43dd8448eb211c80319c span=b7ad6b7169203331"
    )


def test_a_text_line_without_a_run_or_span_has_no_such_fields(lines: MakeLines) -> None:
    out = lines(json_format=False, context={})
    out.logger.info("connected to nats (%s)", "dispatch")
    [line] = out.written()
    assert line.endswith("INFO    dispatch[pod-1:7] " + out.logger.name + ": connected to nats (dispatch)")


def test_only_the_fields_present_are_shown_and_a_records_own_win(lines: MakeLines) -> None:
    out = lines(json_format=False, context={"run_id": "bound", "trace_id": "", "span_id": ""})
    out.logger.info("one")
    out.logger.info("two", extra={"run_id": "own"})
    first, second = out.written()
    assert first.endswith(": one run=bound")
    assert second.endswith(": two run=own")


def test_the_fields_come_before_a_traceback(lines: MakeLines) -> None:
    out = lines(json_format=False, context={"run_id": "run-7"})
    try:
        raise KeyError("boom")
    except KeyError:
        out.logger.exception("agent failed")
    written = out.written()
    assert written[0].endswith(": agent failed run=run-7")
    assert written[1] == "Traceback (most recent call last):"


def test_a_json_line_has_a_key_for_every_field_and_for_extras(lines: MakeLines) -> None:
    out = lines(json_format=True, context=RUN)
    out.logger.info("GET / 200", extra={"status": 200, "duration_ms": 1.5, "color_message": "\x1b[1mGET\x1b[0m"})
    [line] = out.written()
    entry = json.loads(line)
    assert entry["service"] == "dispatch"
    assert entry["replica"] == "pod-1:7"
    assert entry["level"] == "INFO"
    assert entry["message"] == "GET / 200"
    assert {k: entry[k] for k in RUN} == RUN
    assert (entry["status"], entry["duration_ms"]) == (200, 1.5)
    assert "color_message" not in entry


def test_a_json_line_without_a_run_or_span_has_no_such_keys(lines: MakeLines) -> None:
    out = lines(json_format=True, context={})
    out.logger.info("hello")
    entry = json.loads(out.written()[0])
    assert not set(entry) & set(RUN)
    assert {"ts", "level", "service", "replica", "logger", "message"} <= set(entry)


def test_a_failing_context_costs_its_fields_not_the_line() -> None:
    def broken() -> Mapping[str, str]:
        raise RuntimeError("no context")

    stream = io.StringIO()
    handler = log_handler(LogSettings(), service="memory", context=broken, stream=stream)
    record = logging.LogRecord("x", logging.INFO, __file__, 1, "still here", None, None)
    handler.handle(record)
    assert stream.getvalue().rstrip().endswith("memory x: still here")


def test_configured_secrets_are_cut_out_of_every_line_tracebacks_and_json_included(lines: MakeLines) -> None:
    secret = 'tok-"quoted"-1234'
    text = lines(json_format=False, redact=(secret, "pod-1:7"))
    try:
        raise ValueError(f"bad key {secret}")
    except ValueError:
        text.logger.exception("refused %s", secret)
    written = "\n".join(text.written())
    assert secret not in written
    assert "refused [redacted]" in written
    assert "ValueError: bad key [redacted]" in written
    assert "dispatch[pod-1:7]" in written  # under 8 characters: not cut, it would garble every line
    as_json = lines(json_format=True, redact=(secret,))
    as_json.logger.warning("refused %s", secret)
    [line] = as_json.written()
    assert json.loads(line)["message"] == "refused [redacted]"


def test_the_secrets_a_service_holds_are_found_in_its_settings_and_environment() -> None:
    class Llm(BaseModel):
        api_key: str = ""
        max_tokens: int = 10
        prompt_cache_key: str = "auto-cache-key"

    class Remote(BaseModel):
        url: str = ""
        token: SecretStr = SecretStr("")

    class Settings(ServiceSettings):
        ingress: AuthOptions = AuthOptions()
        admin_token: str = ""
        llm: Llm = Llm()
        remotes: dict[str, Remote] = Field(default_factory=dict)

    settings = Settings(
        nats=NatsSettings(url="nats://svc:nats-pass-1@h1:4222,nats://tok-in-url-9@h2", user="svc"),
        ingress=AuthOptions(auth_tokens=(TokenGrant(token="grant-token-1", user_id="ada"),)),
        admin_token="admin-token-1",
        llm=Llm(api_key="sk-llm-key-1"),
        remotes={"b": Remote(url="https://b.example/a2a", token=SecretStr("remote-token-1"))},
    )
    environ = {"ANTHROPIC_API_KEY": "sk-ant-1", "HF_TOKEN": "hf-token-1", "PATH": "/usr/bin", "MAX_TOKENS": "12"}
    found = secret_values(settings, environ)
    assert found == {
        "nats-pass-1",
        "tok-in-url-9",
        "grant-token-1",
        "admin-token-1",
        "sk-llm-key-1",
        "remote-token-1",
        "sk-ant-1",
        "hf-token-1",
    }


def test_the_nats_password_is_a_secret() -> None:
    settings = ServiceSettings(nats=NatsSettings(user="svc", password=SecretStr("hunter2-hunter2")))
    assert secret_values(settings, {}) == {"hunter2-hunter2"}


def test_configure_logging_replaces_the_root_handlers(monkeypatch: pytest.MonkeyPatch) -> None:
    root = logging.getLogger()
    monkeypatch.setattr(root, "handlers", list(root.handlers))
    monkeypatch.setattr(sys, "stderr", io.StringIO())
    level = root.level
    try:
        configure_logging(LogSettings(level="WARNING"), service="tape", replica="h:1", redact=("abcdefgh-secret",))
        [handler] = root.handlers
        assert root.level == logging.WARNING
        assert logging.getLogger("httpx").level == logging.WARNING
        record = logging.LogRecord("x", logging.WARNING, __file__, 1, "key abcdefgh-secret", None, None)
        assert handler.format(record).endswith("tape[h:1] x: key [redacted]")
    finally:
        root.setLevel(level)
