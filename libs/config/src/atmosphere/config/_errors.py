"""Invalid settings in words an operator acts on: the variable, what it must be, never its value.

pydantic's own text (`str(ValidationError)`) names model paths (`ingress.auth_tokens.0.token`)
and repeats every rejected input, which for a token or a password is the secret itself. These
lines name the environment variable instead and say what is required, built only from each
error's type and constraints; a validator's own message is kept, minus anything it quoted of
the input.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Iterator, Sequence
from typing import Any

from pydantic import BaseModel, ValidationError
from pydantic_settings import BaseSettings, SettingsError

_REQUIREMENTS = {
    "string_too_short": "must be at least {min_length} characters",
    "string_too_long": "must be at most {max_length} characters",
    "too_short": "must have at least {min_length} entries",
    "too_long": "must have at most {max_length} entries",
    "greater_than": "must be greater than {gt}",
    "greater_than_equal": "must be at least {ge}",
    "less_than": "must be less than {lt}",
    "less_than_equal": "must be at most {le}",
    "literal_error": "must be {expected}",
    "enum": "must be {expected}",
    "int_parsing": "must be a whole number",
    "int_type": "must be a whole number",
    "int_from_float": "must be a whole number",
    "float_parsing": "must be a number",
    "float_type": "must be a number",
    "bool_parsing": "must be true or false",
    "bool_type": "must be true or false",
    "json_invalid": "must be valid JSON ({error})",
    "missing": "is required",
    "string_type": "must be text",
    "list_type": "must be a JSON list",
    "tuple_type": "must be a JSON list",
    "dict_type": "must be a JSON object",
    "model_type": "must be a JSON object",
    "model_attributes_type": "must be a JSON object",
}
"""What an error of each pydantic type requires, from its constraints (`ctx`) alone."""

_SHORTEST_REDACTED = 16
"""Input text at least this long is cut out of a validator's message wherever it appears (a key,
a password); shorter text only where it is quoted (`'...'`, how validators here cite a value),
so that a word of the message itself (`anonymous`, `memory`) is never taken for it."""


SETTINGS_ERRORS = (ValidationError, SettingsError)
"""What reading settings from the environment raises when they are invalid (catch these)."""
InvalidSettingsError = ValidationError | SettingsError
"""One of `SETTINGS_ERRORS`."""


def invalid_settings(error: InvalidSettingsError, settings: type[BaseModel] | None = None) -> list[str]:
    """One line per problem, `VARIABLE: what it must be`, without any setting's value.

    `settings` (the class that was being read) turns model paths into variable names; without
    it the path is shown as is.
    """
    if isinstance(error, SettingsError):
        return [_unparsable(error, settings)]
    model = _model_titled(settings, error.title) if settings is not None else None
    inputs = [e.get("input") for e in error.errors(include_url=False)]
    lines = []
    for details, value in zip(error.errors(include_url=False, include_input=False), inputs, strict=True):
        variable = _variable(model, details["loc"]) if model is not None else _path(details["loc"])
        lines.append(f"{variable}: {_requirement(details, value)}")
    return lines


def _requirement(details: Any, value: object) -> str:
    """What the setting must be: from the error's type and constraints, else the validator's words."""
    context = details.get("ctx") or {}
    template = _REQUIREMENTS.get(details["type"])
    if template is not None:
        try:
            return template.format(**{name: _plain(bound) for name, bound in context.items()})
        except KeyError:
            pass
    if details["type"] in {"value_error", "assertion_error"} and "error" in context:
        return _redacted(str(context["error"]), value)  # without pydantic's "Value error, "
    return _redacted(str(details["msg"]), value)


def _plain(bound: object) -> object:
    """A bound as people write it: `0`, not `0.0`."""
    return int(bound) if isinstance(bound, float) and bound.is_integer() else bound


def _redacted(message: str, value: object) -> str:
    # A validator may quote what it rejects (`got {value!r}`); none of it is shown.
    for text, anywhere in sorted(set(_texts(value)), key=lambda t: len(t[0]), reverse=True):
        message = message.replace(repr(text), "'…'")
        if anywhere and len(text) >= _SHORTEST_REDACTED:
            message = message.replace(text, "…")
    return message


def _texts(value: object, *, key: bool = False) -> Iterator[tuple[str, bool]]:
    """Every string in `value`: itself, or the keys and leaves of the JSON it holds.

    Each comes with whether it may be cut wherever it appears: keys are often field names, so
    they are cut only where quoted.
    """
    if isinstance(value, str):
        yield value, not key
        if value.strip()[:1] in {"[", "{"}:
            with contextlib.suppress(ValueError):
                yield from _texts(json.loads(value))
    elif isinstance(value, dict):
        for name, item in value.items():
            yield from _texts(name, key=True)
            yield from _texts(item)
    elif isinstance(value, list | tuple | set | frozenset):
        for item in value:
            yield from _texts(item)
    elif isinstance(value, int | float) and not isinstance(value, bool):
        yield str(value), False


def _model_titled(settings: type[BaseModel], title: str) -> type[BaseModel] | None:
    """`settings`, or the nested settings class named `title` whose own defaults failed (e.g. `LLM_*`)."""
    if settings.__name__ == title:
        return settings
    for field in settings.model_fields.values():
        nested = field.annotation
        if isinstance(nested, type) and issubclass(nested, BaseModel):
            found = _model_titled(nested, title)
            if found is not None:
                return found
    return None


def _variable(model: type[BaseModel], loc: Sequence[int | str]) -> str:
    """The environment variable `loc` was read from, with the path inside its JSON value if any."""
    name = _prefix(model)
    current: type[BaseModel] | None = model
    for i, part in enumerate(loc):
        field = _field(current, part) if current is not None else None
        if field is None:
            # Past the variable: the path inside its (JSON) value, or a model-wide check.
            return (name + "*" if name.endswith("__") else name) + _path(loc[i:], inside=True)
        key, nested = field
        if nested is not None and issubclass(nested, BaseSettings):
            name, current = _prefix(nested), nested  # a nested class reads its own prefix (`LLM_*`)
        elif nested is not None:
            name, current = f"{name}{key.upper()}{_delimiter(model)}", nested
        else:
            return f"{name}{key.upper()}{_path(loc[i + 1 :], inside=True)}"
    return name + "*" if name.endswith("__") else name


def _field(model: type[BaseModel], part: int | str) -> tuple[str, type[BaseModel] | None] | None:
    """The field `part` names (by name or alias): its variable key and its model type, if it is one."""
    if not isinstance(part, str):
        return None
    for name, field in model.model_fields.items():
        aliases = {name, field.alias, field.validation_alias if isinstance(field.validation_alias, str) else None}
        if part in aliases:
            key = part if part != name else (field.alias or name)
            annotation = field.annotation
            nested = annotation if isinstance(annotation, type) and issubclass(annotation, BaseModel) else None
            return key, nested
    return None


def _prefix(model: type[BaseModel]) -> str:
    return str(model.model_config.get("env_prefix", "")) if issubclass(model, BaseSettings) else ""


def _delimiter(model: type[BaseModel]) -> str:
    return str(model.model_config.get("env_nested_delimiter") or "__")


def _path(loc: Sequence[int | str], *, inside: bool = False) -> str:
    """`[0].token` inside a variable's value; `ingress.auth_tokens[0].token` without variable names."""
    text = "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in loc)
    return text if inside else text.removeprefix(".")


_FIELD_OF_SETTINGS_ERROR = re.compile(r'error parsing value for field "(?P<field>[^"]+)"')


def _unparsable(error: SettingsError, settings: type[BaseModel] | None) -> str:
    """A variable pydantic-settings could not even decode (JSON), named by its field; no value."""
    match = _FIELD_OF_SETTINGS_ERROR.search(str(error))
    if match is None or settings is None:
        subject = "a variable"
    else:
        subject = _variable(settings, [match["field"]])
    cause = error.__cause__
    reason = ""
    if isinstance(cause, json.JSONDecodeError):
        # The decoder's own words say where the text breaks, never what it holds.
        reason = f": {cause.msg} at line {cause.lineno} column {cause.colno}"
    return f"{subject}: cannot be read; JSON values must be valid JSON{reason}"
