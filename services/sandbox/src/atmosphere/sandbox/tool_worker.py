"""`python -m atmosphere.sandbox.tool_worker`: one process that runs the app's `@tool` functions.

Started by `ToolWorkers` (`atmosphere.sandbox.workers`), never by hand. It joins its memory cgroup
(when given one), imports the app the service loaded, says `ready` with its tools, then answers
`call` frames on its request pipe concurrently, each through `run_tool` within the deadline the
call carries, its text cut to the call's limits (so a reply frame stays bounded). A sync tool
that timed out leaves its thread running: the reply asks the parent to recycle this worker.

The pipes are its own (`--requests-fd`, `--replies-fd`); stdout and stderr belong to the tools.
It ends when the request pipe closes, or with its parent (`PR_SET_PDEATHSIG`).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import inspect
import logging
import os
import signal
import sys
from pathlib import Path
from typing import Any

from atmosphere.sandbox.frames import FrameError, decode_text, encode_text, pack, pipe_reader, pipe_writer, read_frame
from atmosphere.sandbox.outcome import ResultLimits, ToolOutcome, parse_arguments, run_tool
from atmosphere.sdk import Tool
from atmosphere.service import AppLoadError, load_service_app

log = logging.getLogger("atmosphere.sandbox.tool_worker")

_PR_SET_PDEATHSIG = 1
EXIT_APP_UNLOADABLE = 3


def _options(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="atmosphere.sandbox.tool_worker", description=__doc__)
    parser.add_argument("--app", required=True)
    parser.add_argument("--app-dir", required=True, type=Path)
    parser.add_argument("--requests-fd", required=True, type=int)
    parser.add_argument("--replies-fd", required=True, type=int)
    parser.add_argument("--max-request-bytes", required=True, type=int)
    parser.add_argument("--parent", required=True, type=int, help="the sandbox's pid: end with it")
    parser.add_argument("--cgroup", type=Path, help="the cgroup.procs file of the memory cgroup to join")
    return parser.parse_args(argv)


def _end_with_parent(parent: int) -> None:
    """Be killed when the sandbox dies, even while a tool blocks this process's event loop."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:  # it died before the line above took effect
        os._exit(1)


def _join(procs: Path | None) -> str:
    """Move this process into its memory cgroup; empty when done (or none given), else why not."""
    if procs is None:
        return ""
    try:
        procs.write_text(str(os.getpid()))
    except OSError as exc:
        return f"cannot join {procs.parent} ({exc.strerror or exc})"
    return ""


class _Worker:
    """Answers the call frames of one request pipe."""

    def __init__(self, tools: dict[str, Tool[Any, Any]], replies: asyncio.StreamWriter) -> None:
        self._tools = tools
        self._replies = replies
        self._calls: dict[int, asyncio.Task[None]] = {}

    async def serve(self, requests: asyncio.StreamReader, max_request_bytes: int) -> None:
        """Answer frames until the pipe closes (or carries something that is not a frame)."""
        try:
            while frame := await read_frame(requests, max_request_bytes):
                header, body = frame
                if header["op"] == "call":
                    self._start(header, body)
                elif header["op"] == "cancel" and (running := self._calls.get(int(header["id"]))) is not None:
                    running.cancel()
        except FrameError as exc:
            log.error("tool worker: the request pipe broke (%s); ending", exc)

    def _start(self, header: dict[str, Any], body: bytes) -> None:
        call_id = int(header["id"])
        task = asyncio.create_task(self._answer(header, body))
        self._calls[call_id] = task
        task.add_done_callback(lambda _: self._calls.pop(call_id, None))

    async def _answer(self, header: dict[str, Any], body: bytes) -> None:
        tool = self._tools.get(str(header["tool"]))
        if tool is None:
            outcome, recycle = ToolOutcome.error(f"Error: this tool worker has no tool {header['tool']}"), False
        else:
            outcome = await self._outcome(tool, header, decode_text(body))
            # A sync tool's thread cannot be stopped: it keeps running past its timeout.
            recycle = outcome.timed_out and not inspect.iscoroutinefunction(tool.func)
        reply = {
            "op": "done",
            "id": header["id"],
            "kind": outcome.kind,
            "truncated": outcome.truncated,
            "timed_out": outcome.timed_out,
        }
        self._replies.write(pack({**reply, "recycle": recycle}, encode_text(outcome.text)))
        await self._replies.drain()

    @staticmethod
    async def _outcome(tool: Tool[Any, Any], header: dict[str, Any], arguments_json: str) -> ToolOutcome:
        arguments = parse_arguments(arguments_json)
        if isinstance(arguments, ToolOutcome):
            return arguments
        outcome = await run_tool(tool, arguments, run_id=str(header["run_id"]), timeout=float(header["timeout"]))
        return ResultLimits(int(header["inline"]), int(header["result"])).shape(outcome, tool.name)


async def _serve(options: argparse.Namespace, joined: str) -> int:
    requests, _ = await pipe_reader(options.requests_fd)
    replies = await pipe_writer(options.replies_fd)
    try:
        app = load_service_app(options.app, options.app_dir)
    except AppLoadError as exc:
        replies.write(pack({"op": "failed", "error": str(exc)}))
        await replies.drain()
        return EXIT_APP_UNLOADABLE
    replies.write(pack({"op": "ready", "tools": sorted(app.tools), "pid": os.getpid(), "cgroup": joined}))
    await replies.drain()
    await _Worker(dict(app.tools), replies).serve(requests, options.max_request_bytes)
    return 0


def main(argv: list[str] | None = None) -> int:
    """Run one tool worker until its request pipe closes."""
    options = _options(argv)
    _end_with_parent(options.parent)
    joined = _join(options.cgroup)  # before the app is imported: no user code runs outside the cgroup
    logging.basicConfig(stream=sys.stderr, level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    # Not `asyncio.run`, nor a normal exit: both wait for the threads of sync tools that never returned.
    code = asyncio.new_event_loop().run_until_complete(_serve(options, joined))
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    sys.exit(main())
