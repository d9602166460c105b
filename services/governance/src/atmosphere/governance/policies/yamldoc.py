"""Reading one policy YAML document safely, keeping the line of every value for error messages.

A policy file is operator input, but it may come from a writable volume, so it is treated as
hostile: only YAML's safe tags are accepted (no Python objects), the document is at most
`MAX_DOCUMENT_BYTES`, nesting is at most `MAX_DEPTH` deep, and aliases may expand to at most
`MAX_VALUES` values in all (a "billion laughs" document is refused, not expanded). Duplicate keys
are an error. The loader works on YAML's node tree (`yaml.compose`), so every error names the
line it is about: `<source>:<line>: <what is wrong>`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any, Final

import yaml

from atmosphere.governance.policies.model import PolicyFileError

MAX_DOCUMENT_BYTES: Final = 1024 * 1024
MAX_DEPTH: Final = 64
MAX_VALUES: Final = 100_000
"""Values one document may hold once its aliases are expanded."""

_STR_TAG: Final = "tag:yaml.org,2002:str"
_SEQ_TAG: Final = "tag:yaml.org,2002:seq"
_MAP_TAG: Final = "tag:yaml.org,2002:map"


class _RefusedError(Exception):
    """Raised inside the composer; turned into a `PolicyFileError` with the source."""

    def __init__(self, message: str, mark: yaml.Mark | None) -> None:
        super().__init__(message)
        self.mark = mark


class _BoundedLoader(yaml.SafeLoader):
    """PyYAML's safe loader, refusing documents nested deeper than `MAX_DEPTH`."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent: yaml.Node | None, index: int) -> yaml.Node | None:
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                raise _RefusedError(f"document nested deeper than {MAX_DEPTH} levels", self.peek_event().start_mark)  # type: ignore[no-untyped-call]
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


def line_of(node: yaml.Node) -> int:
    """The 1-based line a node starts on."""
    return int(node.start_mark.line) + 1


class Document:
    """One composed YAML document: its node tree and the helpers that read it with line numbers."""

    def __init__(self, text: str, source: str) -> None:
        self.text = text
        self.source = source
        self._values = 0
        if len(text.encode("utf-8", "surrogatepass")) > MAX_DOCUMENT_BYTES:
            raise PolicyFileError(f"{source}: policy document larger than {MAX_DOCUMENT_BYTES} bytes")
        try:
            # PyYAML's reader refuses control characters already when it is made, not only when
            # it reads: that is a bad policy document too, not a crash.
            self._loader = _BoundedLoader(text)
        except yaml.YAMLError as exc:
            raise PolicyFileError(f"{source}: invalid YAML: {exc}") from None
        try:
            self.root: yaml.Node | None = self._loader.get_single_node()
        except _RefusedError as exc:
            raise self._error_at(exc.mark, str(exc)) from None
        except yaml.MarkedYAMLError as exc:
            raise self._error_at(exc.problem_mark, f"invalid YAML: {exc.problem}") from None
        except yaml.YAMLError as exc:
            raise PolicyFileError(f"{source}: invalid YAML: {exc}") from None
        finally:
            self._loader.dispose()

    def _error_at(self, mark: yaml.Mark | None, message: str) -> PolicyFileError:
        where = f"{self.source}:{int(mark.line) + 1}" if mark is not None else self.source
        return PolicyFileError(f"{where}: {message}")

    def error(self, node: yaml.Node, message: str) -> PolicyFileError:
        """An error about `node`, naming the source and its line."""
        return PolicyFileError(f"{self.source}:{line_of(node)}: {message}")

    def definition(self, node: yaml.Node) -> str:
        """The document text `node` was read from (what an entry's digest covers)."""
        return self.text[node.start_mark.index : node.end_mark.index]

    def _count(self, node: yaml.Node) -> None:
        self._values += 1
        if self._values > MAX_VALUES:
            raise self.error(node, f"document expands to more than {MAX_VALUES} values (alias bomb?)")

    def mapping(self, node: yaml.Node, what: str) -> dict[str, tuple[yaml.Node, yaml.Node]]:
        """A mapping's entries by string key, each as (key node, value node); duplicates refused."""
        if not isinstance(node, yaml.MappingNode) or node.tag != _MAP_TAG:
            raise self.error(node, f"{what} must be a mapping")
        entries: dict[str, tuple[yaml.Node, yaml.Node]] = {}
        for key_node, value_node in node.value:
            self._count(key_node)
            if not isinstance(key_node, yaml.ScalarNode) or key_node.tag != _STR_TAG:
                raise self.error(key_node, f"keys of {what} must be strings")
            key = str(key_node.value)
            if key in entries:
                raise self.error(key_node, f"duplicate key '{key}' in {what}")
            entries[key] = (key_node, value_node)
        return entries

    def sequence(self, node: yaml.Node, what: str) -> list[yaml.Node]:
        """A sequence's item nodes."""
        if not isinstance(node, yaml.SequenceNode) or node.tag != _SEQ_TAG:
            raise self.error(node, f"{what} must be a sequence")
        return list(node.value)

    def plain(self, node: yaml.Node, depth: int = 0) -> Any:
        """The node as plain Python values (str, int, float, bool, None, list, dict), bounded."""
        self._count(node)
        if depth > MAX_DEPTH:
            # Only a recursive alias gets here: the composer already bounds written nesting.
            raise self.error(node, f"value nested deeper than {MAX_DEPTH} levels (recursive alias?)")
        if isinstance(node, yaml.ScalarNode):
            return self._scalar(node)
        if isinstance(node, yaml.SequenceNode):
            return [self.plain(item, depth + 1) for item in self.sequence(node, "a value")]
        return {key: self.plain(value, depth + 1) for key, (_, value) in self.mapping(node, "a value").items()}

    def _scalar(self, node: yaml.ScalarNode) -> Any:
        try:
            value = self._loader.construct_object(node)
        except yaml.YAMLError as exc:
            raise self.error(node, f"unsupported value: {exc}") from None
        if not isinstance(value, str | int | float | bool | None):
            raise self.error(node, f"unsupported value of type {type(value).__name__}")
        return value

    def scalar_text(self, node: yaml.Node, what: str) -> str:
        """A scalar as text (numbers and booleans spelled as written in the file)."""
        if not isinstance(node, yaml.ScalarNode):
            raise self.error(node, f"{what} must be a single value")
        value = self._scalar(node)
        return "" if value is None else str(node.value)


