"""Follow Atmosphere runs straight from NATS: plain nats-py and the published protobuf contracts.

Every event of a run is a protobuf `RunEvent` (`atmosphere/contracts/run/v1/run.proto`, shipped
inside the `atmosphere-ai-contracts` wheel) published on `atmo.run.<run_id>.evt`, with `seq` from
1, and kept by the JetStream stream `ATMO_EVENTS`. A follower needs nothing else from Atmosphere:

    python examples/followers/follow_runs.py --run <run-id>   # replay one run from seq 1, exit at its end
    python examples/followers/follow_runs.py                  # every new run's events, until Ctrl-C

Each event is printed as one JSON line: `{"run", "seq", "agent", "kind", "data"}`, where `kind` is
the name of the `RunEvent.kind` field that is set (`text_delta`, `tool_start`, `complete`, ...).
A stack started with a bus namespace (`ATMOSPHERE_NATS__NAMESPACE=team`) prefixes every subject
with `team.` and every stream with `TEAM_`: pass `--namespace team`.
"""

# A command-line program: its output is what it prints.
# ruff: noqa: T201

from __future__ import annotations

import argparse
import asyncio
import json
import re
import sys
from typing import Any

import nats
from google.protobuf.json_format import MessageToDict
from nats.errors import NoServersError
from nats.js.api import DeliverPolicy
from nats.js.errors import NotFoundError

from atmosphere.contracts.run.v1.run_pb2 import RunEvent

EVENTS_STREAM = "ATMO_EVENTS"
TERMINAL_KINDS = frozenset({"complete", "error"})
RUN_ID = re.compile(r"[A-Za-z0-9_\-:@]{1,128}")  # one subject token: no dot, no wildcard


def events_subject(namespace: str, run_id: str | None) -> str:
    """`atmo.run.<run_id>.evt`, or every run's events (`*`), under the namespace if any."""
    prefix = f"{namespace}." if namespace else ""
    return f"{prefix}atmo.run.{run_id or '*'}.evt"


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


def ends_a_run(event: RunEvent) -> bool:
    """A terminal event of a top-level run (not one forwarded from, or belonging to, a sub-run)."""
    top_level = not event.parent_run_id and not event.origin_run_id
    return top_level and event.WhichOneof("kind") in TERMINAL_KINDS


async def follow(server: str, namespace: str, run_id: str | None, runs: int) -> int:
    """Print events until `runs` top-level runs have ended (0: forever); the exit status."""
    try:
        client = await nats.connect(server, connect_timeout=5, max_reconnect_attempts=0)
    except (NoServersError, OSError) as exc:
        print(f"error: cannot reach NATS at {server}: {exc}", file=sys.stderr)
        return 2
    try:
        subject = events_subject(namespace, run_id)
        try:
            # An ordered consumer is ephemeral and gap-free: a replay from seq 1 for one run,
            # only what comes next when following every run.
            subscription = await client.jetstream().subscribe(
                subject,
                stream=events_stream(namespace),
                ordered_consumer=True,
                deliver_policy=DeliverPolicy.ALL if run_id else DeliverPolicy.NEW,
            )
        except NotFoundError:
            print(f"error: no stream {events_stream(namespace)}: is the stack running?", file=sys.stderr)
            return 2
        print(f"following {subject}", file=sys.stderr, flush=True)
        ended = 0
        async for message in subscription.messages:
            event = RunEvent.FromString(message.data)
            print(json.dumps(describe(event)), flush=True)
            ended += ends_a_run(event)
            if runs and ended >= runs:
                return 0
        return 0
    finally:
        await client.close()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line; a run id that cannot be a subject token is refused here."""
    parser = argparse.ArgumentParser(description="Print Atmosphere run events from NATS as JSON lines.")
    parser.add_argument("--server", default="nats://127.0.0.1:4222", help="NATS URL (default: %(default)s)")
    parser.add_argument("--namespace", default="", help="the stack's bus namespace, if it has one")
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
        return asyncio.run(follow(args.server, args.namespace, args.run, args.runs))
    except KeyboardInterrupt:
        return 0


if __name__ == "__main__":
    raise SystemExit(main())
