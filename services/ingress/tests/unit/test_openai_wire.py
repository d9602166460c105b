import json

import pytest

from atmosphere.ingress.openai_wire import OpenAiError, error_for_run, model_list, parse_chat_request, resolve_target


def parse(body: object) -> object:
    return parse_chat_request(json.dumps(body).encode())


def failure(body: object) -> OpenAiError:
    with pytest.raises(OpenAiError) as raised:
        parse(body)
    return raised.value


USER = [{"role": "user", "content": "hi"}]


def test_a_valid_request_keeps_prior_turns() -> None:
    request = parse(
        {
            "model": "assistant",
            "stream": True,
            "temperature": 0.3,
            "messages": [
                {"role": "developer", "content": "Be terse."},
                {"role": "user", "content": [{"type": "text", "text": "Hello "}, {"type": "text", "text": "there"}]},
                {"role": "assistant", "content": None},
                {"role": "user", "content": "And now?"},
            ],
        }
    )
    assert request.model == "assistant"  # type: ignore[attr-defined]
    assert request.stream is True  # type: ignore[attr-defined]
    assert request.prompt == "And now?"  # type: ignore[attr-defined]
    assert request.prior == [  # type: ignore[attr-defined]
        {"role": "system", "content": "Be terse."},
        {"role": "user", "content": "Hello there"},
        {"role": "assistant", "content": ""},
    ]


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"messages": USER, "tools": [{"type": "function"}]}, "tools"),
        ({"messages": USER, "tool_choice": "auto"}, "tool_choice"),
        ({"messages": USER, "functions": [{}]}, "functions"),
        ({"messages": USER, "n": 2}, "n"),
        ({"messages": USER, "response_format": {"type": "json_object"}}, "response_format"),
        ({"messages": [{"role": "tool", "content": "x"}, *USER]}, "messages"),
        ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]}, "messages"),
        ({"messages": [{"role": "assistant", "content": "", "tool_calls": [{}]}, *USER]}, "messages"),
    ],
)
def test_what_cannot_be_honoured_is_refused_as_unsupported(body: object, param: str) -> None:
    error = failure(body)
    assert (error.status, error.code, error.param) == (400, "unsupported_parameter", param)


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (b"", "Request body is empty."),
        (b"{nope", "Invalid JSON payload."),
        (b"[1]", "Request body must be a JSON object."),
        (b'{"messages": []}', "'messages' must be a non-empty array."),
        (b'{"messages": [{"role": "user", "content": "hi"}], "stream": "yes"}', "'stream' must be a boolean."),
        (
            b'{"messages": [{"role": "assistant", "content": "hi"}]}',
            "The last message must be a user message with content.",
        ),
        (b'{"messages": [{"role": "wizard", "content": "hi"}]}', "messages[0].role 'wizard' is not valid."),
    ],
)
def test_malformed_requests_are_400_with_a_clear_message(raw: bytes, message: str) -> None:
    with pytest.raises(OpenAiError) as raised:
        parse_chat_request(raw)
    assert (raised.value.status, raised.value.message) == (400, message)


def test_oversized_bodies_are_413() -> None:
    with pytest.raises(OpenAiError) as raised:
        parse_chat_request(b"x" * 1_048_577)
    assert (raised.value.status, raised.value.code) == (413, "payload_too_large")


def test_model_mapping() -> None:
    registered = ["assistant", "echo"]
    assert resolve_target("echo", models={}, default_agent="", registered=registered) == "echo"
    assert resolve_target(None, models={}, default_agent="assistant", registered=registered) == "assistant"
    assert resolve_target("gpt-4o", models={}, default_agent="assistant", registered=registered) == "assistant"
    assert resolve_target("gpt-4o", models={"gpt-4o": "echo"}, default_agent="", registered=registered) == "echo"
    with pytest.raises(OpenAiError) as raised:
        resolve_target("echo", models={"gpt-4o": "echo"}, default_agent="", registered=registered)
    assert (raised.value.status, raised.value.code) == (404, "model_not_found")
    with pytest.raises(OpenAiError) as raised:
        resolve_target(None, models={}, default_agent="", registered=registered)
    assert raised.value.message == "'model' is required."
    with pytest.raises(OpenAiError) as raised:
        resolve_target("x", models={"x": "gone"}, default_agent="", registered=registered)
    assert raised.value.status == 503
    assert [m["id"] for m in model_list({"b": "echo", "a": "echo"}, registered)["data"]] == ["a", "b"]
    assert [m["id"] for m in model_list({}, registered)["data"]] == ["assistant", "echo"]


def test_run_errors_map_to_openai_statuses() -> None:
    assert (error_for_run("budget.exceeded", "AI budget exceeded").status) == 429
    assert error_for_run("budget.exceeded", "x").code == "budget_exceeded"
    assert error_for_run("governance.denied", "Request denied by policy p: no").code == "request_blocked"
    assert error_for_run("runtime.unavailable", "x").status == 503
    internal = error_for_run("agent.failed", "KeyError: secret")
    assert internal.status == 500
    assert "secret" not in internal.message
