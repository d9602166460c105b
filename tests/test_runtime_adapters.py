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
}
"""The modules each adapter may import only when it runs an agent."""

PROBE = """
import json, sys
from importlib.metadata import entry_points
[entry] = [e for e in entry_points(group="atmosphere.runtimes") if e.name == sys.argv[1]]
runtime = entry.load()
print(json.dumps({"loaded": sorted(m.split(".")[0] for m in sys.modules), "name": runtime.name}))
"""


def test_every_adapter_is_a_distribution_registering_its_runtime() -> None:
    registered = {e.name: e.value for e in entry_points(group="atmosphere.runtimes")}
    for pyproject in ADAPTERS:
        project = tomllib.loads(pyproject.read_text())["project"]
        runtime = pyproject.parent.name.removeprefix("runtime-")
        assert project["name"] == f"atmosphere-ai-runtime-{runtime}"
        assert list(project["entry-points"]["atmosphere.runtimes"]) == [runtime]
        assert runtime in registered, runtime
    assert {p.parent.name.removeprefix("runtime-") for p in ADAPTERS} == set(FRAMEWORKS)


def test_the_adapters_floors_are_the_locked_versions_the_suite_tests() -> None:
    # The floors lane leaves the adapters out (scripts/lowest_env.py: their frameworks need newer
    # versions of the platform's own dependencies): each third-party floor of theirs is what uv.lock
    # holds, so the suite, which runs on the lock, tests each adapter at its floors.
    locked = {p["name"]: p["version"] for p in tomllib.loads((ROOT / "uv.lock").read_text())["package"]}
    members = {tomllib.loads(p.read_text())["project"]["name"] for p in ROOT.glob("*/*/pyproject.toml")}
    stale = []
    for pyproject in [*ADAPTERS, ROOT / "libs/langchain-bridge/pyproject.toml"]:
        for line in tomllib.loads(pyproject.read_text())["project"]["dependencies"]:
            requirement = Requirement(line)
            if requirement.name in members:
                continue
            floors = [s.version for s in requirement.specifier if s.operator == ">="]
            if floors != [locked[canonicalize_name(requirement.name)]]:
                stale.append(f"{pyproject.parent.name}: {line} (locked {locked[canonicalize_name(requirement.name)]})")
    assert not stale, "\n".join(stale)


@pytest.mark.parametrize("runtime", sorted(FRAMEWORKS))
def test_discovering_an_adapter_imports_no_framework(runtime: str) -> None:
    probe = subprocess.run(
        [sys.executable, "-c", PROBE, runtime], capture_output=True, text=True, check=True, timeout=60
    )
    report = json.loads(probe.stdout.strip().splitlines()[-1])
    assert report["name"] == runtime
    imported = set(FRAMEWORKS[runtime]) & set(report["loaded"])
    assert not imported, f"loading the {runtime} runtime imported {sorted(imported)}"
