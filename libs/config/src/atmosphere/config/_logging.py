"""Logging setup: plain text for people, JSON lines for collectors.

Every line names the process that wrote it: its service and its replica (`host:pid`; in
Kubernetes the host is the pod's name). Where there is one, it also names the run the work is
for (`run_id`, `agent`) and the trace span it belongs to (`trace_id`, `span_id`). This library
knows nothing of the bus or of OpenTelemetry: the caller passes `context`, a function that
answers those fields for the code logging at that moment (`atmosphere.service.log_context`).

Text keeps the message first and adds the fields present at the end (`run=… agent=… trace=…
span=…`); JSON gives each field its own key, and any field a record was given with `extra=`
too (an access line's `status` and `duration_ms`).

Secrets: the values in `redact` (the service's own tokens, keys and passwords:
`secret_values`) are cut out of every formatted line, whatever logged them. That is a net
under the rule that no code logs a secret, not a replacement for it: a token a client sent
that is *not* configured cannot be known here, so the code that handles one never logs it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping
from datetime import UTC, datetime
from typing import Any, TextIO

from pydantic import BaseModel, SecretStr

from atmosphere.config._settings import LogSettings

LogContext = Callable[[], Mapping[str, str]]
"""Answers the context fields (`run_id`, `agent`, `trace_id`, `span_id`) of the code logging now."""

CONTEXT_FIELDS = {"run_id": "run", "agent": "agent", "trace_id": "trace", "span_id": "span"}
"""The context fields, in the order lines show them, with their names in text lines."""

REDACTED = "[redacted]"
MIN_SECRET_CHARS = 8
"""Shorter values are not redacted: cutting a short word out of every line garbles the log (a
grant's token is at least 8 characters; keys and generated passwords are far longer)."""

_RECORD_FIELDS = frozenset(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {
    "message",
    "asctime",
    "taskName",
    "color_message",  # uvicorn's copy of its message with terminal colours
}
"""The attributes every record has: anything else on a record came from `extra=`."""


class _Redactor:
    """Cuts known secrets out of a line: one regular-expression pass, nothing when there are none."""

    def __init__(self, secrets: Iterable[str]) -> None:
        forms = {form for secret in secrets if len(secret) >= MIN_SECRET_CHARS for form in _written(secret)}
        # Longest first: a secret that contains another is cut whole.
        ordered = sorted(forms, key=len, reverse=True)
        self._pattern = re.compile("|".join(map(re.escape, ordered))) if ordered else None

    def __call__(self, line: str) -> str:
        return line if self._pattern is None else self._pattern.sub(REDACTED, line)


def _written(secret: str) -> set[str]:
    """`secret` as a line may hold it: as is, and escaped inside a JSON string."""
    return {secret, json.dumps(secret)[1:-1]}


class _Fields:
    """What every formatter adds to a record: the process, and the context of the code that logged it."""

    def __init__(self, service: str, replica: str, context: LogContext | None) -> None:
        self.service = service
        self.replica = replica
        self._context = context

    def context(self, record: logging.LogRecord) -> dict[str, str]:
        """The context fields of `record`: its own (`extra=`) first, else the logging code's."""
        found: dict[str, str] = {}
        if self._context is not None:
            # A context that fails costs the line its fields, never the line.
            with contextlib.suppress(Exception):
                found.update(self._context())
        for name in CONTEXT_FIELDS:
            own = getattr(record, name, None)
            if own:
                found[name] = str(own)
        return {name: found[name] for name in CONTEXT_FIELDS if found.get(name)}


class _TextFormatter(logging.Formatter):
    """`<time> <LEVEL> <service>[<replica>] <logger>: <message> run=… agent=… trace=… span=…`."""

    def __init__(self, fields: _Fields, redact: Callable[[str], str]) -> None:
        """Name `fields`' process on every line; pass every line through `redact`."""
        where = f"{fields.service}[{fields.replica}]" if fields.replica else fields.service
        super().__init__(f"%(asctime)s %(levelname)-7s {where} %(name)s: %(message)s")
        self._fields = fields
        self._redact = redact

    def formatMessage(self, record: logging.LogRecord) -> str:  # noqa: N802 - logging's name
        """The line before any traceback, the context fields at its end."""
        line = super().formatMessage(record)
        context = self._fields.context(record)
        if not context:
            return line
        return line + "".join(f" {CONTEXT_FIELDS[name]}={value}" for name, value in context.items())

    def format(self, record: logging.LogRecord) -> str:
        """The whole entry (a traceback included), secrets cut out."""
        return self._redact(super().format(record))


class _JsonFormatter(logging.Formatter):
    """One JSON object per line: `ts`, `level`, `service`, `replica`, `logger`, `message`, the context, extras."""

    def __init__(self, fields: _Fields, redact: Callable[[str], str]) -> None:
        """Name `fields`' process on every line; pass every line through `redact`."""
        super().__init__()
        self._fields = fields
        self._redact = redact

    def format(self, record: logging.LogRecord) -> str:
        """The entry as one line of JSON, secrets cut out."""
        entry: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, tz=UTC).isoformat(),
            "level": record.levelname,
            "service": self._fields.service,
        }
        if self._fields.replica:
            entry["replica"] = self._fields.replica
        entry["logger"] = record.name
        entry["message"] = record.getMessage()
        entry.update(self._fields.context(record))
        for name, value in record.__dict__.items():
            if name not in _RECORD_FIELDS and not name.startswith("_"):
                entry.setdefault(name, value)
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        if record.stack_info:
            entry["stack"] = self.formatStack(record.stack_info)
        return self._redact(json.dumps(entry, default=str))


