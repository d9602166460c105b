"""`atmosphere tape`: watch runs live from NATS, and export the tape as a fine-tuning dataset.

`tape follow` reads a run's events the way every Atmosphere client does (`follow_run`: in seq
order, once each, gaps completed from `ATMO_EVENTS`), so it also replays a finished run. It
connects with the services' own settings (`ATMOSPHERE_NATS__URL`, `ATMOSPHERE_NATS__NAMESPACE`,
what `atmosphere dev` sets), which `--server` and `--namespace` override. `tape export` writes
the tape's finished runs as chat-format JSON lines: it runs the tape service's own export
program (`python -m atmosphere.tape.export_cli`), since the tape owns its database, and a
library never imports a service.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import json
import subprocess
import sys
import time
from collections.abc import AsyncGenerator, Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from google.protobuf.json_format import MessageToDict
from pydantic import ValidationError

from atmosphere.bus import Bus, BusError, ConnectError, subjects, without_login
from atmosphere.bus import connect as connect_bus
from atmosphere.bus.runs import (
    ANSWER_REWOUND_METADATA_KEY,
    TERMINAL_KINDS,
    StreamGapError,
    UnknownRunError,
    follow_run,
)
from atmosphere.config import NatsSettings, ServiceSettings, invalid_settings
from atmosphere.contracts.run.v1.run_pb2 import RunEvent

EXIT_FAILED = 1
"""NATS unreachable, the run's stream broken, the tape database missing or unreadable, the tape not installed."""
EXIT_USAGE = 2
"""Bad flags (argparse's own code), or settings in the environment that do not validate."""
EXIT_INTERRUPTED = 130
"""Ctrl-C while following one run (with `--all`, Ctrl-C is the normal end: 0), or during an export."""
CONNECT_TIMEOUT = 3.0
"""Seconds to reach NATS before saying it cannot be reached."""
HINT_AFTER = 3.0
"""Seconds a run id may stay unknown before `tape follow` says so (and goes on waiting)."""
UNKNOWN_RUN_POLL = 0.5
"""Seconds between looks for the first stored event of a run not known yet."""
SUMMARY_CHARS = 160
"""Where a one-line event summary is cut."""

STREAMED_INLINE = frozenset({"text_delta", "reasoning_delta"})
"""Pieces printed as they come, on one line, instead of a line each."""
NOT_SHOWN_AS_TEXT = frozenset({"tool_call_delta"})
"""Pieces of something printed whole later (`tool_start` carries the full arguments)."""


def add_tape_commands(commands: Any) -> None:
    """Register `tape follow` and `tape export` under `commands` (the top-level subparsers)."""
    tape = commands.add_parser("tape", help="follow runs live; export the tape as a dataset")
    actions = tape.add_subparsers(dest="tape_command", required=True)
    follow = actions.add_parser(
        "follow",
        help="print a run's events as they happen (or every run's, with --all)",
        description=(
            "Print a run's events as they happen: text inline, every other event on a line of its "
            "own. A finished run is replayed; the command exits 0 at the run's last event. A run id "
            "nothing is stored for yet is waited for (with a hint on stderr after a few seconds). "
            "With --all, every run's new events are printed until Ctrl-C."
        ),
    )
    which = follow.add_mutually_exclusive_group(required=True)
    which.add_argument("run_id", nargs="?", type=_run_id, help="the run to follow")
    which.add_argument("--all", action="store_true", help="every run's new events, until Ctrl-C")
    follow.add_argument(
        "--after-seq", type=_seq, default=0, metavar="N", help="only events after seq N (default: from the first)"
    )
    follow.add_argument("--json", action="store_true", help="one JSON object per event instead of text")
    follow.add_argument("--server", help="NATS URL(s), comma-separated (default: $ATMOSPHERE_NATS__URL or local)")
    follow.add_argument(
        "--namespace", type=_namespace, help="the stack's bus namespace (default: $ATMOSPHERE_NATS__NAMESPACE)"
    )
    follow.set_defaults(usage_error=follow.error)
    export = actions.add_parser(
        "export",
        help="write finished runs as chat-format JSON lines (a fine-tuning dataset)",
        description=(
            'Write one {"messages": [...]} line per completed run that has a model input and an '
            "answer. Progress and the closing report go to stderr. Safe while the tape is recording."
        ),
    )
    export.add_argument("out", type=Path, metavar="OUT.jsonl", help="the file to write")
    export.add_argument("--db", type=Path, help="the tape's SQLite file (default: the tape service's own)")
    export.add_argument("--max-runs", type=_seq, default=0, metavar="N", help="at most N runs (default: 0, all)")


