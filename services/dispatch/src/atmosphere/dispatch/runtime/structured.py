"""Structured output: asking for JSON that fits a pydantic model, and checking the answer."""

from __future__ import annotations

import json
import re
from typing import Any

import pydantic
from pydantic import BaseModel

_FENCE = re.compile(r"^\s*```(?:json)?\s*(.*?)\s*```\s*$", re.S)


def json_schema(model: type[BaseModel]) -> dict[str, Any]:
    """The model's JSON schema."""
    return model.model_json_schema()


def response_format(model: type[BaseModel]) -> dict[str, Any]:
    """OpenAI's native `response_format` for `model`."""
    return {"type": "json_schema", "json_schema": {"name": model.__name__, "schema": json_schema(model)}}


def schema_instructions(model: type[BaseModel]) -> str:
    """What the system prompt gains when the provider has no native structured output."""
    return (
        "\n\nRespond with exactly one JSON object that matches this JSON schema, and nothing else "
        "(no prose, no code fences):\n" + json.dumps(json_schema(model))
    )


def parse(model: type[BaseModel], text: str) -> BaseModel:
    """Validate `text` (a bare or fenced JSON object) against `model`.

    Raises:
        ValueError: with a message naming what is wrong.
    """
    fenced = _FENCE.match(text)
    candidate = fenced.group(1) if fenced else text.strip()
    try:
        return model.model_validate_json(candidate)
    except pydantic.ValidationError as exc:
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc']) or '(root)'}: {e['msg']}" for e in exc.errors()[:10])
        raise ValueError(problems) from None


def reprompt(model: type[BaseModel], original: str, invalid: str, error: str) -> str:
    """The user message of a self-healing retry."""
    return (
        f"Your previous answer did not match the required JSON schema: {error}\n"
        f"Schema: {json.dumps(json_schema(model))}\n"
        f"Invalid answer: {invalid[:4000]}\n"
        "Reply with only one JSON object that matches the schema: no prose, no code fences.\n"
        f"Original request: {original}"
    )
