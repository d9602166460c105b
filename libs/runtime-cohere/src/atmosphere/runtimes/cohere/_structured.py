"""Structured output: asking a Command model for JSON that fits a pydantic model, and checking the answer.

Natively through Cohere's JSON mode with a schema (`response_format: {"type": "json_object",
"json_schema": ...}`); through instructions in the system prompt when the request offers tools
(Cohere refuses `response_format` beside `tools`) or when a provider refuses it (a 400 or 422: an
older model, a gateway). Either way the answer is validated here, and the same wording as the
built-in runtime's reprompts it. The validation, the reprompt and the entity's events are the
Anthropic adapter's (`atmosphere.runtimes.anthropic._structured`), copied until they have a
shared home.
"""

from __future__ import annotations

import json
import re
from typing import Any

import pydantic
from pydantic import BaseModel

from atmosphere.contracts.run.v1.run_pb2 import EntityComplete, EntityStart, RunEvent, StructuredField
from atmosphere.sdk import StreamingSession

_FENCE = re.compile(r"^\s*```(?:json)?\s*(.*?)\s*```\s*$", re.S)
REFUSED_STATUSES = frozenset({400, 422})
"""A provider that cannot do native structured output refuses the request with one of these."""


def response_format(model: type[BaseModel]) -> dict[str, Any]:
    """The request's `response_format` asking for `model`'s JSON natively."""
    return {"type": "json_object", "json_schema": model.model_json_schema()}


def schema_instructions(model: type[BaseModel]) -> str:
    """What the system prompt gains when native structured output is not used."""
    return (
        "\n\nRespond with exactly one JSON object that matches this JSON schema, and nothing else "
        "(no prose, no code fences):\n" + json.dumps(model.model_json_schema())
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
        f"Schema: {json.dumps(model.model_json_schema())}\n"
        f"Invalid answer: {invalid[:4000]}\n"
        "Reply with only one JSON object that matches the schema: no prose, no code fences.\n"
        f"Original request: {original}"
    )


async def emit_entity(session: StreamingSession, model: type[BaseModel], entity: BaseModel, text: str) -> None:
    """The entity's events (start, each field, complete), then its JSON as the answer's text."""
    type_name = model.__name__
    schema = json.dumps(model.model_json_schema())
    await session.emit(RunEvent(entity_start=EntityStart(type_name=type_name, json_schema=schema)))
    for name, value in entity.model_dump(mode="json").items():
        field = StructuredField(field_name=name, value_json=json.dumps(value), schema_type=type_name)
        await session.emit(RunEvent(structured_field=field))
    complete = EntityComplete(type_name=type_name, entity_json=entity.model_dump_json())
    await session.emit(RunEvent(entity_complete=complete))
    await session.send(text)
