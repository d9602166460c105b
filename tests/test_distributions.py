"""Every distribution installs on its own: it declares what it imports, with floors the code needs.

A workspace hides a missing dependency (everything is installed together), so the declarations
are checked against the imports of each distribution's source instead.
"""

from __future__ import annotations

import ast
import functools
import importlib.util
import re
import sys
import tomllib
from importlib.metadata import distributions, packages_distributions
from pathlib import Path
from typing import Any

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
MEMBERS = sorted([*ROOT.glob("libs/*/pyproject.toml"), *ROOT.glob("services/*/pyproject.toml")])
PINNED_LIBS = {"runtime-crewai", "runtime-semantic-kernel", "runtime-llamaindex"}
IN_PINNED_ENVIRONMENT = importlib.util.find_spec("crewai") is not None
"""Whether this is `.venvs/pinned`, where the pinned adapters (and only they) are installed."""
OPTIONAL = {
    "atmosphere-ai-cli": {"llama-cpp-python"},  # the local model: only when it is installed
    "atmosphere-ai-testing": {"docker"},  # docker-marked tests only (testcontainers brings it)
}


def project(pyproject: Path) -> dict[str, Any]:
    table: dict[str, Any] = tomllib.loads(pyproject.read_text())["project"]
    return table


def declared(meta: dict[str, Any]) -> set[str]:
    requirements = [*meta.get("dependencies", [])]
    for extra in meta.get("optional-dependencies", {}).values():
        requirements += extra
    return {canonicalize_name(Requirement(r).name) for r in requirements}


def imported_modules(src: Path) -> set[str]:
    """Top-level names of every import (module level or inside functions) under `src`."""
    found: set[str] = set()
    for path in src.rglob("*.py"):
        if path.name.endswith(("_pb2.py", "_pb2_grpc.py")):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                # `from google import genai`: the name may be a subpackage of a shared namespace.
                found |= {f"{node.module}.{alias.name}" for alias in node.names}
    return found


@functools.cache
def namespace_files(top: str) -> tuple[tuple[tuple[str, ...], str], ...]:
    """For a namespace package several distributions share (`google`, `opentelemetry`): every
    module path under it (`("opentelemetry", "exporter", "otlp", "proto", "http")`) and its distribution."""
    found: set[tuple[tuple[str, ...], str]] = set()
    for dist in distributions():
        for file in dist.files or ():
            parts = file.parts
            if len(parts) >= 2 and parts[0] == top and parts[-1].endswith(".py"):
                module = (*parts[:-1], parts[-1].removesuffix(".py"))
                found.add((module, canonicalize_name(dist.metadata["Name"])))
    return tuple(found)


def namespace_owners(module: str) -> set[str]:
    """Who installs `module` of a shared namespace: the distributions of its deepest known package.

    `opentelemetry.exporter.otlp.proto.http.trace_exporter` is the HTTP exporter's alone, though
    four distributions install something under `opentelemetry.exporter`.
    """
    wanted = tuple(module.split("."))
    files = namespace_files(wanted[0])
    for depth in range(len(wanted), 1, -1):
        owners = {dist for path, dist in files if path[:depth] == wanted[:depth]}
        if owners:
            return owners
    return set()


def required_distributions(modules: set[str]) -> set[str]:
    owners = packages_distributions()
    needed: set[str] = set()
    for module in modules:
        top, _, rest = module.partition(".")
        if top in sys.stdlib_module_names or top == "__future__":
            continue
        if top == "atmosphere":
            parts = module.split(".")
            # `atmosphere.runtimes.<name>` is the adapter `atmosphere-ai-runtime-<name>`.
            owner = f"runtime-{parts[2]}" if parts[1] == "runtimes" and len(parts) > 2 else parts[1]
            needed.add(canonicalize_name(f"atmosphere-ai-{owner}"))
            continue
        found = owners.get(top, [top])
        if len(found) > 1 and rest:  # a shared namespace: the subpackage says whose (google.protobuf)
            found = sorted(namespace_owners(module) or found)
        needed |= {canonicalize_name(d) for d in found}
    return needed


@pytest.mark.parametrize("pyproject", MEMBERS, ids=lambda p: p.parent.name)
def test_each_distribution_declares_what_it_imports(pyproject: Path) -> None:
    meta = project(pyproject)
    name = meta["name"]
    if (pyproject.parent.name in PINNED_LIBS) != IN_PINNED_ENVIRONMENT:
        pytest.skip("checked in its own environment (the pinned adapters' in .venvs/pinned: make test-pinned)")
    backend = tomllib.loads(pyproject.read_text()).get("tool", {}).get("uv", {}).get("build-backend", {})
    module_name = backend.get("module-name", f"atmosphere.{pyproject.parent.name}")
    module = pyproject.parent / "src" / Path(*module_name.split("."))
    assert module.is_dir(), module
    needed = required_distributions(imported_modules(module)) - {name}
    missing = needed - declared(meta) - OPTIONAL.get(name, set())
    assert missing == set(), f"{name} imports {sorted(missing)} without declaring them"


@pytest.mark.parametrize("pyproject", MEMBERS, ids=lambda p: p.parent.name)
def test_each_distribution_has_a_free_consistent_name_a_license_a_readme_and_types(pyproject: Path) -> None:
    meta = project(pyproject)
    base = pyproject.parent
    # `atmosphere-cli` and `atmosphere` are other projects on the public index.
    assert meta["name"] == f"atmosphere-ai-{base.name}"
    assert meta["license"] == "Apache-2.0"
    assert "Apache License" in (base / "LICENSE").read_text()
    assert (base / meta["readme"]).read_text().startswith(f"# {meta['name']}")
    # The module its build backend packs (`atmosphere.<name>`, `atmosphere.runtimes.<runtime>`) is typed.
    module = tomllib.loads(pyproject.read_text())["tool"]["uv"]["build-backend"]["module-name"]
    assert module.startswith("atmosphere.")
    assert (base / "src" / Path(*module.split(".")) / "py.typed").exists()
    assert not (base / "src" / "atmosphere" / "__init__.py").exists()  # the namespace stays open
    assert not (base / "src" / "atmosphere" / "runtimes" / "__init__.py").exists()  # so does the adapters' one


def floor(meta: dict[str, Any], distribution: str) -> Version:
    for requirement in map(Requirement, meta["dependencies"]):
        if canonicalize_name(requirement.name) == distribution:
            floors = [Version(s.version) for s in requirement.specifier if s.operator == ">="]
            assert floors, f"{distribution} has no >= floor"
            return max(floors)
    raise AssertionError(f"{distribution} is not a dependency")


def test_the_protobuf_and_grpcio_floors_are_those_the_generated_code_checks_at_import() -> None:
    generated = ROOT / "libs/contracts/src"
    protobuf = max(
        Version(m[1])
        for p in generated.rglob("*_pb2.py")
        if (m := re.search(r"^# Protobuf Python Version: (\S+)$", p.read_text(), re.MULTILINE))
    )
    grpcio = max(
        Version(m[1])
        for p in generated.rglob("*_pb2_grpc.py")
        if (m := re.search(r"^GRPC_GENERATED_VERSION = '(\S+)'$", p.read_text(), re.MULTILINE))
    )
    for pyproject in MEMBERS:
        meta = project(pyproject)
        names = {canonicalize_name(Requirement(r).name) for r in meta["dependencies"]}
        if "protobuf" in names:
            assert floor(meta, "protobuf") >= protobuf, meta["name"]
        if "grpcio" in names:
            assert floor(meta, "grpcio") >= grpcio, meta["name"]
