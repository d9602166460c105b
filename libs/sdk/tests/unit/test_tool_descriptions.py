"""Every parameter description a tool's author wrote reaches its schema, whatever the style.

`Annotated[..., Field(description=...)]` wins over the docstring; the docstring may be Google,
NumPy, reST/Sphinx or Epydoc.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import docstring_parser
import pytest
from pydantic import Field

from atmosphere.sdk import Tool, tool
from atmosphere.sdk._docstrings import parse_docstring
from atmosphere.sdk.host import ToolArgumentsError


def described(t: Tool[Any, Any]) -> dict[str, str | None]:
    return {name: schema.get("description") for name, schema in t.parameters["properties"].items()}


@tool
def book_table(
    guests: Annotated[int, Field(ge=1, le=12, description="How many people are coming.")],
    when: Annotated[str, Field(pattern=r"^\d{2}:\d{2}$", description="The time, as HH:MM.")] = "19:00",
    note: Annotated[str, "a plain string is no description"] = "",
    seating: Annotated[Literal["inside", "outside"], Field(description="Where to sit.")] = "inside",
) -> str:
    """Book a table.

    Args:
        guests: Overridden: the Annotated description is the more specific one.
        note: Anything the restaurant should know.
    """
    return f"{guests} at {when} {seating} {note}".strip()


def test_annotated_descriptions_win_and_keep_their_constraints_and_defaults() -> None:
    assert book_table.description == "Book a table."
    assert described(book_table) == {
        "guests": "How many people are coming.",
        "when": "The time, as HH:MM.",
        "note": "Anything the restaurant should know.",  # the plain string is ignored
        "seating": "Where to sit.",
    }
    properties = book_table.parameters["properties"]
    assert (properties["guests"]["minimum"], properties["guests"]["maximum"]) == (1, 12)
    assert properties["when"] == {
        "type": "string",
        "pattern": r"^\d{2}:\d{2}$",
        "default": "19:00",
        "description": "The time, as HH:MM.",
    }
    assert properties["seating"]["default"] == "inside"
    assert book_table.parameters["required"] == ["guests"]


async def test_annotated_constraints_are_enforced_when_the_model_calls() -> None:
    assert await book_table.invoke({"guests": 2}) == "2 at 19:00 inside"
    with pytest.raises(ToolArgumentsError, match="guests"):
        await book_table.invoke({"guests": 0})
    with pytest.raises(ToolArgumentsError, match="when"):
        await book_table.invoke({"guests": 2, "when": "tonight"})


@tool
def preset(level: Annotated[int, Field(default=3, description="Loudness.")]) -> int:
    """Set the volume."""
    return level


async def test_a_default_declared_inside_annotated_is_kept() -> None:
    assert preset.parameters["properties"]["level"] == {"type": "integer", "default": 3, "description": "Loudness."}
    assert "required" not in preset.parameters
    assert await preset.invoke({}) == "3"


@tool
def search_numpy(query: str, limit: int = 10) -> list[str]:
    """Search the catalogue.

    Results come best first.

    Parameters
    ----------
    query : str
        What to look for,
        in plain words.
    limit : int, optional
        How many results at most.

    Returns
    -------
    list of str
        The titles found.
    """
    return [query][:limit]


@tool
def search_rest(query: str, limit: int = 10) -> list[str]:
    """Search the catalogue.

    Results come best first.

    :param query: What to look for,
        in plain words.
    :type query: str
    :param int limit: How many results at most.
    :returns: The titles found.
    """
    return [query][:limit]


@tool
def search_epydoc(query: str, limit: int = 10) -> list[str]:
    """Search the catalogue.

    Results come best first.

    @param query: What to look for,
        in plain words.
    @param limit: How many results at most.
    @return: The titles found.
    """
    return [query][:limit]


@pytest.mark.parametrize("style", [search_numpy, search_rest, search_epydoc], ids=["numpy", "rest", "epydoc"])
def test_numpy_rest_and_epydoc_docstrings_describe_every_parameter(style: Tool[Any, Any]) -> None:
    assert style.description == "Search the catalogue.\n\nResults come best first."
    assert described(style) == {"query": "What to look for,\nin plain words.", "limit": "How many results at most."}


@tool
def route(mode: Literal["walk", "bike", "drive"], destination: str) -> str:
    """Plan a route.

    Args:
        mode (Literal["walk", "bike",
            "drive"]): How to travel.
        destination: Where to.
    """
    return f"{mode} to {destination}"


def test_a_google_parameter_whose_type_wraps_keeps_its_description() -> None:
    # docstring-parser before 0.17 read `mode (Literal[...` as no parameter at all.
    assert described(route) == {"mode": "How to travel.", "destination": "Where to."}


def test_a_docstring_no_style_reads_is_all_description(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(text: str, style: docstring_parser.DocstringStyle = docstring_parser.DocstringStyle.AUTO) -> None:
        raise docstring_parser.ParseError(text)

    monkeypatch.setattr(docstring_parser, "parse", refuse)
    assert parse_docstring("  Do it.\n\n  Args:\n      x: The x.\n") == ("Do it.\n\nArgs:\n    x: The x.", {})
