"""Check docker-compose.yml against the Compose specification's JSON schema, offline.

    .venv/bin/python -m scripts.validate_compose     # from the repository root; exit 1 on a problem

`docker compose config` would do this, but it needs the Compose plugin, which the dev machines
lack (Debian ships only the retired Python `docker-compose` 1.x). So this reads the file as
Compose does before it validates: YAML with merge keys resolved (and a key written twice
refused), `${NAME:-default}` interpolated from an environment (empty here: the defaults), and
validates the result against the schema Compose itself embeds, vendored as
deploy/compose/compose-spec.json (compose-spec/compose-go, Apache-2.0; deploy/compose/README.md).
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jsonschema

from scripts.strict_yaml import strict_load

ROOT = Path(__file__).resolve().parent.parent
COMPOSE_FILE = ROOT / "docker-compose.yml"
SCHEMA = ROOT / "deploy" / "compose" / "compose-spec.json"
# `$$` (a literal dollar), `${NAME}`, `${NAME:-default}` (unset or empty), `${NAME-default}` (unset).
_VARIABLE = re.compile(r"\$\$|\$\{(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?:(?P<op>:?-)(?P<default>[^}]*))?\}")


class InterpolationError(ValueError):
    """A `${...}` form this reader does not implement, or a variable with no value and no default."""


def interpolate(value: Any, environment: Mapping[str, str]) -> Any:
    """`value` with every `${...}` in its strings replaced, as Compose does before validating."""
    if isinstance(value, dict):
        return {key: interpolate(item, environment) for key, item in value.items()}
    if isinstance(value, list):
        return [interpolate(item, environment) for item in value]
    if not isinstance(value, str):
        return value

    def replace(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        name, op, default = match["name"], match["op"], match["default"]
        current = environment.get(name)
        if op == ":-" and not current:
            return str(default)
        if op == "-" and current is None:
            return str(default)
        if current is None:
            msg = f"${{{name}}} has no value and no default"
            raise InterpolationError(msg)
        return current

    replaced = _VARIABLE.sub(replace, value)
    if re.search(r"\$\{", replaced.replace("$$", "")):
        msg = f"unsupported interpolation in {value!r}"
        raise InterpolationError(msg)
    return replaced


def load(environment: Mapping[str, str] | None = None, path: Path = COMPOSE_FILE) -> dict[str, Any]:
    """The Compose file as Compose reads it: merged, interpolated from `environment`."""
    return interpolate(strict_load(path.read_text()), environment or {})  # type: ignore[no-any-return]


def schema_errors(compose: Mapping[str, Any]) -> list[str]:
    """Where `compose` breaks the Compose schema, each with its path."""
    validator = jsonschema.Draft202012Validator(json.loads(SCHEMA.read_text()))
    return [
        f"{'.'.join(str(p) for p in error.absolute_path) or '(top)'}: {error.message}"
        for error in sorted(validator.iter_errors(compose), key=lambda e: list(map(str, e.absolute_path)))
    ]


def main() -> int:
    """Validate docker-compose.yml; print each problem; 1 when there is any."""
    found = schema_errors(load())
    print(f"{COMPOSE_FILE.name}: {len(found)} problems")
    for problem in found:
        print(f"  {problem}")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
