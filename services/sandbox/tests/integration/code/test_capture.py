"""Output capture: both streams at once, each capped, the process stopped past the cap, text cleaned."""

from __future__ import annotations

import asyncio
import os
import signal
import sys

from atmosphere.sandbox.code.capture import capture, clean_text, exit_code, shown


def test_text_is_utf8_without_escapes_or_controls() -> None:
    assert clean_text(b"\x1b[1;31mbold\x1b[0m\ttab\r\n") == "bold\ttab\n"
    assert clean_text(b"\x1b]8;;http://x\x1b\\link\x1b]8;;\x07 \x1bPq#0\x1b\\done") == "link done"
    assert clean_text("caf\u00e9 \u009b31m".encode()) == "caf\u00e9 31m"
    assert clean_text(b"\xff\xfe") == "\ufffd\ufffd"


def test_shown_text_stays_within_the_cap_and_says_it_was_cut() -> None:
    text = shown(b"\xff" * 100, stream="stdout", cap=100, cut=True)  # each bad byte becomes 3 UTF-8 bytes
    body, marker = text.split("\n[", 1)
    assert len(body.encode()) <= 100
    assert marker == "stdout truncated: more than 100 bytes; the code was stopped]\n"
    assert shown(b"ok\n", stream="stderr", cap=100, cut=False) == "ok\n"


def test_exit_codes_read_like_a_shell() -> None:
    assert (exit_code(0), exit_code(3), exit_code(-signal.SIGKILL), exit_code(None)) == (0, 3, 137, -1)


async def _python(code: str) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable, "-c", code, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip


class Stopper:
    """Kills the process (as the sandbox's stop would kill its tree) and counts the calls."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process
        self.calls = 0

    def __call__(self) -> None:
        self.calls += 1
        if self.process.returncode is None:
            os.kill(self.process.pid, signal.SIGKILL)


async def test_a_flood_is_cut_at_the_cap_and_stopped() -> None:
    process = await _python("import sys\nwhile True: sys.stdout.write('y' * 65536)")
    stop = Stopper(process)
    captured = await capture(process, cap=100_000, timeout=10, stop=stop)
    assert (len(captured.stdout), captured.stdout_cut, captured.timed_out) == (100_000, True, False)
    assert captured.exit_code == 137
    assert stop.calls


async def test_both_streams_are_read_at_once_and_stdin_is_fed() -> None:
    code = "import sys\ndata = sys.stdin.read()\nsys.stderr.write('e' * 200_000)\nsys.stdout.write(data.upper())"
    process = await _python(code)
    captured = await capture(process, cap=1_000_000, timeout=10, stop=Stopper(process), stdin=b"hello")
    assert (captured.stdout, len(captured.stderr), captured.cut, captured.exit_code) == (b"HELLO", 200_000, False, 0)


async def test_a_process_past_its_timeout_is_stopped() -> None:
    process = await _python("import time\nprint('start', flush=True)\ntime.sleep(60)")
    captured = await capture(process, cap=1000, timeout=0.5, stop=Stopper(process))
    assert (captured.timed_out, captured.exit_code, captured.stdout) == (True, 137, b"start\n")


async def test_a_flood_still_dying_at_the_timeout_was_stopped_for_its_output_not_its_time() -> None:
    process = await _python("import sys\nwhile True: sys.stdout.write('y' * 65536)")

    kill = Stopper(process)
    calls = 0

    def slow_stop() -> None:  # the cut's stop does not land: the process is still there at the timeout
        nonlocal calls
        calls += 1
        if calls > 1:
            kill()

    captured = await capture(process, cap=100_000, timeout=2, stop=slow_stop)
    assert (captured.stdout_cut, captured.timed_out, captured.exit_code) == (True, False, 137)
