"""Searching one file store: `glob` over paths and `grep` over lines, each bounded by a deadline.

Matching runs on deadline-bound patterns (`patterns`); files are walked fd-relative, never through
a link (`storeroot`, `dirfd`), and what grep cannot read as text (links, special, over-size,
binary files) is skipped.
"""

from __future__ import annotations

import os
import stat
import time
import unicodedata

from atmosphere.memory.vfs.dirfd import DIR_FLAGS, link_error, lstat_at, read_all, walk_tree
from atmosphere.memory.vfs.filesystem import Hit, WorkspaceError
from atmosphere.memory.vfs.limits import Limits
from atmosphere.memory.vfs.paths import addressable, validate_path
from atmosphere.memory.vfs.patterns import compile_glob, compile_regex, timeout_error
from atmosphere.memory.vfs.storeroot import StoreRoot, classify_open_error


def _split_lines(text: str) -> list[str]:
    lines = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    if lines and not lines[-1]:
        lines.pop()
    return lines


class FileSearch:
    """`glob` and `grep` over one store's files, lock-free (writes are atomic renames)."""

    def __init__(self, tree: StoreRoot, limits: Limits) -> None:
        """Search the files under `tree` within `limits` (hits, line length, pattern length, deadline)."""
        self._tree = tree
        self._limits = limits

    def glob(self, pattern: str) -> list[str]:
        """Files whose relative path matches `pattern`, sorted (see `patterns.glob_regex` for the syntax)."""
        if not isinstance(pattern, str) or not pattern.strip():
            raise WorkspaceError("pattern must not be blank")
        pattern = unicodedata.normalize("NFKC", pattern)
        self._check_pattern_length(pattern)
        matcher = compile_glob(pattern)
        deadline = time.monotonic() + self._limits.grep_deadline
        matches: list[str] = []
        try:
            for path in self._files_under([], ""):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError
                if addressable(path) and matcher.fullmatch(path, timeout=remaining) is not None:
                    matches.append(path)
        except TimeoutError:
            raise timeout_error("glob", pattern, self._limits.grep_deadline) from None
        return matches

    def _check_pattern_length(self, pattern: str) -> None:
        if len(pattern) > self._limits.max_pattern_chars:
            raise WorkspaceError(f"Pattern too long: {len(pattern)} chars (limit {self._limits.max_pattern_chars})")

    def grep(self, pattern: str, directory: str | None = None) -> list[Hit]:
        """Lines matching the regex `pattern`, in files walked in sorted path order.

        `directory` scopes the search (a file path searches that one file). At most
        `max_grep_hits` hits; line text is cut at `grep_line_chars` plus `…`; the whole search
        must finish within `grep_deadline`. Links, hard-linked, over-size and non-UTF-8 (binary)
        files are skipped.
        """
        if not isinstance(pattern, str) or not pattern:
            raise WorkspaceError("pattern must not be blank")
        self._check_pattern_length(pattern)
        matcher = compile_regex(pattern)
        if directory is None or directory.strip() in {"", "."}:
            scope, segments = "", []
        else:
            scope = validate_path(directory)
            segments = scope.split("/")
        deadline = time.monotonic() + self._limits.grep_deadline
        hits: list[Hit] = []
        try:
            for path in self._files_under(segments, scope):
                for number, line in enumerate(self._grep_lines(path), start=1):
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        raise TimeoutError
                    if matcher.search(line, timeout=remaining) is not None:
                        hits.append(Hit(path, number, self._clip(line)))
                        if len(hits) >= self._limits.max_grep_hits:
                            return hits
        except TimeoutError:
            raise timeout_error("grep", pattern, self._limits.grep_deadline) from None
        return hits

    def _grep_lines(self, path: str) -> list[str]:
        """A file's lines, or nothing for files grep skips (links, special, over-size, binary)."""
        limit = self._limits.max_file_bytes
        try:
            opened = self._tree.open_file(path) if addressable(path) else None
        except WorkspaceError:
            opened = None
        if opened is None:
            return []
        fd, st = opened
        try:
            data = read_all(fd, limit + 1) if st.st_size <= limit else b""
        finally:
            os.close(fd)
        try:
            text = data.decode("utf-8") if len(data) <= limit and b"\x00" not in data else ""
        except UnicodeDecodeError:
            text = ""
        return _split_lines(text)

    def _clip(self, line: str) -> str:
        limit = self._limits.grep_line_chars
        return line if len(line) <= limit else line[:limit] + "…"

    def _files_under(self, segments: list[str], display: str) -> list[str]:
        """Regular files under a directory (or the one file `segments` names), sorted by path."""
        if not segments:
            root_fd = self._tree.open_root(create=False)
            return [] if root_fd is None else self._files_in(root_fd, "", 0)
        parent = self._tree.open_parent(segments, display)
        if parent is None:
            return []
        try:
            st = lstat_at(parent, segments[-1])
            if st is None:
                return []
            if stat.S_ISLNK(st.st_mode):
                raise link_error(display)
            if stat.S_ISREG(st.st_mode):
                return [display]
            if not stat.S_ISDIR(st.st_mode):
                return []
            try:
                fd = os.open(segments[-1], DIR_FLAGS, dir_fd=parent)
            except OSError as exc:
                raise classify_open_error(parent, segments[-1], display, display, exc) from None
        finally:
            os.close(parent)
        return self._files_in(fd, display, len(segments))

    @staticmethod
    def _files_in(fd: int, prefix: str, depth: int) -> list[str]:
        """Regular files under directory `fd` (which is closed), sorted by path."""
        try:
            return sorted(node.path for node in walk_tree(fd, prefix, depth) if not node.directory)
        finally:
            os.close(fd)
