"""The runtime adapters of the workspace, as dispatch finds them: cheap to discover, one distribution each.

Every dispatch process loads every installed runtime's entry point when it starts, to report each
one's state and pick its own. Importing a framework takes seconds (LangChain, the Agents SDK, the
Anthropic SDK: two or three each on this machine), so an adapter's entry point must import no
framework until an agent runs on it: otherwise installing an adapter slows every dispatch start.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from importlib.metadata import entry_points
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parent.parent
ADAPTERS = sorted(ROOT.glob("libs/runtime-*/pyproject.toml"))
FRAMEWORKS = {
    "anthropic": ("anthropic", "httpx2"),
    "langchain": ("langchain", "langchain_core", "langchain_openai", "langgraph", "openai"),
    "langgraph": ("langgraph", "langchain_core", "langchain_openai", "openai"),
    "pydantic-ai": ("pydantic_ai", "openai"),
    "openai-agents": ("agents", "openai"),
    "cohere": ("cohere",),
    "adk": ("google.adk", "google.genai"),
    "agentscope": ("agentscope", "openai"),
    "crewai": ("crewai", "openai"),
    "semantic-kernel": ("semantic_kernel", "openai"),
    "llamaindex": ("llama_index", "openai"),
}
"""The modules (and their submodules) each adapter may import only when it runs an agent."""
PINNED = ROOT / "envs/pinned"
PINNED_PYTHON = ROOT / ".venvs/pinned/bin/python"
PINNED_RUNTIMES = ("crewai", "semantic-kernel", "llamaindex")
"""The adapters of the pinned environment (`envs/pinned`, installed in `.venvs/pinned` by `make
install`): their frameworks cannot be installed beside the others'."""


def python_of(runtime: str) -> str:
    """The interpreter of the environment `runtime` is installed in."""
    return str(PINNED_PYTHON) if runtime in PINNED_RUNTIMES else sys.executable


PROBE = """
import json, sys
from importlib.metadata import entry_points
[entry] = [e for e in entry_points(group="atmosphere.runtimes") if e.name == sys.argv[1]]
runtime = entry.load()
print(json.dumps({"loaded": sorted(sys.modules), "name": runtime.name}))
"""


REGISTERED = """
import json
from importlib.metadata import entry_points
print(json.dumps(sorted(e.name for e in entry_points(group="atmosphere.runtimes"))))
"""


def test_every_adapter_is_a_distribution_registering_its_runtime() -> None:
    registered = {e.name for e in entry_points(group="atmosphere.runtimes")}
    pinned = subprocess.run([str(PINNED_PYTHON), "-c", REGISTERED], capture_output=True, text=True, check=True)
    registered_pinned = set(json.loads(pinned.stdout))
    # Each environment has the built-in runtime and its own adapters, never the other's.
    assert registered_pinned - {"built-in"} == set(PINNED_RUNTIMES)
    assert not registered & set(PINNED_RUNTIMES)
    for pyproject in ADAPTERS:
        project = tomllib.loads(pyproject.read_text())["project"]
        runtime = pyproject.parent.name.removeprefix("runtime-")
        assert project["name"] == f"atmosphere-ai-runtime-{runtime}"
        assert list(project["entry-points"]["atmosphere.runtimes"]) == [runtime]
        assert runtime in (registered_pinned if runtime in PINNED_RUNTIMES else registered), runtime
    assert {p.parent.name.removeprefix("runtime-") for p in ADAPTERS} == set(FRAMEWORKS)


def test_the_pinned_adapters_are_excluded_from_the_workspace_and_members_of_their_environment() -> None:
    workspace = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["uv"]["workspace"]
    assert sorted(workspace["exclude"]) == sorted(f"libs/runtime-{r}" for r in PINNED_RUNTIMES)
    environment = tomllib.loads((PINNED / "pyproject.toml").read_text())
    group = environment["dependency-groups"]["dev"]
    assert {f"atmosphere-ai-runtime-{r}" for r in PINNED_RUNTIMES} <= set(group)


def test_the_adapters_floors_are_the_locked_versions_the_suite_tests() -> None:
    # The floors lane leaves the adapters out (scripts/lowest_env.py: their frameworks need newer
    # versions of the platform's own dependencies): each third-party floor of theirs is what uv.lock
    # holds, so the suite, which runs on the lock, tests each adapter at its floors.
    # A pinned adapter's are what its environment's lock holds.
    main = {p["name"]: p["version"] for p in tomllib.loads((ROOT / "uv.lock").read_text())["package"]}
    pinned = {p["name"]: p["version"] for p in tomllib.loads((PINNED / "uv.lock").read_text())["package"]}
    members = {tomllib.loads(p.read_text())["project"]["name"] for p in ROOT.glob("*/*/pyproject.toml")}
    stale = []
    for pyproject in [*ADAPTERS, ROOT / "libs/langchain-bridge/pyproject.toml"]:
        runtime = pyproject.parent.name.removeprefix("runtime-")
        locked = pinned if runtime in PINNED_RUNTIMES else main
        for line in tomllib.loads(pyproject.read_text())["project"]["dependencies"]:
            requirement = Requirement(line)
            if requirement.name in members:
                continue
            floors = [s.version for s in requirement.specifier if s.operator == ">="]
            version = locked.get(canonicalize_name(requirement.name))
            if floors != [version]:
                stale.append(f"{pyproject.parent.name}: {line} (locked {version})")
    assert not stale, "\n".join(stale)


@pytest.mark.parametrize("runtime", sorted(FRAMEWORKS))
def test_discovering_an_adapter_imports_no_framework(runtime: str) -> None:
    probe = subprocess.run(
        [python_of(runtime), "-c", PROBE, runtime], capture_output=True, text=True, check=True, timeout=60
    )
    report = json.loads(probe.stdout.strip().splitlines()[-1])
    assert report["name"] == runtime
    imported = [m for m in report["loaded"] if any(m == f or m.startswith(f"{f}.") for f in FRAMEWORKS[runtime])]
    assert not imported, f"loading the {runtime} runtime imported {sorted(imported)}"
