"""A JavaScript worker: `python -m atmosphere.sandbox.js.worker --timeout-ms=N ...` (see `_arguments`).

Started by `EvalPool`, never by hand. It loads mini-racer (V8), proves it can evaluate `1+1`,
says `ready` (or why not, then exits), and evaluates one request at a time from stdin, each in
a fresh V8 isolate (`engine.evaluate`), writing the replies to stdout (see `protocol`).

Backstops of its own, since V8 can still fail in ways that end the process (which the pool
survives): no core dumps (`RLIMIT_CORE=0`), and a data-segment limit (`RLIMIT_DATA`) at what V8
needs at rest plus a margin over the heap limit, which bounds the memory outside the V8 heap
(ArrayBuffers) that the heap limit does not see: such an allocation fails with a `RangeError`,
or V8 aborts the worker. `RLIMIT_AS` cannot be used: V8 reserves about a terabyte of address
space for its sandbox at start (reserved, not used), so any address-space limit keeps it from
starting.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import os
import resource
import sys
from collections.abc import Callable, Iterator
from types import ModuleType
from typing import IO, Any, Final

from atmosphere.sandbox.js.protocol import MAX_REQUEST_BYTES, FrameError, Limits, Reply, decode, encode

EXIT_UNAVAILABLE: Final = 3
"""The exit status of a worker that could not load or start mini-racer (it said why first)."""
_MIB: Final = 1024 * 1024
_DATA_MARGIN: Final = 128 * _MIB
"""Room in the data limit beyond twice the heap limit: the interpreter, mini-racer's buffers."""


def load_engine() -> ModuleType | str:
    """The `engine` module (which imports mini-racer), or why it cannot be loaded."""
    try:
        # Imported here, not at the top: a worker without mini-racer must still say so in a frame.
        from atmosphere.sandbox.js import engine  # noqa: PLC0415
    except ModuleNotFoundError as exc:
        if (exc.name or "").split(".")[0] == "py_mini_racer":
            return "mini-racer not installed"
        return f"mini-racer could not be loaded: {exc}"
    except Exception as exc:  # a broken install: a missing native library, a failing import inside
        return f"mini-racer could not be loaded: {exc}"
    return engine


def ready_frame(engine: ModuleType, limits: Limits) -> dict[str, Any]:
    """Start V8 and evaluate `1+1`: the `ready` frame, or the frame saying why not."""
    try:
        v8 = engine.v8_version()
        kind, text, _ = engine.evaluate("1+1", limits)
    except Exception as exc:
        return {"ready": False, "reason": f"mini-racer could not start V8: {exc}"}
    if (kind, text) != ("result", "2"):
        return {"ready": False, "reason": f"mini-racer evaluated 1+1 as {kind} {text!r}"}
    return {"ready": True, "version": _version(), "v8": v8, "data_limit": _limit_data(limits.max_memory_bytes)}


def _version() -> str:
    try:
        return importlib.metadata.version("mini-racer")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def _limit_data(max_memory_bytes: int) -> int | None:
    """Cap the data segment at what this process uses now plus room for one evaluation; the cap, or None."""
    in_use = _vm_data_bytes()
    if in_use is None:
        return None
    limit = in_use + 2 * max_memory_bytes + _DATA_MARGIN
    _, hard = resource.getrlimit(resource.RLIMIT_DATA)
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    try:
        resource.setrlimit(resource.RLIMIT_DATA, (limit, limit))
    except (ValueError, OSError):
        return None
    return limit


def _vm_data_bytes() -> int | None:
    """`VmData` of this process (Linux), in bytes."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("VmData:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def requests(stream: IO[bytes]) -> Iterator[bytes | None]:
    """Request lines from `stream` until it ends; `None` for a line over `MAX_REQUEST_BYTES` (skipped)."""
    while line := stream.readline(MAX_REQUEST_BYTES + 1):
        if line.endswith(b"\n") or len(line) <= MAX_REQUEST_BYTES:
            yield line
            continue
        while (rest := stream.readline(MAX_REQUEST_BYTES)) and not rest.endswith(b"\n"):
            pass  # drop the rest of the oversized line
        yield None


Evaluate = Callable[[str, Limits], tuple[Any, str, bool]]


def answer(line: bytes | None, evaluate: Evaluate, limits: Limits) -> Reply:
    """The reply to one request line (id -1 when the line is not a request)."""
    if line is None:
        return Reply(-1, "error", f"the request is over {MAX_REQUEST_BYTES} bytes")
    try:
        request = decode(line)
    except FrameError as exc:
        return Reply(-1, "error", str(exc))
    request_id, code = request.get("id"), request.get("code")
    if not isinstance(request_id, int) or not isinstance(code, str):
        return Reply(-1, "error", "a request needs an integer `id` and a string `code`")
    try:
        kind, text, truncated = evaluate(code, limits)
    except Exception as exc:  # mini-racer itself failed; this worker can still take the next call
        kind, text, truncated = "error", f"the JavaScript engine failed: {type(exc).__name__}: {exc}", False
    return Reply(request_id, kind, text, truncated)


def _protocol_output() -> IO[bytes]:
    """The stream for frames: the original stdout.

    fd 1 now goes to stderr, so that anything native code prints (V8's fatal-error reports) can
    never be mistaken for a frame.
    """
    frames = os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    return frames


def _quiet_closed_loops(unraisable: sys.UnraisableHookArgs) -> None:
    # mini-racer's V8 thread may still report a callback after a closed isolate's event loop is
    # gone; that is the isolate being torn down as intended, not worth a traceback per call.
    if isinstance(unraisable.exc_value, RuntimeError) and "Event loop is closed" in str(unraisable.exc_value):
        return
    sys.__unraisablehook__(unraisable)


def _arguments(argv: list[str] | None) -> Limits:
    parser = argparse.ArgumentParser(prog="atmosphere.sandbox.js.worker", description="A JavaScript worker of eval.")
    parser.add_argument("--timeout-ms", type=int, required=True)
    parser.add_argument("--max-memory-bytes", type=int, required=True)
    parser.add_argument("--max-output-chars", type=int, required=True)
    args = parser.parse_args(argv)
    return Limits(args.timeout_ms / 1000, args.max_memory_bytes, args.max_output_chars)


def main(argv: list[str] | None = None) -> int:
    """Serve requests until stdin ends; the exit status."""
    limits = _arguments(argv)
    with contextlib.suppress(ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    sys.unraisablehook = _quiet_closed_loops
    frames = _protocol_output()
    engine = load_engine()
    ready = {"ready": False, "reason": engine} if isinstance(engine, str) else ready_frame(engine, limits)
    frames.write(encode(ready))
    frames.flush()
    if isinstance(engine, str) or not ready["ready"]:
        return EXIT_UNAVAILABLE
    for line in requests(sys.stdin.buffer):
        frames.write(encode(answer(line, engine.evaluate, limits).frame()))
        frames.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
