"""A small JSON-schema check of tool arguments at the choke point.

The sandbox validates fully (pydantic, from the tool's signature); this check only stops the
obvious mistakes early — a missing required field, a wrong JSON type, a value outside an
enum, an unexpected field — so a malformed call is refused before governance and the
`tool-start` frame.
"""

from __future__ import annotations

from typing import Any

_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "array": (list,),
    "object": (dict,),
    "null": (type(None),),
}


def _matches(value: Any, expected: str | list[str] | None) -> bool:
    if expected is None:
        return True
    names = [expected] if isinstance(expected, str) else expected
    for name in names:
        kinds = _TYPES.get(name)
        if kinds is None:
            return True  # an unknown type keyword: leave it to the sandbox
        if isinstance(value, bool) and name in {"integer", "number"}:
            continue
        if isinstance(value, kinds):
            return True
    return False


def check_arguments(schema: dict[str, Any], arguments: dict[str, Any]) -> list[str]:
    """Problems with `arguments` against an object `schema` (empty when none are found)."""
    problems = [f"{name}: field required" for name in schema.get("required", []) if name not in arguments]
    properties: dict[str, Any] = schema.get("properties") or {}
    for name, value in arguments.items():
        prop = properties.get(name)
        if prop is None:
            if schema.get("additionalProperties") is False:
                problems.append(f"{name}: unexpected field")
            continue
        if not isinstance(prop, dict):
            continue
        if not _matches(value, prop.get("type")):
            problems.append(f"{name}: expected {prop.get('type')}, got {type(value).__name__}")
        elif "enum" in prop and value not in prop["enum"]:
            problems.append(f"{name}: must be one of {prop['enum']}")
    return problems