class Config:
    """A policy entry's `config:` block: typed reads with errors on the offending line."""

    def __init__(self, doc: Document, owner: yaml.Node, node: yaml.Node | None, allowed: Iterable[str]) -> None:
        self.doc = doc
        self.owner = owner
        self.entries = {} if node is None or _is_null(node) else doc.mapping(node, "config")
        known = sorted(allowed)
        for key, (key_node, _) in self.entries.items():
            if key not in known:
                supported = ", ".join(known) if known else "none"
                raise doc.error(key_node, f"unknown config key '{key}' (supported: {supported})")

    def node(self, key: str) -> yaml.Node | None:
        """The value node of `key`, or None when absent."""
        entry = self.entries.get(key)
        return None if entry is None or _is_null(entry[1]) else entry[1]

    def fail(self, key: str, message: str) -> PolicyFileError:
        """An error on `key`'s line (the entry's when the key is absent)."""
        return self.doc.error(self.node(key) or self.owner, message)

    def text(self, key: str, default: str) -> str:
        """`key` as text, or `default`."""
        node = self.node(key)
        return default if node is None else self.doc.scalar_text(node, f"'{key}'")

    def integer(self, key: str, default: int) -> int:
        """`key` as an integer, or `default`."""
        node = self.node(key)
        value = default if node is None else self.doc.plain(node)
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.fail(key, f"'{key}' must be an integer, got {value!r}")
        return value

    def number(self, key: str, default: float) -> float:
        """`key` as a finite number, or `default`."""
        node = self.node(key)
        value = default if node is None else self.doc.plain(node)
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise self.fail(key, f"'{key}' must be a number, got {value!r}")
        return float(value)

    def strings(self, key: str) -> list[str]:
        """`key` as a list of non-blank strings (blank and null items dropped), or empty."""
        node = self.node(key)
        if node is None:
            return []
        items = [self.doc.plain(item) for item in self.doc.sequence(node, f"'{key}'")]
        if any(isinstance(item, list | dict) for item in items):
            raise self.fail(key, f"'{key}' must be a list of strings")
        return [text for item in items if item is not None and (text := str(item)).strip()]


def _is_null(node: yaml.Node) -> bool:
    return isinstance(node, yaml.ScalarNode) and node.tag == "tag:yaml.org,2002:null"
