"""Reading a tool's docstring, whatever its style: the description and each parameter's."""

from __future__ import annotations

import inspect

import docstring_parser


def parse_docstring(doc: str | None) -> tuple[str, dict[str, str]]:
    """The description (the text before the first section) and each documented parameter's.

    Google (`Args:`), NumPy (`Parameters` underlined), reST/Sphinx (`:param x:`) and Epydoc
    (`@param x:`) docstrings are all read: `docstring-parser` tries each style and keeps the one
    that finds the most entries. A docstring without sections is all description.
    """
    try:
        parsed = docstring_parser.parse(doc or "")
    except docstring_parser.ParseError:
        # Unreachable today (its NumPy reader accepts any text), but should a release start
        # refusing some text, the model still reads the whole docstring rather than nothing.
        return inspect.cleandoc(doc or ""), {}
    # `description` is the short and the long description joined; it ends with a newline when a
    # blank line separates the short one from the first section.
    summary = (parsed.description or "").strip()
    return summary, {param.arg_name: param.description.strip() for param in parsed.params if param.description}