def log_handler(
    settings: LogSettings,
    *,
    service: str,
    replica: str = "",
    context: LogContext | None = None,
    redact: Iterable[str] = (),
    stream: TextIO | None = None,
) -> logging.Handler:
    """The handler `configure_logging` installs, writing to `stream` (default: stderr)."""
    fields = _Fields(service, replica, context)
    redactor = _Redactor(redact)
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(_JsonFormatter(fields, redactor) if settings.json_format else _TextFormatter(fields, redactor))
    return handler


_NOISY_AT_DEBUG = ("aiosqlite", "httpcore", "urllib3", "a2a", "grpc", "mcp", "websockets", "asyncio")


def configure_logging(
    settings: LogSettings,
    *,
    service: str,
    replica: str = "",
    context: LogContext | None = None,
    redact: Iterable[str] = (),
) -> None:
    """Send the root logger to stderr at `settings.level`, every line naming `service` and `replica`.

    `replica` names the process (`atmosphere.service` passes `host:pid`); empty, lines name the
    service alone. `context` answers the run and trace fields of the code that logs (None: no
    such fields); a failing `context` costs a line its fields, never the line. Every value of
    `redact` (at least `MIN_SECRET_CHARS` long) is replaced by `[redacted]` in every line.
    """
    handler = log_handler(settings, service=service, replica=replica, context=context, redact=redact)
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(settings.level)
    # nats-py logs every reconnect attempt at ERROR; our bus logs the meaningful ones.
    logging.getLogger("nats").setLevel(logging.CRITICAL)
    # httpx logs every request at INFO with its whole URL, whose query may hold a key.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    # At DEBUG these libraries dump what they carry: aiosqlite every statement with its
    # parameters (prompts, answers, files), the HTTP clients every connection (the OTLP exporter's
    # too), a2a every task event. `ATMOSPHERE_LOG__LEVEL=DEBUG` is for our own lines; theirs stay at
    # INFO and above.
    for noisy in _NOISY_AT_DEBUG:
        logger = logging.getLogger(noisy)
        logger.setLevel(max(logging.INFO, logging.getLevelNamesMapping()[settings.level]))


SECRET_NAME = re.compile(r"(?:^|_)(?:token|password|passwd|secret|api_?key|private_key|secret_access_key)$", re.I)
"""A field or environment variable whose value is a secret, by its name (`admin_token`,
`LLM_API_KEY`, `ATMOSPHERE_NATS__PASSWORD`, `ANTHROPIC_API_KEY`); `SecretStr` fields are
secrets whatever their name."""
URL_NAME = re.compile(r"(?:^|_)urls?$", re.I)
"""A field or variable holding URLs, whose login (`nats://user:password@host`) is a secret."""
MAX_DEPTH = 8
"""How deep `secret_values` looks into nested settings (they nest a few levels)."""


def secret_values(settings: BaseModel, environ: Mapping[str, str] | None = None) -> frozenset[str]:
    """Every secret `settings` holds, and those of `environ` (default: this process's environment).

    A secret is a `SecretStr` value, a text value of a field or variable named like one
    (`SECRET_NAME`: token grants, admin tokens, API keys, passwords, the model providers' own
    keys), or the password (or token) in a URL's login.
    """
    found = set(_secrets_in(settings, name="", depth=0))
    for name, value in (os.environ if environ is None else environ).items():
        found.update(_secrets_in(value, name=name, depth=0))
    found.discard("")
    return frozenset(found)


def _secrets_in(value: object, *, name: str, depth: int) -> Iterator[str]:
    """The secrets in `value`, the value of a field or variable called `name`."""
    if depth > MAX_DEPTH:
        return
    if isinstance(value, SecretStr):
        yield value.get_secret_value()
    elif isinstance(value, str):
        if SECRET_NAME.search(name):
            yield value
        elif URL_NAME.search(name):
            yield from _url_logins(value)
    elif isinstance(value, BaseModel):
        for field in type(value).model_fields:
            yield from _secrets_in(getattr(value, field, None), name=field, depth=depth + 1)
    elif isinstance(value, Mapping):
        for item in value.values():
            yield from _secrets_in(item, name=name, depth=depth + 1)
    elif isinstance(value, list | tuple | set | frozenset):
        for item in value:
            yield from _secrets_in(item, name=name, depth=depth + 1)


def _url_logins(urls: str) -> Iterator[str]:
    """The password of each comma-separated URL's login, or its token when the login is one word."""
    for url in urls.split(","):
        authority = url.strip().partition("://")[2] or url.strip()
        login, at, _ = authority.partition("/")[0].rpartition("@")
        if at and login:
            user, colon, password = login.partition(":")
            yield password if colon else user
