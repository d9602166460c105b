"""The first process of a sandbox: join its control groups, bound itself, drop root, become bwrap.

Run as `python -I -S launcher.py <spec JSON>`, standard library only. The order is what makes it
race-free: this process writes its own pid into each `cgroup.procs` *before* it executes anything
else, so bwrap and every process the code starts are born inside the groups (a child inherits its
parent's groups at fork), and no process of the execution ever runs outside them. The rlimits are
set (soft and hard, so the code cannot raise them) while still root, then root is dropped to the
sandbox user, then bwrap replaces this process (same pid: the service's kill and `--die-with-parent`
still reach it).

The spec: `{"cgroups": [procs file, ...], "rlimits": {"RLIMIT_CPU": n, ...}, "uid": n | null,
"gid": n | null, "argv": [bwrap, ...]}`. Failing, it prints `launcher: <why>` and exits 125.
"""

from __future__ import annotations

import json
import os
import resource
import sys
from typing import NoReturn, TypedDict, cast

EXIT_LAUNCH_FAILED = 125


class LaunchSpec(TypedDict):
    """What the launcher does, in order."""

    cgroups: list[str]
    """The `cgroup.procs` files to write our pid to."""
    rlimits: dict[str, int]
    """`resource.RLIMIT_*` name → the soft and hard limit."""
    uid: int | None
    """The user to become (None: stay who we are, e.g. not root)."""
    gid: int | None
    argv: list[str]
    """What to execute (bwrap and its arguments)."""


def _fail(message: str) -> NoReturn:
    sys.stderr.write(f"launcher: {message}\n")
    sys.stderr.flush()
    os._exit(EXIT_LAUNCH_FAILED)


def launch(spec: LaunchSpec) -> None:
    """Join, bound, drop and exec as `spec` says; returns only by failing."""
    pid = str(os.getpid())
    for procs in spec["cgroups"]:
        try:
            with open(procs, "w") as file:
                file.write(pid)
        except OSError as exc:
            _fail(f"cannot join {procs}: {exc.strerror or exc}")
    for name, value in spec["rlimits"].items():
        try:
            resource.setrlimit(getattr(resource, name), (value, value))
        except (OSError, ValueError, AttributeError) as exc:
            _fail(f"cannot set {name}: {exc}")
    os.umask(0o022)
    uid, gid = spec["uid"], spec["gid"]
    if uid is not None and gid is not None:
        try:
            os.setgroups([])
            os.setresgid(gid, gid, gid)
            os.setresuid(uid, uid, uid)
        except OSError as exc:
            _fail(f"cannot become uid {uid}: {exc.strerror or exc}")
    argv = spec["argv"]
    try:
        os.execv(argv[0], argv)  # noqa: S606 - bwrap's argv, built by the service; no shell on purpose
    except OSError as exc:
        _fail(f"cannot run {argv[0]}: {exc.strerror or exc}")


def main() -> None:
    """Entry point: the spec is the only argument."""
    if len(sys.argv) != 2:
        _fail("usage: launcher.py <spec JSON>")
    try:
        spec = cast("LaunchSpec", json.loads(sys.argv[1]))
    except ValueError as exc:
        _fail(f"bad spec: {exc}")
    launch(spec)


if __name__ == "__main__":
    main()
