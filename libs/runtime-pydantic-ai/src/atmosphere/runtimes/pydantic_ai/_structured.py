"""Structured output on PydanticAI: native `response_format` first, the schema in the prompt when refused.

PydanticAI heals an answer that does not validate itself (it tells the model what was wrong and
asks again, within the output retry budget); this module only supplies the fallback the
built-in runtime has for a provider without native structured output: the schema appended to
the system prompt, and the answer parsed as text.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable

import pydantic
from pydantic import BaseModel
from pydantic_ai import ModelRetry, UnexpectedModelBehavior

from atmosphere.runtimes.pydantic_ai._outcome import validation_problems
from atmosphere.sdk import ChatMessage

NATIVE_REFUSALS = frozenset({400, 422})
"""Statuses with which a provider refuses `response_format` (the built-in runtime's rule)."""
OUTPUT_RETRIES_SPENT = "Exceeded maximum output retries"
"""How PydanticAI's `UnexpectedModelBehavior` begins when no answer validated within the output retries
(the other causes of that exception, like an empty answer, are the provider's failures)."""
_FENCE = re.compile(r"^\s*```(?:json)?\s*(.*?)\s*```\s*$", re.S)


def schema_instructions(model: type[BaseModel]) -> str:
    """What the system prompt gains when the provider has no native structured output (the built-in's words)."""
    return (
        "\n\nRespond with exactly one JSON object that matches this JSON schema, and nothing else "
        "(no prose, no code fences):\n" + json.dumps(model.model_json_schema())
    )


def with_instructions(messages: list[ChatMessage], model: type[BaseModel]) -> list[ChatMessage]:
    """`messages` whose system prompt (added if none) ends with the schema instructions."""
    instructions = schema_instructions(model)
    if messages and messages[0].role == "system":
        return [ChatMessage("system", messages[0].content + instructions), *messages[1:]]
    return [ChatMessage("system", instructions.strip()), *messages]


def answer_problems(exc: UnexpectedModelBehavior) -> str:
    """What was wrong with the last answer: the validation error behind PydanticAI's last retry."""
    cause = exc.__cause__
    while cause is not None:
        if isinstance(cause, pydantic.ValidationError | ModelRetry):
            return validation_problems(cause)
        cause = cause.__cause__
    return exc.message


def text_parser(model: type[BaseModel]) -> Callable[[str], BaseModel]:
    """The output function of the fallback: a bare or fenced JSON object, validated against `model`.

    A misfit raises `ModelRetry`, so PydanticAI asks the model again with the problems.
    """

    def parse(text: str) -> BaseModel:
        fenced = _FENCE.match(text)
        candidate = fenced.group(1) if fenced else text.strip()
        try:
            return model.model_validate_json(candidate)
        except pydantic.ValidationError as exc:
            raise ModelRetry(validation_problems(exc)) from None

    return parse
