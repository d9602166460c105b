"""What `eval` answers: the final expression's value as text, and JavaScript errors by name."""

from __future__ import annotations

import pytest

from atmosphere.sandbox.js.pool import EvalPool

pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest.mark.parametrize(
    ("code", "text"),
    [
        ("1+1", "2"),
        ("let total = 0; for (let i = 1; i <= 10; i++) total += i; total", "55"),
        ("({a: 1, b: [1, 'two', null], c: {d: true}})", '{"a":1,"b":[1,"two",null],"c":{"d":true}}'),
        ("[1, 2, 3].map(x => x * 2)", "[2,4,6]"),
        ("undefined", "undefined"),
        ("var nothing", "undefined"),
        ("null", "null"),
        ("'as is'", "as is"),
        ("0.1 + 0.2", "0.30000000000000004"),
        ("1/0", "Infinity"),
        ("true", "true"),
        ("2n ** 70n", "1180591620717411303424n"),
        ("({big: 1n})", '{"big":"1n"}'),
        ("(function area(r) { return r * r })", "[Function: area]"),
        ("(() => 1)", "[Function (anonymous)]"),
        ("Symbol('tag')", "Symbol(tag)"),
        ("new Date(0)", '"1970-01-01T00:00:00.000Z"'),
        ("(async () => 6 * 7)()", "42"),
        ("new Promise(resolve => setTimeout(() => resolve('later'), 20))", "later"),
        ("'é' + '😀'", "é😀"),
    ],
)
async def test_the_final_expression_value_as_text(shared_pool: EvalPool, code: str, text: str) -> None:
    outcome = await shared_pool.evaluate(code)
    assert (outcome.kind, outcome.text, outcome.truncated) == ("result", text, False)


@pytest.mark.parametrize(
    ("code", "text"),
    [
        ("require('fs')", "Error: ReferenceError: require is not defined"),
        ("null.x", "Error: TypeError: Cannot read properties of null (reading 'x')"),
        ("[1, 2", "Error: SyntaxError: Unexpected end of input"),
        ("throw new RangeError('too far')", "Error: RangeError: too far"),
        ("throw 'plain'", "Error: Uncaught plain"),
        ("Promise.reject(new TypeError('refused'))", "Error: TypeError: refused"),
        ("(async () => { throw new Error('inside') })()", "Error: Error: inside"),
    ],
)
async def test_javascript_errors_keep_their_name(shared_pool: EvalPool, code: str, text: str) -> None:
    outcome = await shared_pool.evaluate(code)
    assert (outcome.kind, outcome.text) == ("error", text)
    assert outcome.is_error


async def test_a_value_that_cannot_be_json_is_an_error_saying_why(shared_pool: EvalPool) -> None:
    outcome = await shared_pool.evaluate("const o = {}; o.self = o; o")
    assert outcome.kind == "error"
    assert outcome.text.startswith("Error: the result could not be shown: TypeError: Converting circular structure")


async def test_a_long_value_is_cut_to_the_limit_and_never_inside_a_surrogate_pair(shared_pool: EvalPool) -> None:
    limit = shared_pool.settings.max_output_chars
    ascii_cut = await shared_pool.evaluate(f"'a'.repeat({limit + 1})")
    assert (ascii_cut.text, ascii_cut.truncated) == ("a" * limit, True)
    exact = await shared_pool.evaluate(f"'a'.repeat({limit})")
    assert (exact.text, exact.truncated) == ("a" * limit, False)
    # An emoji is two UTF-16 units: after one ASCII character, the limit falls inside a pair.
    pairs = await shared_pool.evaluate(f"'a' + '😀'.repeat({limit})")
    assert pairs.truncated
    assert pairs.text == "a" + "😀" * ((limit - 1) // 2)


async def test_code_that_replaces_the_built_ins_spoils_only_its_own_answer(shared_pool: EvalPool) -> None:
    outcome = await shared_pool.evaluate(
        "JSON.stringify = () => 'forged'; String.prototype.slice = () => ''; 'y'.repeat(1000)"
    )
    assert (outcome.text, outcome.truncated) == ("y" * shared_pool.settings.max_output_chars, True)
    assert (await shared_pool.evaluate("typeof JSON.stringify({})")).text == "string"
