import json
from collections.abc import Mapping

import pytest

from atmosphere.contracts.common.v1.common_pb2 import Error
from atmosphere.contracts.dispatch.v1.dispatch_pb2 import AgentDescriptor
from atmosphere.ingress import openai_wire
from atmosphere.ingress.client_functions import check_served
from atmosphere.ingress.errors import OpenAiError
from atmosphere.ingress.openai_wire import (
    Completion,
    model_list,
    parse_chat_request,
    resolve_target,
)


def error_for_run(
    code: str, message: str, *, retryable: bool = False, details: Mapping[str, str] | None = None
) -> OpenAiError:
    """The OpenAI answer of a run that ended with this `Error`."""
    return openai_wire.error_for_run(Error(code=code, message=message, retryable=retryable, details=details))


def parse(body: object) -> object:
    return parse_chat_request(json.dumps(body).encode())


def failure(body: object) -> OpenAiError:
    with pytest.raises(OpenAiError) as raised:
        parse(body)
    return raised.value


USER = [{"role": "user", "content": "hi"}]
LOOKUP = {
    "type": "function",
    "function": {
        "name": "lookup",
        "description": "Search the client's catalogue.",
        "parameters": {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]},
    },
}
CALL = {"id": "call_1", "type": "function", "function": {"name": "lookup", "arguments": '{"q": "atlas"}'}}


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
        ({"messages": USER, "tools": [{"type": "custom", "custom": {"name": "x"}}]}, "tools"),
        ({"messages": USER, "tools": [LOOKUP], "tool_choice": {"type": "allowed_tools"}}, "tool_choice"),
        ({"messages": USER, "functions": [{}]}, "functions"),
        ({"messages": USER, "function_call": "auto"}, "function_call"),
        ({"messages": USER, "n": 2}, "n"),
        ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]}, "messages"),
    ],
)
def test_what_cannot_be_honoured_is_refused_as_unsupported(body: object, param: str) -> None:
    error = failure(body)
    assert (error.status, error.code, error.param) == (400, "unsupported_parameter", param)


def test_client_tools_and_their_exchange_become_the_gateway() -> None:
    request = parse(
        {
            "tools": [LOOKUP],
            "tool_choice": {"type": "function", "function": {"name": "lookup"}},
            "parallel_tool_calls": False,
            "messages": [
                {"role": "system", "content": "Be exact."},
                {"role": "user", "content": "Find atlas"},
                {"role": "assistant", "content": None, "tool_calls": [CALL]},
                {"role": "tool", "tool_call_id": "call_1", "content": "Atlas: maps"},
            ],
        }
    )
    gateway = request.gateway  # type: ignore[attr-defined]
    assert request.prompt == "Find atlas"  # type: ignore[attr-defined]
    assert request.prior == [{"role": "system", "content": "Be exact."}]  # type: ignore[attr-defined]
    assert gateway.metadata() == {
        "tools": [
            {
                "name": "lookup",
                "description": "Search the client's catalogue.",
                "parameters": LOOKUP["function"]["parameters"],  # type: ignore[index]
            }
        ],
        "tool_choice": {"type": "function", "function": {"name": "lookup"}},
        "response_format": None,
        "continuation": [
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [{"id": "call_1", "name": "lookup", "arguments": '{"q": "atlas"}'}],
            },
            {"role": "tool", "content": "Atlas: maps", "tool_call_id": "call_1"},
        ],
    }


