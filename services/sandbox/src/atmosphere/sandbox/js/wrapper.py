"""The JavaScript around the model's code: runs it, and renders its final value as text, inside V8.

The code runs through an indirect `eval`, so it is a script in the global scope (its last
expression is its value) and cannot see the wrapper's own bindings. Everything the wrapper needs
is captured before the code runs, so code that replaces `JSON.stringify` or `String.prototype.slice`
can only spoil its own result (the worker checks the reply's shape and size again anyway).

Rendering is done in JavaScript, not by mini-racer's conversion of values to Python: that
conversion fails on a BigInt (and leaves the call waiting), and copying a huge string to Python
only to cut it would cost its full size. The wrapper answers a JSON text
`{"kind": "result"|"error", "text": ..., "truncated": bool}`; when the code's value is a Promise, it
answers `{"kind": "pending"}` and, once the Promise settles, puts that JSON text in the global
named by `answer_key` (the worker polls for it within the call's timeout).

Values: `undefined` → `undefined`; strings as they are; objects and arrays as JSON (a BigInt in
them as `"<n>n"`); functions as `[Function: name]`; symbols as `Symbol(description)`; a BigInt as
`<n>n`; numbers, booleans and `null` as JavaScript prints them. A thrown error is `Name: message`.
Text longer than the limit (UTF-16 units) is cut, never inside a surrogate pair.
"""

from __future__ import annotations

import json
from typing import Final

_TEMPLATE: Final = """(() => {
  "use strict";
  const source = __SOURCE__;
  const limit = __LIMIT__;
  const indirectEval = globalThis.eval;
  const call = Function.prototype.call;
  const slice = call.bind(String.prototype.slice);
  const charCodeAt = call.bind(String.prototype.charCodeAt);
  const symbolText = call.bind(Symbol.prototype.toString);
  const then = call.bind(Promise.prototype.then);
  const NativePromise = Promise;
  const stringify = JSON.stringify;
  const defineProperty = Object.defineProperty;
  const toText = String;
  // Pure JavaScript only: WebAssembly memory lives outside the V8 heap limit.
  delete globalThis.WebAssembly;

  const cut = (text) => {
    if (text.length <= limit) return { text, truncated: false };
    let end = limit;
    const last = charCodeAt(text, end - 1);
    if (last >= 0xd800 && last <= 0xdbff) end -= 1;
    return { text: slice(text, 0, end), truncated: true };
  };
  const reply = (kind, text) => {
    const kept = cut(text);
    return stringify({ kind, text: kept.text, truncated: kept.truncated });
  };
  const jsonValue = (_key, item) => (typeof item === "bigint" ? `${item}n` : item);
  const render = (value) => {
    switch (typeof value) {
      case "undefined": return "undefined";
      case "string": return value;
      case "bigint": return `${value}n`;
      case "symbol": return symbolText(value);
      case "function": return value.name ? `[Function: ${toText(value.name)}]` : "[Function (anonymous)]";
      case "object": {
        if (value === null) return "null";
        const json = stringify(value, jsonValue);
        return json === undefined ? toText(value) : json;
      }
      default: return toText(value);
    }
  };
  const describe = (error) => {
    try {
      if ((typeof error === "object" && error !== null) || typeof error === "function") {
        const name = error.name;
        const message = error.message;
        if (message !== undefined) {
          const label = name === undefined ? "Error" : toText(name);
          const text = toText(message);
          return text ? `${label}: ${text}` : label;
        }
      }
      return `Uncaught ${render(error)}`;
    } catch {
      return "Uncaught exception (it could not be described)";
    }
  };
  const settle = (value) => {
    try {
      return reply("result", render(value));
    } catch (error) {
      return reply("error", `the result could not be shown: ${describe(error)}`);
    }
  };
  const failed = (error) => reply("error", describe(error));

  let value;
  try {
    value = indirectEval(source);
  } catch (error) {
    return failed(error);
  }
  if (!(value instanceof NativePromise)) return settle(value);
  // The answer is parked where the worker polls for it: waiting on the Promise from Python would
  // block on an isolate kept busy by a promise loop, while a poll is an eval with its own timeout.
  const park = (answer) => {
    defineProperty(globalThis, __KEY__, { value: answer, configurable: true });
  };
  then(value, (result) => park(settle(result)), (error) => park(failed(error)));
  return stringify({ kind: "pending" });
})()"""


def wrapped(code: str, max_output_chars: int, answer_key: str) -> str:
    """The script that runs `code` and answers its rendered value, cut to `max_output_chars`.

    A Promise's answer is put in the global `answer_key` once it settles (see `answer_probe`).
    """
    # A JSON string is a valid JavaScript string literal: the code is data here, never spliced in.
    # It goes in last, so text in the code that looks like a placeholder is left alone.
    script = _TEMPLATE.replace("__LIMIT__", str(int(max_output_chars))).replace("__KEY__", json.dumps(answer_key))
    return script.replace("__SOURCE__", json.dumps(code))


def answer_probe(answer_key: str) -> str:
    """The expression whose value is a settled Promise's answer, `undefined` until then."""
    return f"globalThis[{json.dumps(answer_key)}]"
