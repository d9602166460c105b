"""Composite routing: one flat namespace over a conversation's store and prefix-routed shared stores.

`LLM_FILESYSTEM_ROUTES` (`prefix=dir,prefix=dir`) mounts shared stores under path prefixes, e.g.
`memory/=/var/agent-memory`, so every conversation of an owner sees the same `memory/` tree next to
its own files. The model keeps one namespace: paths are passed on unchanged (the prefix is not
stripped), so what a backend lists and finds routes straight back to it.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path

from atmosphere.memory.vfs.filesystem import Entry, FileSystem, Hit, WorkspaceError
from atmosphere.memory.vfs.paths import keyed_routes, route_key, validate_path

# The workspace modules share one logger name, the one operators already filter on.
log = logging.getLogger("atmosphere.memory.workspace")


class CompositeFileSystem:
    """One flat namespace over a default store and prefix-routed stores.

    A path routes to the longest route key it equals or lies under (segment-aware: `memory` does
    not route `memoryx`); the path is passed on unchanged. Root `ls`, `glob` and root `grep` fan out.
    """

    def __init__(self, default: FileSystem, routes: Mapping[str, FileSystem], *, max_grep_hits: int = 500) -> None:
        """Validate the route keys (like paths, one trailing `/` dropped; duplicates rejected)."""
        keyed = keyed_routes(routes)
        self._default = default
        self._routes = sorted(keyed.items(), key=lambda item: len(item[0]), reverse=True)
        self._max_grep_hits = max_grep_hits
        backends: list[FileSystem] = [default]
        for backend in keyed.values():
            if all(backend is not seen for seen in backends):
                backends.append(backend)
        self._backends = backends

    def _route_norm(self, norm: str) -> FileSystem:
        for key, backend in self._routes:
            if norm == key or norm.startswith(key + "/"):
                return backend
        return self._default

    def route(self, path: str) -> FileSystem:
        """The backend `path` routes to (the path is validated first)."""
        return self._route_norm(validate_path(path))

    def _spans_routes(self, norm: str) -> bool:
        """Whether some route key lies strictly beneath `norm` (a subtree split across backends)."""
        return any(key.startswith(norm + "/") for key, _ in self._routes)

    def ls(self, directory: str | None = None) -> list[Entry]:
        """Root: every backend's root entries merged (first wins); scoped: the routed backend's."""
        if directory is not None and directory.strip() not in {"", "."}:
            return self.route(directory).ls(directory)
        merged: dict[str, Entry] = {}
        for backend in self._backends:
            for entry in backend.ls(None):
                merged.setdefault(entry.path, entry)
        return sorted(merged.values(), key=lambda entry: (not entry.directory, entry.path))

    def read(self, path: str) -> str:
        """Read from the routed backend."""
        return self.route(path).read(path)

    def write(self, path: str, content: str) -> None:
        """Write to the routed backend."""
        self.route(path).write(path, content)

    def edit(self, path: str, old_text: str, new_text: str) -> None:
        """Edit in the routed backend."""
        self.route(path).edit(path, old_text, new_text)

    def glob(self, pattern: str) -> list[str]:
        """Every backend's matches that route back to it, deduplicated and sorted."""
        found: set[str] = set()
        for backend in self._backends:
            found.update(path for path in backend.glob(pattern) if self._route_norm(path) is backend)
        return sorted(found)

    def grep(self, pattern: str, directory: str | None = None) -> list[Hit]:
        """Root: every backend's hits (that route back to it), concatenated; scoped: one backend."""
        if directory is not None and directory.strip() not in {"", "."}:
            return self.route(directory).grep(pattern, directory)
        hits: list[Hit] = []
        for backend in self._backends:
            hits.extend(hit for hit in backend.grep(pattern) if self._route_norm(hit.path) is backend)
            if len(hits) >= self._max_grep_hits:
                return hits[: self._max_grep_hits]
        return hits

    def delete(self, path: str) -> None:
        """Delete in the routed backend."""
        self.route(path).delete(path)

    def rename(self, old_path: str, new_path: str) -> None:
        """Rename within one backend; a rename spanning backends fails loud."""
        old, new = validate_path(old_path), validate_path(new_path)
        source, target = self._route_norm(old), self._route_norm(new)
        if source is not target or self._spans_routes(old) or self._spans_routes(new):
            msg = (
                f"cross-backend rename is not supported: {old} -> {new} "
                "(source and destination route to different backends)"
            )
            raise WorkspaceError(msg)
        source.rename(old_path, new_path)

    def usage(self) -> tuple[int, int]:
        """(files, bytes) summed over the backends."""
        files = total = 0
        for backend in self._backends:
            count, size = backend.usage()
            files += count
            total += size
        return files, total


def parse_routes(text: str | None) -> dict[str, Path]:
    """Parse `LLM_FILESYSTEM_ROUTES` (`prefix=dir,prefix=dir`) into {route key: dir}.

    Malformed entries (no `=`, blank side, invalid prefix, duplicate key) are skipped with a warning.
    """
    routes: dict[str, Path] = {}
    for raw in (text or "").split(","):
        entry = raw.strip()
        if not entry:
            continue
        prefix, sep, directory = entry.partition("=")
        prefix, directory = prefix.strip(), directory.strip()
        if not sep or not prefix or not directory:
            log.warning("Skipping malformed filesystem route %r (expected prefix=dir)", entry)
            continue
        try:
            key = route_key(prefix)
        except WorkspaceError as exc:
            log.warning("Skipping filesystem route %r: %s", entry, exc)
            continue
        if key in routes:
            log.warning("Skipping duplicate filesystem route %r", entry)
            continue
        routes[key] = Path(directory)
    return routes


__all__ = ["CompositeFileSystem", "parse_routes"]
