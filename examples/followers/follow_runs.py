"""Follow Atmosphere runs straight from NATS: plain nats-py and the published protobuf contracts.

Every event of a run is a protobuf `RunEvent` (`atmosphere/contracts/run/v1/run.proto`, shipped
inside the `atmosphere-ai-contracts` wheel) published on `atmo.run.<run_id>.evt`, with `seq` from
1, and kept by the JetStream stream `ATMO_EVENTS`. A follower needs nothing else from Atmosphere:

    python examples/followers/follow_runs.py --run <run-id>   # replay one run from seq 1, exit at its end
    python examples/followers/follow_runs.py                  # every new run's events, until Ctrl-C

Each event is printed as one JSON line: `{"run", "seq", "agent", "kind", "data"}`, where `kind` is
the name of the `RunEvent.kind` field that is set (`text_delta`, `tool_start`, `complete`, ...).
A run's terminal line (`complete` or `error`) also carries `"answer"` when the run was followed
from its first event: the run's own text as its client should show it. That is not simply every
`text_delta` joined: a run whose worker died is resumed, the model round that was under way is
asked again, and when the new answer differs, an `ai.run.answer_rewound` metadata event
(`{"discard": N}`) says to drop the last N characters of the answer so far before the new text
follows. Joining the deltas without applying it splices two answers into one (`Answers` below
applies it).

It reads the stream by direct get and hears new events through a plain subscription: no JetStream
consumer, so it works with the `observer` login of `atmosphere bus-credentials` (`--user` and
`--password`, by default `ATMOSPHERE_NATS__USER`/`__PASSWORD`, as `observer.env` sets them). A stack started with a bus
namespace (`ATMOSPHERE_NATS__NAMESPACE=team`) prefixes every subject with `team.` and every stream
with `TEAM_`: pass `--namespace team`.

A plain subscription is at most once: the server does not resend what it could not deliver. So
the stream stays the record: an event that arrives past a gap in its run's seqs, or a run that
goes quiet for two seconds before its end, has the follower read the missing events back by
direct get (from where the stream stood when it started following) and print them in order.
"""

# A command-line program: its output is what it prints.
# ruff: noqa: T201

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import sys
import time
from collections.abc import AsyncIterator
from typing import Any

import nats
from google.protobuf.json_format import MessageToDict
from nats.aio.client import Client
from nats.aio.subscription import Subscription
from nats.errors import NoServersError
from nats.js.errors import NotFoundError

from atmosphere.contracts.run.v1.run_pb2 import RunEvent

EVENTS_STREAM = "ATMO_EVENTS"
TERMINAL_KINDS = frozenset({"complete", "error"})
ANSWER_REWOUND = "ai.run.answer_rewound"
"""Drop the last `discard` characters of the answer so far: a resumed model answered differently."""
QUIET_CHECK = 2.0
"""Seconds without a live event after which unfinished runs are looked up in the stream."""
GIVE_UP_AFTER = 300.0
"""Seconds after which a run with nothing new (its writer gone for good) is no longer looked up."""
RUN_ID = re.compile(r"[A-Za-z0-9_\-:@]{1,128}")  # one subject token: no dot, no wildcard


def events_subject(namespace: str, run_id: str | None) -> str:
    """`atmo.run.<run_id>.evt`, or every run's events (`*`), under the namespace if any."""
    prefix = f"{namespace}." if namespace else ""
    return f"{prefix}atmo.run.{run_id or '*'}.evt"


def inbox_of(user: str) -> str:
    """Where a login's replies come: Atmosphere's permissions let `user` read only `_INBOX_<user>`."""
    return "_INBOX_" + re.sub(r"[^A-Za-z0-9_\-]", "_", user)


def events_stream(namespace: str) -> str:
    """The stream's name: a namespace `team.dev` makes it `TEAM_DEV_ATMO_EVENTS`."""
    prefix = re.sub(r"[.\-]", "_", namespace.upper()) + "_" if namespace else ""
    return prefix + EVENTS_STREAM


def describe(event: RunEvent) -> dict[str, Any]:
    """One event as plain JSON data: who, where in the run, and the fields of its kind."""
    kind = event.WhichOneof("kind") or "unset"
    line: dict[str, Any] = {"run": event.run_id, "seq": event.seq, "agent": event.agent, "kind": kind}
    if event.origin_run_id:  # forwarded from a sub-run (delegation)
        line["origin"] = {"run": event.origin_run_id, "agent": event.origin_agent}
    if kind != "unset":
        line["data"] = MessageToDict(getattr(event, kind))
    return line


