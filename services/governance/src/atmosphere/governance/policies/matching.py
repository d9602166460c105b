"""Phrase and regex matching for the content policies (deny-list, allow-list, preference) and MS `matches`.

Phrases are literal and case-insensitive; regexes are case-insensitive `search`es, as the
original's `Pattern.CASE_INSENSITIVE` + `find()` (MS `matches` is case-sensitive). Regexes run
on RE2 (`google-re2`), whose matching time is linear in the text: a pattern like `(a+)+$` that
makes a backtracking engine (Java's, Python's `re`) take exponential time on a crafted message
costs RE2 one pass. The price is RE2's syntax: no lookaround and no backreferences — a policy
using them is refused at start, naming the pattern, rather than run on an engine a message can
stall (every admission would wait on it).
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Protocol

import re2  # type: ignore[import-untyped]

MAX_PATTERN_CHARS: Final = 1000
"""Longest phrase or regex a policy accepts."""
MAX_PATTERNS: Final = 1000
"""Most phrases + regexes one policy accepts."""
MAX_WALK_DEPTH: Final = 32
"""How deep tool arguments are walked for strings; deeper values are not screened."""
MAX_PROGRAM_BYTES: Final = 8 << 20
"""Memory RE2 may use for one compiled pattern (a huge counted repetition is refused, not built)."""


class Searcher(Protocol):
    """A compiled pattern: `search` finds it anywhere in a text (None when absent)."""

    def search(self, text: str) -> object | None:
        """The first match in `text`, or None."""
        ...


def compile_regex(pattern: str, *, ignore_case: bool = True) -> Searcher:
    """`pattern` compiled for linear-time search, or a `ValueError` saying why it cannot be."""
    if len(pattern) > MAX_PATTERN_CHARS:
        raise ValueError(f"regex longer than {MAX_PATTERN_CHARS} characters")
    options = re2.Options()
    options.case_sensitive = not ignore_case
    options.log_errors = False
    options.max_mem = MAX_PROGRAM_BYTES
    try:
        compiled: Searcher = re2.compile(pattern, options)
    except re2.error as exc:
        detail = exc.args[0].decode() if exc.args and isinstance(exc.args[0], bytes) else str(exc)
        msg = f"invalid regex {pattern!r}: {detail} (RE2 syntax: no lookaround or backreferences)"
        raise ValueError(msg) from None
    return compiled


@dataclass(frozen=True)
class PatternSet:
    """Literal phrases and regexes; matches when any one is found in a text."""

    patterns: tuple[Searcher, ...]

    @classmethod
    def build(cls, phrases: Sequence[str], regexes: Sequence[str]) -> PatternSet:
        """The set of `phrases` (literal) and `regexes`, both case-insensitive; at least one."""
        if not phrases and not regexes:
            raise ValueError("requires 'phrases' or 'regex' under config")
        if len(phrases) + len(regexes) > MAX_PATTERNS:
            raise ValueError(f"more than {MAX_PATTERNS} phrases and regexes")
        for phrase in phrases:
            if len(phrase) > MAX_PATTERN_CHARS:
                raise ValueError(f"phrase longer than {MAX_PATTERN_CHARS} characters")
        compiled: list[Searcher] = [re.compile(re.escape(p), re.IGNORECASE) for p in phrases]
        compiled += [compile_regex(r) for r in regexes]
        return cls(tuple(compiled))

    def search(self, text: str) -> bool:
        """Whether any phrase or regex occurs in `text` (blank text matches nothing)."""
        if not text.strip():
            return False
        return any(p.search(text) for p in self.patterns)


def strings_in(value: Any, depth: int = 0) -> Iterator[str]:
    """Every string inside `value`, through mappings (values), lists and tuples, depth-bounded."""
    if isinstance(value, str):
        yield value
    elif depth < MAX_WALK_DEPTH and isinstance(value, Mapping):
        for item in value.values():
            yield from strings_in(item, depth + 1)
    elif depth < MAX_WALK_DEPTH and isinstance(value, list | tuple):
        for item in value:
            yield from strings_in(item, depth + 1)