def run_tape(args: argparse.Namespace) -> int:
    """Run the `tape` subcommand `args` asks for; the exit status."""
    if args.tape_command == "export":
        return export(args.out, db=args.db, max_runs=args.max_runs)
    if args.after_seq and args.all:
        args.usage_error("--after-seq needs a RUN_ID (with --all only new events are shown)")
    try:
        options = FollowOptions.resolve(args)
    except ValidationError as exc:
        # Never `str(exc)`: pydantic repeats every rejected input, a password or a token included.
        problems = "".join(f"\n  {line}" for line in invalid_settings(exc, ServiceSettings))
        print(f"error: invalid settings in the environment:{problems}", file=sys.stderr)
        return EXIT_USAGE
    try:
        return asyncio.run(follow(options))
    except KeyboardInterrupt:
        return 0 if options.run_id is None else EXIT_INTERRUPTED


# -- follow ------------------------------------------------------------------------------------


def _run_id(value: str) -> str:
    try:
        return subjects.token(value, what="run id")
    except ValueError as exc:
        msg = f"invalid run id {value!r}: use 1-128 letters, digits, '_', '-', ':' or '@'"
        raise argparse.ArgumentTypeError(msg) from exc


def _seq(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        number = -1
    if number < 0:
        msg = f"{value!r} is not a whole number of 0 or more"
        raise argparse.ArgumentTypeError(msg)
    return number


def _namespace(value: str) -> str:
    try:
        return subjects.validate_namespace(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


@dataclass(frozen=True)
class FollowOptions:
    """What `tape follow` follows, where, and how it prints."""

    servers: list[str]
    namespace: str
    run_id: str | None
    """None: every run (`--all`)."""
    after_seq: int = 0
    as_json: bool = False
    login: NatsSettings | None = None
    """The user, password and TLS files of `ATMOSPHERE_NATS__*` (the `observer` role's, say)."""

    @classmethod
    def resolve(cls, args: argparse.Namespace) -> FollowOptions:
        """The flags, with the services' NATS settings where no flag is given.

        Raises:
            ValidationError: the environment's `ATMOSPHERE_*` settings do not validate.
        """
        nats = ServiceSettings().nats
        servers = [s.strip() for s in args.server.split(",") if s.strip()] if args.server else nats.servers
        namespace = nats.namespace if args.namespace is None else args.namespace
        return cls(servers, namespace, args.run_id, args.after_seq, args.json, login=nats)


Connect = Callable[["FollowOptions"], AbstractAsyncContextManager[Bus]]


def connect_nats(options: FollowOptions) -> AbstractAsyncContextManager[Bus]:
    """The bus the services use, in `options.namespace`."""
    login = options.login or NatsSettings()
    return connect_bus(
        options.servers,
        name="atmosphere-tape-follow",
        namespace=options.namespace,
        connect_timeout=CONNECT_TIMEOUT,
        user=login.user,
        password=login.password.get_secret_value(),
        tls_ca=login.tls_ca,
        tls_cert=login.tls_cert,
        tls_key=login.tls_key,
        tls_required=login.tls_required,
    )


async def follow(
    options: FollowOptions,
    *,
    connect: Connect = connect_nats,
    out: TextIO | None = None,
    err: TextIO | None = None,
    hint_after: float = HINT_AFTER,
) -> int:
    """Print events until the run's terminal one (or forever with `--all`); the exit status."""
    out, err = out or sys.stdout, err or sys.stderr
    printer = EventPrinter(out, as_json=options.as_json, all_runs=options.run_id is None)
    try:
        async with connect(options) as bus:
            if options.run_id is None:
                events = every_run(bus, listening=lambda: print(_LISTENING, file=err, flush=True))
            else:
                events = one_run(bus, options.run_id, options.after_seq, hint=_hint(err, options), after=hint_after)
            async with contextlib.aclosing(events) as stream:
                async for event in stream:
                    printer.show(event)
    except ConnectError as exc:
        # A refused login is not a stack that is down: the broker's own words say which.
        print(f"error: cannot connect to NATS at {_shown(options.servers)} ({exc}); is the stack running?", file=err)
        return EXIT_FAILED
    except (StreamGapError, BusError) as exc:
        print(f"error: following stopped: {exc}", file=err)
        return EXIT_FAILED
    finally:
        printer.close()
    return 0


def _shown(servers: list[str]) -> str:
    """The servers as a message may name them: without a login a URL may carry."""
    return ", ".join(map(without_login, servers))


def _hint(err: TextIO, options: FollowOptions) -> Callable[[], None]:
    def hint() -> None:
        where = f"namespace {options.namespace!r}" if options.namespace else "no namespace"
        print(
            f"nothing is stored for run {options.run_id} yet ({where}, {_shown(options.servers)}); "
            "still waiting for it, Ctrl-C to stop. A mistyped id, or another --namespace?",
            file=err,
            flush=True,
        )

    return hint


async def one_run(
    bus: Bus, run_id: str, after_seq: int, *, hint: Callable[[], None], after: float
) -> AsyncGenerator[RunEvent, None]:
    """The run's events after `after_seq` through its terminal one, waiting for a run not stored yet."""
    since = time.monotonic()
    hinted = False
    while True:
        try:
            async with contextlib.aclosing(follow_run(bus, run_id, after_seq=after_seq)) as events:
                async for event in events:
                    yield event
            return
        except UnknownRunError:
            pass  # raised before any event: nothing stored for the run yet
        if not hinted and time.monotonic() - since >= after:
            hint()
            hinted = True
        await asyncio.sleep(UNKNOWN_RUN_POLL)


_LISTENING = "following every run's new events (Ctrl-C to stop)"


async def every_run(bus: Bus, *, listening: Callable[[], None]) -> AsyncGenerator[RunEvent, None]:
    """Every run's events from now on, as they are published; `listening()` once nothing can be missed."""
    async with bus.subscribe(subjects.run_events_all(), RunEvent) as live:
        listening()
        async for envelope in live:
            yield envelope.message


def describe(event: RunEvent) -> dict[str, Any]:
    """One event as plain JSON data: which run, where in it, and the fields of its kind."""
    kind = event.WhichOneof("kind") or "unset"
    line: dict[str, Any] = {"run": event.run_id, "seq": event.seq, "agent": event.agent, "kind": kind}
    if event.origin_run_id:  # forwarded from a sub-run
        line["origin"] = {"run": event.origin_run_id, "agent": event.origin_agent}
    if kind != "unset":
        line["data"] = MessageToDict(getattr(event, kind))
    return line


def summary(event: RunEvent) -> str:
    """What an event says, in one short line."""
    kind = event.WhichOneof("kind") or "unset"
    if kind == "input":
        model = f" for {event.input.model}" if event.input.model else ""
        return f"input: {len(event.input.messages)} messages{model}"
    if kind == "tool_start":
        text = f"tool {event.tool_start.tool_name} {event.tool_start.arguments_json}"
    elif kind == "tool_result":
        text = f"tool {event.tool_result.tool_name} → {event.tool_result.result}"
    elif kind == "tool_error":
        text = f"tool {event.tool_error.tool_name} failed: {event.tool_error.error}"
    elif kind == "error":
        text = f"error {event.error.code}: {event.error.message}"
    elif kind == "metadata":
        text = f"metadata {event.metadata.key} = {event.metadata.value_json}"
    elif kind == "text_complete":
        text = f"text complete ({len(event.text_complete.full_text)} characters)"
    elif kind == "unset":
        text = "an event of a kind this command does not know"
    else:
        fields = MessageToDict(getattr(event, kind))
        text = f"{kind} {json.dumps(fields, separators=(',', ':'))}" if fields else kind
    text = " ".join(text.split())  # one line, whatever the payload holds
    return text if len(text) <= SUMMARY_CHARS else text[: SUMMARY_CHARS - 1] + "…"


class Answers:
    """Each run's own answer text as a client shows it: `ai.run.answer_rewound` applied.

    A resumed run asks the model round that was under way again; when the new answer differs
    from what was sent, the marker says to drop the last N characters before the new text
    follows. Without it, the old answer's start and the new one's rest read as one answer. Only
    a run followed from its first event has a known answer (`--after-seq` misses its start).
    """

    def __init__(self) -> None:
        self._text: dict[str, str] = {}

    def take(self, event: RunEvent) -> int | None:
        """Count `event` in its run's answer; the characters it withdrew if it is a rewind (else None)."""
        if event.origin_run_id:
            return None  # a sub-agent's text, forwarded: not the run's answer
        if event.seq == 1:
            self._text[event.run_id] = ""
        kind = event.WhichOneof("kind")
        text = self._text.get(event.run_id)
        if kind == "text_delta" and text is not None:
            self._text[event.run_id] = text + event.text_delta.text
        elif kind == "metadata" and event.metadata.key == ANSWER_REWOUND_METADATA_KEY:
            discard = discarded(event.metadata.value_json)
            if text is not None:
                self._text[event.run_id] = text[: max(0, len(text) - discard)]
            return discard
        return None

    def of(self, run_id: str) -> str | None:
        """The run's answer so far (None: its start was not followed here)."""
        return self._text.get(run_id)

    def pop(self, run_id: str) -> str | None:
        """The run's answer, forgotten here as the run ended (None: its start was not followed here)."""
        return self._text.pop(run_id, None)


def discarded(value_json: str) -> int:
    """The characters a rewind marker drops (0 for a value that is not `{"discard": N}`)."""
    try:
        discard = json.loads(value_json)["discard"]
    except (ValueError, TypeError, KeyError):
        return 0
    return discard if isinstance(discard, int) and not isinstance(discard, bool) and discard > 0 else 0


class EventPrinter:
    """Prints events as text (streamed pieces inline, the rest a line each) or as JSON lines.

    Printed text cannot be taken back: on an `ai.run.answer_rewound` marker the text form says so
    and prints the run's answer again from its start, as it stands after the drop, so the last
    copy on the screen is the answer. A run's terminal JSON line carries `answer`, likewise.
    """

    def __init__(self, out: TextIO, *, as_json: bool, all_runs: bool) -> None:
        """Write to `out`; with `all_runs`, every line names its run."""
        self._out = out
        self._json = as_json
        self._all_runs = all_runs
        self._streaming: tuple[str, str, str] | None = None
        """Whose pieces the unfinished line holds: run, sub-run, kind."""
        self._answers = Answers()

    def show(self, event: RunEvent) -> None:
        """Print one event."""
        rewound = self._answers.take(event)
        kind = event.WhichOneof("kind") or "unset"
        ends = kind in TERMINAL_KINDS and not event.origin_run_id
        if self._json:
            line = describe(event)
            if ends and (answer := self._answers.pop(event.run_id)) is not None:
                line["answer"] = answer
            self._write(json.dumps(line) + "\n")
            return
        if ends:
            self._answers.pop(event.run_id)
        if kind in NOT_SHOWN_AS_TEXT:
            return
        if kind in STREAMED_INLINE:
            self._piece(event, kind)
            return
        self.close()
        if rewound is not None:
            self._rewind(event, rewound)
            return
        self._write(f"{self._label(event)}#{event.seq} {summary(event)}\n")

    def _rewind(self, event: RunEvent, discard: int) -> None:
        label, answer = self._label(event), self._answers.of(event.run_id)
        if answer is None:
            # Followed from a later seq: the answer's start is not known here to print again.
            self._write(f"{label}#{event.seq} answer rewound: drop the last {discard} characters of the answer\n")
            return
        self._write(f"{label}#{event.seq} answer rewound: {discard} characters withdrawn; the answer again:\n")
        if answer:
            self._write(label + answer)
            self._streaming = (event.run_id, "", "text_delta")  # the new text goes on from here

    def close(self) -> None:
        """End an unfinished line of streamed text."""
        if self._streaming is not None:
            self._streaming = None
            self._write("\n")

    def _piece(self, event: RunEvent, kind: str) -> None:
        whose = (event.run_id, event.origin_run_id, kind)
        if whose != self._streaming:
            self.close()
            thinking = "(thinking) " if kind == "reasoning_delta" else ""
            self._write(self._label(event) + thinking)
            self._streaming = whose
        self._write(event.text_delta.text if kind == "text_delta" else event.reasoning_delta.text)

    def _label(self, event: RunEvent) -> str:
        run = f"{event.run_id} " if self._all_runs else ""
        origin = f"[{event.origin_agent or event.origin_run_id}] " if event.origin_run_id else ""
        return run + origin

    def _write(self, text: str) -> None:
        self._out.write(text)
        self._out.flush()


# -- export ------------------------------------------------------------------------------------


EXPORT_MODULE = "atmosphere.tape.export_cli"
"""The tape service's export program: the tape owns its database, so the export is its own."""
TAPE_PACKAGE = "atmosphere.tape"
"""Looked up (not imported) to tell a missing tape service from a failed export."""


def tape_installed() -> bool:
    """Whether the tape service is installed beside this command (`find_spec` does not import it)."""
    return importlib.util.find_spec(TAPE_PACKAGE) is not None


def export_argv(out: Path, *, db: Path | None, max_runs: int = 0) -> list[str]:
    """The command line that runs the tape's export program with this Python."""
    argv = [sys.executable, "-m", EXPORT_MODULE, "--max-runs", str(max_runs)]
    if db is not None:
        argv += ["--db", str(db)]
    return [*argv, "--", str(out)]  # after `--`, an OUT starting with "-" is still the file


def export(out: Path, *, db: Path | None, max_runs: int = 0) -> int:
    """Run the tape's export of `db` (default: the tape service's) to `out`; its exit status.

    The program shares this terminal: its progress bar and report reach stderr as it writes them.
    """
    if not tape_installed():
        print("error: the tape service (atmosphere-ai-tape) is not installed", file=sys.stderr)
        return EXIT_FAILED
    try:
        finished = subprocess.run(export_argv(out, db=db, max_runs=max_runs), check=False)  # noqa: S603 - our argv
    except KeyboardInterrupt:  # the program got the same Ctrl-C and removed its partial file
        return EXIT_INTERRUPTED
    except OSError as exc:
        print(f"error: cannot start the tape's export: {exc}", file=sys.stderr)
        return EXIT_FAILED
    code = finished.returncode
    return code if code >= 0 else 128 - code  # killed by signal N: 128 + N, as a shell says it