class Answers:
    """Each run's own answer text as its client should show it, `ai.run.answer_rewound` applied.

    Only a run followed from its first event (seq 1) has a known answer.
    """

    def __init__(self) -> None:
        self._text: dict[str, str] = {}

    def take(self, event: RunEvent) -> None:
        """Add a text delta of the run's own (not a sub-agent's), or apply a rewind."""
        if event.origin_run_id:
            return  # a sub-agent's text, forwarded: not the run's answer
        if event.seq == 1:
            self._text[event.run_id] = ""
        text = self._text.get(event.run_id)
        if text is None:
            return
        kind = event.WhichOneof("kind")
        if kind == "text_delta":
            self._text[event.run_id] = text + event.text_delta.text
        elif kind == "metadata" and event.metadata.key == ANSWER_REWOUND:
            self._text[event.run_id] = text[: max(0, len(text) - discarded(event.metadata.value_json))]

    def pop(self, run_id: str) -> str | None:
        """The run's answer, forgotten here as its run ended (None: its start was not seen)."""
        return self._text.pop(run_id, None)


def discarded(value_json: str) -> int:
    """The characters a rewind marker drops (0 for a value that is not `{"discard": N}`)."""
    try:
        discard = json.loads(value_json)["discard"]
    except (ValueError, TypeError, KeyError):
        return 0
    return discard if isinstance(discard, int) and not isinstance(discard, bool) and discard > 0 else 0


def ends_a_run(event: RunEvent) -> bool:
    """A terminal event of a top-level run (not one forwarded from, or belonging to, a sub-run)."""
    top_level = not event.parent_run_id and not event.origin_run_id
    return top_level and event.WhichOneof("kind") in TERMINAL_KINDS


def line_of(event: RunEvent, answers: Answers) -> dict[str, Any]:
    """The JSON line of `event`; a run's terminal line carries its answer (every rewind applied)."""
    answers.take(event)
    line = describe(event)
    if line["kind"] in TERMINAL_KINDS and not event.origin_run_id and (answer := answers.pop(event.run_id)) is not None:
        line["answer"] = answer
    return line


async def follow(
    server: str, namespace: str, run_id: str | None, runs: int, *, user: str = "", password: str = ""
) -> int:
    """Print events until `runs` top-level runs have ended (0: forever); the exit status."""
    try:
        # A login reads only its own inbox, `_INBOX_<user>` (other characters than letters,
        # digits, `_` and `-` as `_`): replies, direct gets included, must come there.
        login = {"user": user, "password": password, "inbox_prefix": inbox_of(user)} if user else {}
        client = await nats.connect(server, connect_timeout=5, max_reconnect_attempts=0, **login)
    except (NoServersError, OSError) as exc:
        print(f"error: cannot reach NATS at {server}: {exc}", file=sys.stderr)
        return 2
    try:
        stream = events_stream(namespace)
        try:
            await client.jetstream().stream_info(stream)
        except NotFoundError:
            print(f"error: no stream {stream}: is the stack running?", file=sys.stderr)
            return 2
        subject = events_subject(namespace, run_id)
        # What comes next arrives as it is published (a plain subscription, no JetStream
        # consumer: the observer's login may create none); a replayed run first reads what the
        # stream holds, one message at a time by direct get.
        live = await client.subscribe(subject)
        # The server has the subscription once a round trip after it came back: only then is
        # "following" true (nats-py sends SUB without waiting; a run started at once could
        # otherwise publish its first events before the server knew of this follower).
        await client.flush()
        # Where the stream stood once the subscription was in place: what is stored past it
        # was published since, so an event the subscription missed is read back from there.
        since = 0 if run_id is not None else (await client.jetstream().stream_info(stream)).state.last_seq
        print(f"following {subject}", file=sys.stderr, flush=True)
        return await Tail(client, stream, namespace, since, Printer(runs)).follow(live, replay=run_id is not None)
    finally:
        await client.close()


class Tail:
    """The live events, completed from the stream where the subscription missed some.

    A plain subscription is at most once: the server does not resend what a subscriber did not
    get (a slow consumer, a reconnect, a first event racing the subscription under load). The
    stream has every event, so a run's event that comes past a gap, or a run gone quiet before
    its end, sends the follower to the stream for the missing ones (stored after `since`).
    """

    def __init__(self, client: Client, stream: str, namespace: str, since: int, printer: Printer) -> None:
        self.client = client
        self.stream = stream
        self.namespace = namespace
        self.since = since
        self.printer = printer
        self.looked: dict[str, int] = {}
        """How far in the stream each run's events were looked up."""

    async def follow(self, live: Subscription, *, replay: bool) -> int:
        """Print until enough runs ended (a replay first prints what is stored); the exit status."""
        if replay:
            async for event in stored(self.client, self.stream, live.subject):
                if self.printer.show(event):
                    return 0
        while True:
            try:
                message = await live.next_msg(timeout=QUIET_CHECK)
            except nats.errors.TimeoutError:
                message = None
            if message is None:
                missed = [e for run in self.printer.quiet_runs() for e in await self.missed(run)]
            else:
                event = RunEvent.FromString(message.data)
                gap = event.seq > self.printer.printed.get(event.run_id, 0) + 1
                missed = [*(await self.missed(event.run_id) if gap else []), event]
            for event in missed:
                if self.printer.show(event):
                    return 0

    async def missed(self, run_id: str) -> list[RunEvent]:
        """`run_id`'s events stored since the follower started and not printed yet, in seq order.

        Each look starts where the last one for the run ended: a run quiet for long (a tool at
        work, an approval awaited) costs one direct get per look, not a read of all its events.
        """
        printed = self.printer.printed.get(run_id, 0)
        found: dict[int, RunEvent] = {}
        subject = events_subject(self.namespace, run_id)
        start = self.looked.get(run_id, self.since) + 1
        async for position, event in stored_at(self.client, self.stream, subject, start):
            self.looked[run_id] = position
            if event.seq > printed:
                found[event.seq] = event
        return [found[seq] for seq in sorted(found)]


