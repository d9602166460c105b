"""Run `make test`'s independent lanes at once, and say how long each took.

    python scripts/test_lanes.py --live suite 'make pytest' gates 'make lint typecheck' ...

Each lane is a name and a shell command. The `--live` lane prints as it goes (the suite: a
developer watches its progress); the others write to `<logs>/<name>.log`, printed whole once
every lane is done, so no two lanes' lines interleave. Then one line per lane (its exit code and
wall time) and the total. Exits 1 when any lane failed, so CI is red on any of them.

Most of the suite waits on real processes and the broker, not on the CPU, so lanes side by side
cost each other little on two cores; the numbers printed are how that claim is checked.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path


@dataclass
class Lane:
    """One command run beside the others, its output kept in a log or shown as it comes."""

    name: str
    command: str
    log: Path | None
    """Where its output goes; None: to this process's output, as it comes."""
    process: subprocess.Popen[bytes] | None = None
    started: float = 0.0
    seconds: float = 0.0
    code: int | None = None

    def start(self) -> None:
        """Start the command (in a shell: a lane is a command line, as in the Makefile)."""
        output = self.log.open("wb") if self.log is not None else None
        self.started = time.monotonic()
        self.process = subprocess.Popen(  # noqa: S602 - the Makefile's own command lines
            self.command, shell=True, stdout=output, stderr=subprocess.STDOUT
        )
        if output is not None:
            output.close()  # the child holds its own copy

    def wait(self) -> int:
        """Its exit code, once it ended (and how long it took, in `seconds`, taken the first time)."""
        assert self.process is not None
        if self.code is None:
            self.code = self.process.wait()
            self.seconds = time.monotonic() - self.started
        return self.code

    def wait_beside(self) -> threading.Thread:
        """Wait in a thread of its own: each lane's time is taken when it ends, not when asked."""
        waiter = threading.Thread(target=self.wait, name=f"lane-{self.name}", daemon=True)
        waiter.start()
        return waiter


def _parse(argv: list[str]) -> list[Lane]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--logs", type=Path, default=Path(".atmosphere/lanes"), help="where lane logs go")
    parser.add_argument("--live", default="", help="the lane whose output is printed as it comes")
    parser.add_argument("lanes", nargs="+", metavar="NAME COMMAND", help="pairs: a lane's name, then its command")
    args = parser.parse_args(argv)
    if len(args.lanes) % 2:
        parser.error("lanes come in pairs: NAME COMMAND")
    pairs = list(zip(args.lanes[::2], args.lanes[1::2], strict=True))
    names = [name for name, _ in pairs]
    if len(set(names)) != len(names):
        parser.error(f"lane names must differ: {names}")
    if args.live and args.live not in names:
        parser.error(f"--live {args.live!r} is not a lane: {names}")
    args.logs.mkdir(parents=True, exist_ok=True)
    lanes = [Lane(name, command, None if name == args.live else args.logs / f"{name}.log") for name, command in pairs]
    return lanes


def main(argv: list[str]) -> int:
    """Run the lanes in `argv` at once; 0 when every one passed."""
    lanes = _parse(argv)
    began = time.monotonic()
    for lane in lanes:
        lane.start()
    for waiter in [lane.wait_beside() for lane in lanes]:
        waiter.join()
    codes = {lane.name: lane.wait() for lane in lanes}  # each has ended: its code at once
    for lane in lanes:
        if lane.log is not None:
            print(f"\n== lane {lane.name}: {lane.command} (kept in {lane.log}) ==", flush=True)
            sys.stdout.buffer.write(lane.log.read_bytes())
            sys.stdout.flush()
    print("\n== lanes ==")
    for lane in lanes:
        verdict = "ok" if codes[lane.name] == 0 else f"FAILED (exit {codes[lane.name]})"
        print(f"  {lane.name:<8} {_minutes(lane.seconds):>8}  {verdict}")
    print(f"  {'all':<8} {_minutes(time.monotonic() - began):>8}")
    return 0 if all(code == 0 for code in codes.values()) else 1


def _minutes(seconds: float) -> str:
    return f"{int(seconds // 60)}m{seconds % 60:04.1f}s"


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