def test_a_json_schema_response_format_is_kept_and_text_is_nothing_to_ask() -> None:
    schema = {"type": "object", "properties": {"title": {"type": "string"}}}
    fmt = {"type": "json_schema", "json_schema": {"name": "book", "schema": schema, "strict": True}}
    request = parse({"messages": USER, "response_format": fmt})
    assert request.gateway.response_format == fmt  # type: ignore[attr-defined]
    assert parse({"messages": USER, "response_format": {"type": "json_object"}}).gateway.used  # type: ignore[attr-defined]
    assert not parse({"messages": USER, "response_format": {"type": "text"}}).gateway.used  # type: ignore[attr-defined]
    assert not parse({"messages": USER}).gateway.used  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"messages": USER, "tool_choice": "auto"}, "'tool_choice' is only allowed when 'tools' are specified."),
        ({"messages": USER, "tools": [LOOKUP], "tool_choice": "sometimes"}, "'tool_choice' must be one of"),
        (
            {"messages": USER, "tools": [LOOKUP], "tool_choice": {"type": "function", "function": {"name": "x"}}},
            "'tool_choice' names no function of 'tools'",
        ),
        ({"messages": USER, "tools": [LOOKUP, LOOKUP]}, "Two functions are named 'lookup'."),
        ({"messages": USER, "tools": {"lookup": 1}}, "'tools' must be an array."),
        ({"messages": USER, "tools": [LOOKUP] * 129}, "'tools' may hold at most 128 functions."),
        (
            {"messages": USER, "tools": [{"type": "function", "function": {"name": "a b"}}]},
            "tools[0].function.name must be 1 to 64 letters",
        ),
        (
            {"messages": USER, "tools": [{"type": "function", "function": {"name": "x", "parameters": []}}]},
            "tools[0].function.parameters must be a JSON schema of an object.",
        ),
        (
            {
                "messages": USER,
                "tools": [{"type": "function", "function": {"name": "x", "parameters": {"properties": []}}}],
            },
            "tools[0].function.parameters.properties must be an object.",
        ),
        ({"messages": USER, "response_format": {"type": "yaml"}}, "'response_format.type' must be 'text'"),
        ({"messages": USER, "response_format": {"type": "json_schema"}}, "'response_format.json_schema' must be"),
        (
            {"messages": USER, "response_format": {"type": "json_schema", "json_schema": {"name": "../x"}}},
            "'response_format.json_schema.name' must be",
        ),
        ({"messages": [{"role": "tool", "content": "x"}, *USER]}, "messages[0]: a 'tool' message must answer"),
        (
            {"messages": [{"role": "assistant", "content": "", "tool_calls": [{}]}, *USER]},
            "messages[0].tool_calls[0] must be",
        ),
        (
            {"messages": [{"role": "user", "content": "hi", "tool_calls": [CALL]}]},
            "messages[0]: only an assistant makes tool_calls.",
        ),
        (
            {"messages": [*USER, {"role": "assistant", "content": None, "tool_calls": [CALL]}]},
            "The last message must be a user message with content, or the results",
        ),
        ({"messages": USER, "parallel_tool_calls": "yes"}, "'parallel_tool_calls' must be a boolean."),
    ],
)
def test_malformed_client_tools_are_400_invalid_request(body: object, message: str) -> None:
    error = failure(body)
    assert (error.status, error.code) == (400, None)
    assert error.message.startswith(message), error.message


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (b"", "Request body is empty."),
        (b"{nope", "Invalid JSON payload (Malformed JSON: "),
        (b"[1]", "Request body must be a JSON object."),
        (b'{"messages": []}', "'messages' must be a non-empty array."),
        (b'{"messages": [{"role": "user", "content": "hi"}], "stream": "yes"}', "'stream' must be a boolean."),
        (
            b'{"messages": [{"role": "assistant", "content": "hi"}]}',
            "The last message must be a user message with content, or the results",
        ),
        (b'{"messages": [{"role": "wizard", "content": "hi"}]}', "messages[0].role 'wizard' is not valid."),
    ],
)
def test_malformed_requests_are_400_with_a_clear_message(raw: bytes, message: str) -> None:
    with pytest.raises(OpenAiError) as raised:
        parse_chat_request(raw)
    assert raised.value.status == 400
    assert raised.value.message.startswith(message)


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
    assert error_for_run("budget.exceeded", "x").headers() == {"x-should-retry": "false"}
    assert error_for_run("governance.denied", "Request denied by policy p: no").code == "request_blocked"
    no_model = error_for_run("runtime.unavailable", "No model runtime is available: set LLM_BASE_URL")
    assert (no_model.status, no_model.code) == (503, "service_unavailable")
    assert "LLM_BASE_URL" in no_model.message  # the setting to fix, not "try again"
    assert no_model.headers() == {"x-should-retry": "false"}  # a retry cannot configure a model
    assert error_for_run("memory.unavailable", "x").headers() == {"Retry-After": "5"}
    internal = error_for_run("agent.failed", "KeyError: secret")
    assert internal.status == 500
    assert "secret" not in internal.message
    assert internal.headers() == {"x-should-retry": "false"}  # the official client would retry a 500


PROVIDER_CASES = [
    # (code, retryable, details) -> (status, type, code, headers)
    (
        ("provider.rejected", False, {"status": "400", "provider_code": "context_length_exceeded"}),
        (400, "invalid_request_error", "context_length_exceeded", {}),
    ),
    (("provider.rejected", False, {"status": "404"}), (404, "invalid_request_error", None, {})),
    # The provider refused the platform's own key: not the client's fault, and no retry helps.
    (
        ("provider.rejected", False, {"status": "401"}),
        (502, "server_error", "bad_gateway", {"x-should-retry": "false"}),
    ),
    (
        ("provider.rejected", False, {"status": "403"}),
        (502, "server_error", "bad_gateway", {"x-should-retry": "false"}),
    ),
    (
        ("provider.rejected", False, {"status": "429", "provider_code": "insufficient_quota"}),
        (429, "insufficient_quota", "insufficient_quota", {"x-should-retry": "false"}),
    ),
    (
        ("provider.rejected", False, {"status": "409"}),
        (409, "invalid_request_error", None, {"x-should-retry": "false"}),
    ),
    (
        ("provider.rate_limited", True, {"status": "429", "retry_after": "12"}),
        (429, "rate_limit_error", "rate_limit_exceeded", {"Retry-After": "12"}),
    ),
    (
        ("provider.unavailable", True, {"status": "500"}),
        (503, "server_error", "service_unavailable", {"Retry-After": "5"}),
    ),
    (("provider.timeout", True, {}), (503, "server_error", "service_unavailable", {"Retry-After": "5"})),
    (
        ("provider.unavailable", True, {"retry_after": "99999"}),
        (503, "server_error", "service_unavailable", {"Retry-After": "3600"}),
    ),
    (("provider.empty_answer", False, {}), (502, "server_error", "bad_gateway", {"x-should-retry": "false"})),
    (("provider.malformed", False, {}), (502, "server_error", "bad_gateway", {"x-should-retry": "false"})),
    (
        ("provider.rejected", False, {"status": "banana"}),
        (502, "server_error", "bad_gateway", {"x-should-retry": "false"}),
    ),
]


