"""Phrase and regex matching for the content policies (deny-list, allow-list, preference).

Phrases are literal and case-insensitive; regexes are case-insensitive `search`es, as the
original's `Pattern.CASE_INSENSITIVE` + `find()`. Python's `re` backtracks, so a hostile pattern
(`(a+)+$`) can take exponential time on a crafted message: patterns come from the operator's
policy file, not from users, and their length is bounded (`MAX_PATTERN_CHARS`), which limits
accidents but is no proof against ReDoS.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

MAX_PATTERN_CHARS: Final = 1000
"""Longest phrase or regex a policy accepts."""
MAX_PATTERNS: Final = 1000
"""Most phrases + regexes one policy accepts."""
MAX_WALK_DEPTH: Final = 32
"""How deep tool arguments are walked for strings; deeper values are not screened."""


def compile_regex(pattern: str, flags: int = re.IGNORECASE) -> re.Pattern[str]:
    """`pattern` compiled, or a `ValueError` saying why it cannot be (too long, invalid)."""
    if len(pattern) > MAX_PATTERN_CHARS:
        raise ValueError(f"regex longer than {MAX_PATTERN_CHARS} characters")
    try:
        return re.compile(pattern, flags)
    except re.error as exc:
        raise ValueError(f"invalid regex {pattern!r}: {exc}") from exc


@dataclass(frozen=True)
class PatternSet:
    """Literal phrases and regexes; matches when any one is found in a text."""

    patterns: tuple[re.Pattern[str], ...]

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
        compiled = [re.compile(re.escape(p), re.IGNORECASE) for p in phrases]
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
