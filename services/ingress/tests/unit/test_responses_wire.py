"""The Responses wire's validation: every body it cannot honour exactly is a clear OpenAI error."""

from __future__ import annotations

import json
from typing import Any

import pytest

from atmosphere.ingress.errors import OpenAiError
from atmosphere.ingress.responses_wire import ResponseShape, check_outputs, parse_responses_request


def parse(body: dict[str, Any]) -> Any:
    return parse_responses_request(json.dumps(body).encode())


def test_a_string_input_is_the_prompt() -> None:
    asked = parse({"model": "echo", "input": "hi", "instructions": "Be brief."})
    assert (asked.model, asked.prompt, asked.stream) == ("echo", "hi", False)
    assert asked.prior == [{"role": "system", "content": "Be brief."}]


def test_message_items_are_history_and_the_last_user_item_the_prompt() -> None:
    asked = parse(
        {
            "input": [
                {"role": "developer", "content": "Be brief."},
                {"role": "user", "content": [{"type": "input_text", "text": "My name is Ada."}]},
                {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Hi Ada."}]},
                {"role": "user", "content": "Who am I?"},
            ]
        }
    )
    assert asked.prompt == "Who am I?"
    assert asked.prior == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "My name is Ada."},
        {"role": "assistant", "content": "Hi Ada."},
    ]


@pytest.mark.parametrize(
    ("body", "param", "words"),
    [
        ({"input": ""}, "input", "non-empty user message"),
        ({"input": []}, "input", "non-empty array"),
        ({"input": [{"role": "assistant", "content": "x"}]}, "input", "user message"),
        ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}, "input", "not text"),
        ({"input": [{"type": "function_call_output", "call_id": "c", "output": "x"}]}, "input", "previous_response_id"),
        (
            {
                "input": [
                    {"role": "user", "content": "x"},
                    {"type": "function_call_output", "call_id": "c", "output": "x"},
                ]
            },
            "input",
            "No function call with call_id 'c'",
        ),
        ({"input": [{"type": "function_call", "name": "f"}]}, "input", "{call_id, name, arguments}"),
        ({"input": [{"type": "reasoning", "summary": []}]}, "input", "not supported"),
        ({"input": "hi", "tool_choice": "required"}, "tool_choice", "only allowed when 'tools'"),
        ({"input": "hi", "tools": [{"type": "function", "name": "a b"}]}, "tools", "1 to 64 letters"),
        ({"input": "hi", "text": {"format": {"type": "yaml"}}}, "text.format", "must be 'text'"),
        ({"input": [{"role": "robot", "content": "x"}]}, "input", "role"),
        ({"input": [{"role": "user", "content": 7}]}, "input", "content"),
        ({"input": "hi", "stream": "yes"}, "stream", "boolean"),
        ({"input": "hi", "model": "m" * 300}, "model", "short"),
        ({"input": "hi", "previous_response_id": "chatcmpl-1"}, "previous_response_id", "resp_"),
        ({"input": "hi", "previous_response_id": "resp_a.b"}, "previous_response_id", "malformed"),
        ({"input": "hi", "tools": [{"type": "web_search"}]}, "tools", "not supported"),
        ({"input": "hi", "text": {"format": {"type": "json_schema"}}}, "text.format", "text.format.name"),
        ({"input": ["x"] * 2000}, "input", "at most"),
    ],
)
def test_what_cannot_be_honoured_is_a_clear_400(body: dict[str, Any], param: str, words: str) -> None:
    with pytest.raises(OpenAiError) as refused:
        check_outputs(parse(body), set())
    assert refused.value.status == 400
    assert refused.value.param == param
    assert words in refused.value.message


def test_a_response_object_and_its_events_are_numbered() -> None:
    shape = ResponseShape("r1", model="echo")
    assert shape.id == "resp_r1"
    done = shape.response("completed", text="hi", usage={"prompt_tokens": 2, "completion_tokens": 1, "total_tokens": 3})
    assert done["output"][0]["content"][0] == {"type": "output_text", "text": "hi", "annotations": [], "logprobs": []}
    assert done["usage"]["total_tokens"] == 3
    assert [shape.event("a")["sequence_number"], shape.event("b")["sequence_number"]] == [1, 2]


LOOKUP = {
    "type": "function",
    "name": "lookup",
    "description": "The client's search.",
    "parameters": {"type": "object", "properties": {"q": {"type": "string"}}},
}


def test_function_tools_calls_and_outputs_become_the_gateway() -> None:
    asked = parse(
        {
            "tools": [LOOKUP],
            "tool_choice": {"type": "function", "name": "lookup"},
            "text": {"format": {"type": "json_schema", "name": "book", "schema": {"type": "object"}, "strict": True}},
            "input": [
                {"role": "user", "content": "Find atlas"},
                {"type": "function_call", "call_id": "c1", "name": "lookup", "arguments": '{"q": "atlas"}'},
                {"type": "function_call", "call_id": "c2", "name": "lookup", "arguments": '{"q": "globe"}'},
                {"type": "function_call_output", "call_id": "c1", "output": "maps"},
                {"type": "function_call_output", "call_id": "c2", "output": [{"type": "input_text", "text": "a ball"}]},
            ],
        }
    )
    check_outputs(asked, set())
    assert asked.prompt == "Find atlas"
    assert asked.gateway.metadata() == {
        "tools": [{"name": "lookup", "description": "The client's search.", "parameters": LOOKUP["parameters"]}],
        "tool_choice": {"type": "function", "function": {"name": "lookup"}},
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": "book", "schema": {"type": "object"}, "strict": True},
        },
        "continuation": [
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {"id": "c1", "name": "lookup", "arguments": '{"q": "atlas"}'},
                    {"id": "c2", "name": "lookup", "arguments": '{"q": "globe"}'},
                ],
            },
            {"role": "tool", "content": "maps", "tool_call_id": "c1"},
            {"role": "tool", "content": "a ball", "tool_call_id": "c2"},
        ],
    }


def test_outputs_alone_continue_the_previous_response() -> None:
    asked = parse(
        {"previous_response_id": "resp_r1", "input": [{"type": "function_call_output", "call_id": "c9", "output": "x"}]}
    )
    assert asked.prompt is None
    check_outputs(asked, {"c9"})
    with pytest.raises(OpenAiError):
        check_outputs(asked, {"c8"})