class Printer:
    """Prints each event of a run once (an event sent again after a failure is not printed twice)."""

    def __init__(self, runs: int) -> None:
        self.runs = runs
        self.ended = 0
        self.answers = Answers()
        self.printed: dict[str, int] = {}
        """The highest seq printed of each run."""
        self.unfinished: dict[str, float] = {}
        """Runs printed but not ended, each with when it last printed something."""

    def show(self, event: RunEvent) -> bool:
        """Print `event` unless it was printed already; whether enough runs have ended."""
        if event.seq <= self.printed.get(event.run_id, 0):
            return False
        self.printed[event.run_id] = event.seq
        print(json.dumps(line_of(event, self.answers)), flush=True)
        if event.WhichOneof("kind") in TERMINAL_KINDS:
            self.unfinished.pop(event.run_id, None)
        else:
            self.unfinished[event.run_id] = time.monotonic()
        self.ended += ends_a_run(event)
        return bool(self.runs) and self.ended >= self.runs

    def quiet_runs(self) -> list[str]:
        """Unfinished runs worth a look in the stream: not those silent for `GIVE_UP_AFTER` seconds."""
        now = time.monotonic()
        return [run for run, last in self.unfinished.items() if now - last < GIVE_UP_AFTER]


async def stored(client: Client, stream: str, subject: str, start: int = 1) -> AsyncIterator[RunEvent]:
    """The run's events stored from stream position `start`, in stream order (by direct get)."""
    async for _, event in stored_at(client, stream, subject, start):
        yield event


async def stored_at(client: Client, stream: str, subject: str, start: int) -> AsyncIterator[tuple[int, RunEvent]]:
    """Each stored event of `subject` from stream position `start`, with its position."""
    jetstream = client.jetstream()
    seq = start
    while True:
        try:
            message = await jetstream.get_msg(stream, seq=seq, subject=subject, next=True, direct=True)
        except NotFoundError:
            return  # nothing stored past `seq` (yet): the live subscription goes on from here
        seq = message.seq or seq
        yield seq, RunEvent.FromString(message.data or b"")
        seq += 1


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line; a run id that cannot be a subject token is refused here."""
    parser = argparse.ArgumentParser(description="Print Atmosphere run events from NATS as JSON lines.")
    parser.add_argument("--server", default="nats://127.0.0.1:4222", help="NATS URL (default: %(default)s)")
    parser.add_argument("--namespace", default="", help="the stack's bus namespace, if it has one")
    parser.add_argument(
        "--user",
        default=os.environ.get("ATMOSPHERE_NATS__USER", ""),
        help="NATS login (default: $ATMOSPHERE_NATS__USER)",
    )
    parser.add_argument(
        "--password",
        default=os.environ.get("ATMOSPHERE_NATS__PASSWORD", ""),
        help="NATS password (default: $ATMOSPHERE_NATS__PASSWORD)",
    )
    parser.add_argument("--run", help="replay this run from its first event and exit at its end")
    parser.add_argument("--runs", type=int, help="exit after this many runs ended (default: 1 with --run, else never)")
    args = parser.parse_args(argv)
    if args.run is not None and not RUN_ID.fullmatch(args.run):
        parser.error(f"invalid run id {args.run!r}: use 1-128 letters, digits, '_', '-', ':' or '@'")
    if args.runs is not None and args.runs < 0:
        parser.error("--runs must be 0 (never stop) or more")
    if args.runs is None:
        args.runs = 1 if args.run else 0
    return args


def main() -> int:
    """Run the follower until it is done or interrupted."""
    args = parse_args()
    try:
        return asyncio.run(
            follow(args.server, args.namespace, args.run, args.runs, user=args.user, password=args.password)
        )
    except KeyboardInterrupt:
        return 0


if __name__ == "__main__":
    raise SystemExit(main())
