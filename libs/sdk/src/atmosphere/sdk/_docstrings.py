"""Reading a Google-style docstring: the summary and the `Args:` descriptions."""

from __future__ import annotations

import inspect
import re

_SECTION = re.compile(r"^(\w+):\s*$")
_ARG_SECTIONS = frozenset({"Args", "Arguments", "Parameters"})
_ARG = re.compile(r"^\*{0,2}(\w+)(?:\s*\([^)]*\))?\s*:\s*(.*)$")


def parse_docstring(doc: str | None) -> tuple[str, dict[str, str]]:
    """The description (text before the first section) and each argument's description.

    In the `Args:` section, a line indented one level starts an argument (`name: text` or
    `name (type): text`); deeper lines continue the previous argument's text.
    """
    summary: list[str] = []
    args: dict[str, str] = {}
    section: str | None = None
    arg_indent: int | None = None
    current = ""
    for line in inspect.cleandoc(doc or "").splitlines():
        stripped = line.strip()
        indent = len(line) - len(line.lstrip())
        header = _SECTION.match(line)
        if header:
            section, arg_indent, current = header.group(1), None, ""
            continue
        if section is None:
            summary.append(line)
            continue
        if section not in _ARG_SECTIONS or not stripped:
            continue
        if arg_indent is None:
            arg_indent = indent
        match = _ARG.match(stripped)
        if indent <= arg_indent and match:
            current = match.group(1)
            args[current] = match.group(2).strip()
        elif current:
            args[current] = f"{args[current]} {stripped}".strip()
    return "\n".join(summary).strip(), args
