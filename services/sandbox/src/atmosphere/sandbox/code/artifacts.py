"""Collecting the files code left in `/workspace/artifacts`, the host reading nothing else.

Only regular files directly in `artifacts` are taken (no subdirectories, no links, no FIFOs or
devices), each opened with `O_NOFOLLOW | O_NONBLOCK` relative to a descriptor of the directory and
checked with `fstat` after opening (what was opened is what is read, whatever the name points to
by then). At most `max_count` files and `max_bytes` bytes in all are read, in name order; a file
that does not fit whole is dropped, never cut. Collection is followed by emptying the directory.
"""

from __future__ import annotations

import mimetypes
import os
import re
import stat
from typing import Final

from atmosphere.sandbox.code.results import Artifact
from atmosphere.sandbox.code.workspace import ARTIFACTS

_FILE_FLAGS: Final = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
_DIR_FLAGS: Final = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_UNSAFE_NAME = re.compile(r"[\x00-\x1f\x7f-\x9f\[\]()<>`]")
DEFAULT_MIME: Final = "application/octet-stream"


def display_name(name: str) -> str:
    """A file name fit to show: valid UTF-8, no control or markdown-link characters."""
    text = name.encode("utf-8", errors="surrogateescape").decode("utf-8", errors="replace")
    return _UNSAFE_NAME.sub("_", text)


def mime_type(name: str) -> str:
    """The MIME type its name suggests (`application/octet-stream` when it suggests none)."""
    guessed, _encoding = mimetypes.guess_type(name, strict=False)
    return guessed or DEFAULT_MIME


def collect(workspace_fd: int, *, max_count: int, max_bytes: int) -> tuple[list[Artifact], int]:
    """The artifacts (at most `max_count`, `max_bytes` together) and how many files were dropped."""
    try:
        directory = os.open(ARTIFACTS, _DIR_FLAGS, dir_fd=workspace_fd)
    except FileNotFoundError:
        return [], 0
    except OSError:  # a link or a file named `artifacts`: nothing is read through it
        return [], 1
    try:
        return _read_all(directory, max_count=max_count, max_bytes=max_bytes)
    finally:
        os.close(directory)


def _read_all(directory: int, *, max_count: int, max_bytes: int) -> tuple[list[Artifact], int]:
    found: list[Artifact] = []
    dropped = 0
    remaining = max_bytes
    for name in sorted(os.listdir(directory)):
        data = _read_one(directory, name, remaining) if len(found) < max_count else None
        if data is None:
            dropped += 1
            continue
        remaining -= len(data)
        shown = display_name(name)
        found.append(Artifact(name=shown, mime_type=mime_type(shown), data=data))
    return found, dropped


def _read_one(directory: int, name: str, budget: int) -> bytes | None:
    """The whole of regular file `name` if it has at most `budget` bytes; None otherwise."""
    try:
        fd = os.open(name, _FILE_FLAGS, dir_fd=directory)
    except OSError:  # a symbolic link (ELOOP), vanished, unreadable
        return None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_size > budget:
            return None
        chunks = []
        size = 0
        while chunk := os.read(fd, min(budget + 1 - size, 1024 * 1024)):
            chunks.append(chunk)
            size += len(chunk)
            if size > budget:  # grew after the fstat
                return None
        return b"".join(chunks)
    finally:
        os.close(fd)
