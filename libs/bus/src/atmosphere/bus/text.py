"""Text as protobuf string fields accept it.

A Python `str` may hold a lone UTF-16 surrogate (a code point from U+D800 to U+DFFF on its own,
from a JSON escape or a tool's own text); UTF-8 cannot encode one, so protobuf refuses to
serialize it and the send fails. Inbound edges refuse such text with a clear error
(`has_lone_surrogate`); text produced inside the system (a model's answer, a tool's result) is
repaired instead (`replace_lone_surrogates`).
"""

from __future__ import annotations


def has_lone_surrogate(text: str) -> bool:
    """Whether `text` holds a surrogate code point (valid in Python, refused by UTF-8 and protobuf)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def replace_lone_surrogates(text: str) -> str:
    """`text` with every lone surrogate replaced by `?`, so that protobuf accepts it."""
    if has_lone_surrogate(text):
        return text.encode("utf-8", errors="replace").decode("utf-8")
    return text


__all__ = ["has_lone_surrogate", "replace_lone_surrogates"]
