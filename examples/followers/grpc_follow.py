"""Run an agent over gRPC and never lose its answer: resume with `Follow` when the stream breaks.

A `Run` call streams the run's events from the dispatch it reached. If that dispatch goes away
(a deploy, a crash), the call ends with `UNAVAILABLE` but the run goes on: any dispatch replica
can stream the rest with `Follow(run_id, after_seq=<last seq received>)`, each event once.
Only `grpcio` and the published contracts (the `atmosphere-ai-contracts` wheel) are needed:

    python examples/followers/grpc_follow.py --target 127.0.0.1:50051 echo "hello there"
    python examples/followers/grpc_follow.py --target 127.0.0.1:50051 --run <run-id> --after-seq 3

`--target` takes several addresses (comma-separated): after a break the next one is tried. The
answer's text goes to stdout; the run id, resumes and the end go to stderr. With token grants
configured, pass `--token`.

One rule a client must apply to show the answer: after a resume, the model round that was under
way is asked again, and when its new answer differs from what was already sent, the run sends
an `ai.run.answer_rewound` metadata event (`{"discard": N}`): drop the last N characters of the
answer so far; the new text follows. A client that ignores it shows two answers spliced into
one. Printed text cannot be taken back, so this one says so on stderr and prints the answer
again from its start (as it stands after the drop) on a new line of stdout: the last copy on
stdout is the answer.
"""

# A command-line program: its output is what it prints.
# ruff: noqa: T201

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import sys
from collections.abc import AsyncIterable

import grpc

from atmosphere.contracts.dispatch.v1 import dispatch_pb2, dispatch_pb2_grpc

RETRYABLE = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED})
"""What a stream cut by its server going away ends with: the run itself goes on."""
MAX_RESUMES = 20
ANSWER_REWOUND = "ai.run.answer_rewound"


class Progress:
    """Where the client is in the run: its id, the last seq received, and the answer so far."""

    def __init__(self, run_id: str = "", after_seq: int = 0) -> None:
        self.run_id = run_id
        self.last_seq = after_seq
        self.terminal = ""
        self.answer: str | None = "" if after_seq == 0 else None
        """The run's own text so far, every rewind applied (a sub-agent's text is not part of it);
        None when following from a later seq: the answer's start was never received here."""

    def take(self, response: dispatch_pb2.RunResponse) -> None:
        """Note one response: print its text (or apply a rewind), remember its seq."""
        self.run_id = self.run_id or response.run_id
        self.last_seq = response.seq
        event = response.event
        kind = event.WhichOneof("kind")
        if kind == "text_delta" and not event.origin_run_id:
            if self.answer is not None:
                self.answer += event.text_delta.text
            print(event.text_delta.text, end="", flush=True)
        elif kind == "metadata" and event.metadata.key == ANSWER_REWOUND and not event.origin_run_id:
            self.rewind(discarded(event.metadata.value_json))
        elif kind in ("complete", "error"):
            self.terminal = kind
            if kind == "error":
                print(f"\nthe run failed: {response.event.error.message}", file=sys.stderr)

    def rewind(self, discard: int) -> None:
        """Drop the last `discard` characters of the answer; print it again from its start."""
        if self.answer is None:
            print(f"\n[the answer was rewound: drop the last {discard} characters printed]", file=sys.stderr)
            return
        self.answer = self.answer[: max(0, len(self.answer) - discard)]
        print(f"\n[the answer was rewound: {discard} characters withdrawn; the answer again:]", file=sys.stderr)
        print("\n" + self.answer, end="", flush=True)


def discarded(value_json: str) -> int:
    """The characters a rewind marker drops (0 for a value that is not `{"discard": N}`)."""
    try:
        discard = json.loads(value_json)["discard"]
    except (ValueError, TypeError, KeyError):
        return 0
    return discard if isinstance(discard, int) and not isinstance(discard, bool) and discard > 0 else 0


async def stream(
    targets: list[str], first: dispatch_pb2.RunRequest | None, progress: Progress, metadata: tuple[tuple[str, str], ...]
) -> int:
    """`Run` (or `Follow`) on the first target; on a break, `Follow` on the next; the exit status."""
    for attempt, target in zip(range(MAX_RESUMES + 1), itertools.cycle(targets), strict=False):
        async with grpc.aio.insecure_channel(target) as channel:
            stub = dispatch_pb2_grpc.DispatchServiceStub(channel)
            calls: AsyncIterable[dispatch_pb2.RunResponse]
            if attempt == 0 and first is not None:
                calls = stub.Run(first, metadata=metadata)
            else:
                print(f"\n[following run {progress.run_id} after seq {progress.last_seq} on {target}]", file=sys.stderr)
                request = dispatch_pb2.FollowRequest(run_id=progress.run_id, after_seq=progress.last_seq)
                calls = stub.Follow(request, metadata=metadata)
            try:
                async for response in calls:
                    if not progress.run_id:
                        print(f"[run {response.run_id}]", file=sys.stderr)
                    progress.take(response)
                print(file=sys.stderr)
                return 0 if progress.terminal == "complete" else 1
            except grpc.aio.AioRpcError as exc:
                if exc.code() not in RETRYABLE or not progress.run_id:
                    print(f"\nerror: {exc.code().name}: {exc.details()}", file=sys.stderr)
                    return 1
                await asyncio.sleep(min(2.0, 0.1 * 2**attempt))
    print(f"\nerror: gave up after {MAX_RESUMES} resumes", file=sys.stderr)
    return 1


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line: an agent and a message, or `--run` to follow an existing run."""
    parser = argparse.ArgumentParser(description="Run an agent over gRPC; resume with Follow when the stream breaks.")
    parser.add_argument("--target", default="127.0.0.1:50051", help="dispatch address(es), comma-separated")
    parser.add_argument("--token", help="a bearer token (when the deployment has token grants)")
    parser.add_argument("--run", help="follow this existing run instead of starting one")
    parser.add_argument("--after-seq", type=int, default=0, help="with --run: only events after this seq")
    parser.add_argument("agent", nargs="?", help="the agent to run")
    parser.add_argument("message", nargs="?", help="the message to send it")
    args = parser.parse_args(argv)
    if args.run is None and not (args.agent and args.message):
        parser.error("give an agent and a message, or --run RUN_ID")
    if args.after_seq < 0:
        parser.error("--after-seq must be 0 or more")
    return args


def main(argv: list[str] | None = None) -> int:
    """Run (or follow) until the run ends."""
    args = parse_args(argv)
    targets = [t.strip() for t in args.target.split(",") if t.strip()]
    metadata = (("authorization", f"Bearer {args.token}"),) if args.token else ()
    first = None if args.run else dispatch_pb2.RunRequest(agent=args.agent, message=args.message)
    progress = Progress(args.run or "", args.after_seq)
    try:
        return asyncio.run(stream(targets, first, progress, metadata))
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
