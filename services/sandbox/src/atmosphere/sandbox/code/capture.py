"""One sandboxed process's output: both streams read at once, each capped, then made safe to show.

A stream past its cap is not merely cut: the process is stopped at once (Piston's rule), so a flood
costs no more than the cap to read and keep (the reader holds at most the cap per stream). The
text returned is UTF-8 (bad bytes replaced) with terminal escapes and other control characters
removed, and a stream that was cut ends with a marker line saying so.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

CHUNK_BYTES: Final = 64 * 1024
REAP_SECONDS: Final = 5.0
"""How long a stopped process may take to go (its streams to close) before we stop waiting."""

# CSI (`ESC [ ... final`), OSC (`ESC ] ... BEL` or `ESC \`), DCS/SOS/PM/APC strings, and the other
# escapes (`ESC` + intermediates + a final byte: `ESC c`, `ESC ( B`...).
_ESCAPE = re.compile(
    r"\x1b\[[0-?]*[ -/]*[@-~]"
    r"|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?"
    r"|\x1b[PX^_][^\x1b]*(?:\x1b\\)?"
    r"|\x1b[ -/]*[0-~]"
)
# C0 controls but tab and newline, DEL, and the C1 controls.
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def clean_text(data: bytes) -> str:
    """`data` as text fit to show anywhere: UTF-8 with replacement, escapes and controls removed."""
    return _CONTROL.sub("", _ESCAPE.sub("", data.decode("utf-8", errors="replace")))


def cut_marker(stream: str, cap: int) -> str:
    """The line ending a stream that went past `cap` bytes."""
    return f"\n[{stream} truncated: more than {cap} bytes; the code was stopped]\n"


def shown(data: bytes, *, stream: str, cap: int, cut: bool) -> str:
    """The text returned for a stream's bytes: cleaned, at most `cap` UTF-8 bytes, and marked if `cut`."""
    text = clean_text(data)
    encoded = text.encode("utf-8")
    if len(encoded) > cap:  # replacement characters take 3 bytes where the bad byte took 1
        text = encoded[:cap].decode("utf-8", errors="ignore")
    return text + cut_marker(stream, cap) if cut else text


class CappedStream:
    """The first `cap` bytes of a stream; `cut` once more came."""

    def __init__(self, cap: int) -> None:
        """Keep at most `cap` bytes."""
        self.cap = cap
        self.data = bytearray()
        self.cut = False

    async def drain(self, reader: asyncio.StreamReader, on_overflow: Callable[[], None]) -> None:
        """Read `reader` to its end, keeping the first `cap` bytes; past them call `on_overflow` once.

        What comes after the cap is read and dropped until the end (the process is being stopped):
        a pipe left unread stays paused and open, and with it the process's transport and its
        file descriptors, after the process is gone.
        """
        while chunk := await reader.read(CHUNK_BYTES):
            if self.cut:
                continue
            room = self.cap - len(self.data)
            if len(chunk) > room:
                self.data += chunk[:room]
                self.cut = True
                on_overflow()
            else:
                self.data += chunk


@dataclass(frozen=True, slots=True)
class Captured:
    """What one process printed and how it ended."""

    exit_code: int
    stdout: bytes
    stderr: bytes
    stdout_cut: bool
    stderr_cut: bool
    timed_out: bool

    @property
    def cut(self) -> bool:
        """A stream went past its cap (and the process was stopped for it)."""
        return self.stdout_cut or self.stderr_cut


def exit_code(returncode: int | None) -> int:
    """A shell-style exit code: a death by signal N is 128 + N (as `docker exec` reports it)."""
    if returncode is None:
        return -1
    return 128 - returncode if returncode < 0 else returncode


async def capture(
    process: asyncio.subprocess.Process,
    *,
    cap: int,
    timeout: float,
    stop: Callable[[], None],
    stdin: bytes | None = None,
) -> Captured:
    """Wait for `process` (at most `timeout` seconds), reading its stdout and stderr under `cap` each.

    `stop` must kill the process and everything it started, at once and without blocking; it is
    called when a stream goes past the cap and at the timeout. `stdin`, when given, is written to
    the process's standard input, which is then closed.
    """
    assert process.stdout is not None
    assert process.stderr is not None
    out, err = CappedStream(cap), CappedStream(cap)
    tasks = [
        asyncio.create_task(out.drain(process.stdout, stop)),
        asyncio.create_task(err.drain(process.stderr, stop)),
    ]
    feeder = asyncio.create_task(_feed(process, stdin))
    timed_out = False
    ended = asyncio.create_task(process.wait())
    try:
        # `asyncio.wait` leaves the readers running at the timeout: each reads its stream to the
        # end, which comes as the stopped processes die (a stream left unread stays paused and
        # open, and with it the process's transport and file descriptors).
        _, running = await asyncio.wait([*tasks, ended], timeout=timeout)
        if running:
            # A process already stopped for its output that is still dying at the timeout (a
            # loaded machine, a cap reached late) ended for its output, not its time.
            timed_out = not (out.cut or err.cut)
            stop()
            await asyncio.wait(running, timeout=REAP_SECONDS)
        for reader in tasks:
            if reader.done():
                reader.result()  # a reader's own failure is not swallowed
    finally:
        for task in (*tasks, ended, feeder):
            task.cancel()
        await asyncio.gather(*tasks, ended, feeder, return_exceptions=True)
    return Captured(
        exit_code=exit_code(process.returncode),
        stdout=bytes(out.data),
        stderr=bytes(err.data),
        stdout_cut=out.cut,
        stderr_cut=err.cut,
        timed_out=timed_out,
    )


async def _feed(process: asyncio.subprocess.Process, data: bytes | None) -> None:
    """Write `data` to the process's stdin and close it; a process that stopped reading is no error."""
    if process.stdin is None:
        return
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):
        if data:
            process.stdin.write(data)
            await process.stdin.drain()
        process.stdin.close()
        await process.stdin.wait_closed()
