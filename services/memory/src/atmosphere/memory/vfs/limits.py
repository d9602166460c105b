"""The bounds of one file store: sizes, counts, and how long a search may take."""

from __future__ import annotations

from dataclasses import dataclass

KIB = 1024
MIB = 1024 * KIB


@dataclass(frozen=True, slots=True)
class Limits:
    """The bounds of one store (one conversation, or one routed backend)."""

    max_file_bytes: int = 512 * KIB
    max_files: int = 256
    max_total_bytes: int = 16 * MIB
    max_conversations: int = 256
    """Conversation stores per user of an owner; that user's least recently modified idle ones go past it."""
    max_grep_hits: int = 500
    grep_line_chars: int = 500
    max_pattern_chars: int = 512
    grep_deadline: float = 2.0
    """Seconds one grep (or glob) may spend matching, across all files."""
    max_dirs: int = 1024
    """Directories per store, so write-then-delete cannot pile up empty directories forever."""


DEFAULT_LIMITS = Limits()