@pytest.mark.parametrize(("run_error", "answer"), PROVIDER_CASES, ids=lambda case: "-".join(map(str, case[:2])))
def test_provider_errors_keep_their_meaning(
    run_error: tuple[str, bool, dict[str, str]], answer: tuple[int, str, str | None, dict[str, str]]
) -> None:
    code, retryable, details = run_error
    error = error_for_run(code, "API returned 400: too many tokens", retryable=retryable, details=details)
    assert (error.status, error.type, error.code, error.headers()) == answer
    assert "too many tokens" in error.message  # the provider's reason reaches the client


def test_a_cut_off_completion_says_why() -> None:
    completion = Completion(model="m")
    assert completion.complete("Half", None, "length")["choices"][0]["finish_reason"] == "length"
    assert completion.complete("All", None)["choices"][0]["finish_reason"] == "stop"


HOSTILE_BODIES = {
    "deep-nesting": b'{"messages": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
    "deep-object": b'{"messages": [{"role": "user", "content": "hi", "x": '
    + b'{"a":' * 5000
    + b"1"
    + b"}" * 5000
    + b"}]}",
    "huge-integer": b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": ' + b"9" * 5000 + b"}",
    "huge-float": b'{"messages": [{"role": "user", "content": "hi"}], "temperature": 1e999}',
    "nan": b'{"messages": [{"role": "user", "content": "hi"}], "temperature": NaN}',
    "lone-surrogate-content": b'{"messages": [{"role": "user", "content": "hi \\ud800"}]}',
    "lone-surrogate-model": b'{"model": "\\udfff", "messages": [{"role": "user", "content": "hi"}]}',
    "lone-surrogate-key": b'{"messages": [{"role": "user", "content": "hi", "\\ud800": 1}]}',
    "invalid-utf8": b'{"messages": [{"role": "user", "content": "\xff\xfe"}]}',
    "oversized-model": json.dumps({"model": "m" * 257, "messages": USER}).encode(),
    "oversized-user": json.dumps({"user": "u" * 300, "messages": USER}).encode(),
    "model-number": json.dumps({"model": 5, "messages": USER}).encode(),
    "temperature-string": json.dumps({"temperature": "hot", "messages": USER}).encode(),
    "max-tokens-float": json.dumps({"max_tokens": 1.5, "messages": USER}).encode(),
    "max-tokens-bool": json.dumps({"max_tokens": True, "messages": USER}).encode(),
    "stop-number": json.dumps({"stop": 5, "messages": USER}).encode(),
    "n-string": json.dumps({"n": "2", "messages": USER}).encode(),
    "too-many-messages": json.dumps({"messages": USER * 1025}).encode(),
    "content-number": json.dumps({"messages": [{"role": "user", "content": 5}]}).encode(),
    "role-number": json.dumps({"messages": [{"role": 1, "content": "hi"}]}).encode(),
    "message-string": json.dumps({"messages": ["hi"]}).encode(),
    "messages-object": json.dumps({"messages": {"role": "user"}}).encode(),
}


@pytest.mark.parametrize("name", list(HOSTILE_BODIES))
def test_hostile_bodies_are_a_400_never_a_crash(name: str) -> None:
    with pytest.raises(OpenAiError) as raised:
        parse_chat_request(HOSTILE_BODIES[name])
    assert raised.value.status == 400
    assert set(raised.value.body()["error"]) == {"message", "type", "param", "code"}


def test_only_an_agent_whose_runtime_hands_calls_back_serves_client_tools() -> None:
    gateway = parse({"messages": USER, "tools": [LOOKUP]}).gateway  # type: ignore[attr-defined]
    langchain = AgentDescriptor(name="chain", runtime="langchain", capabilities=["TOOL_CALLING"])
    with pytest.raises(OpenAiError) as refused:
        check_served(gateway, langchain)
    assert (refused.value.status, refused.value.code) == (400, "unsupported_parameter")
    assert "its runtime 'langchain' cannot hand tool calls back" in refused.value.message
    built_in = AgentDescriptor(name="notes", capabilities=["CLIENT_TOOLS"], tools=["read_note"])
    check_served(gateway, built_in)
    check_served(parse({"messages": USER}).gateway, langchain)  # type: ignore[attr-defined]  # nothing asked of it
