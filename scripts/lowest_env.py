"""The declared dependency floors, installed: every library and service at its lowest versions.

`make test-lowest` runs the unit, integration and contract tests in this environment, so a floor
that stops working (a `>=` older than the code needs) fails CI instead of a user's install.

    python scripts/lowest_env.py sync .atmosphere/lowest    # (re)installs when an input changed
    .atmosphere/lowest/bin/python scripts/lowest_env.py check    # each floor is what got installed

`sync` installs every workspace member (with all its extras) editable, resolved with uv's
`lowest-direct`: each member's own dependencies at the lowest version its specifiers allow. The
rest is capped at uv.lock's versions, so the environment changes only when the lock or a
pyproject does, never because a transitive dependency released something overnight. `check` then
fails unless every `>=` floor is exactly the version installed: a floor that names no release,
that two members disagree on, or that the resolver had to skip (it conflicts with another
floor) is reported rather than silently tested at some other version.
"""

from __future__ import annotations

import argparse
import hashlib
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path
from typing import Any

from packaging.requirements import Requirement
from packaging.version import Version

ROOT = Path(__file__).resolve().parent.parent
ADAPTERS = sorted([*ROOT.glob("libs/runtime-*/pyproject.toml"), ROOT / "libs/langchain-bridge/pyproject.toml"])
"""The runtime adapters (and what two of them share): left out of this environment. Their frameworks
need newer versions of what the platform itself uses (pydantic, starlette, anyio...), which would
push the platform's own packages past their floors here; their floors are the versions uv.lock
holds, so the suite tests them there (tests/test_runtime_adapters.py holds them to the lock)."""
MEMBERS = sorted({*ROOT.glob("libs/*/pyproject.toml"), *ROOT.glob("services/*/pyproject.toml")} - set(ADAPTERS))
LOCK = ROOT / "uv.lock"
STAMP = ".floors-stamp"
# What the lane's tests need that no member depends on, at the versions locked for development.
# The runner itself (pytest, pytest-asyncio) is a dependency of atmosphere-ai-testing, so it runs
# at its floor.
TEST_TOOLS = ("pytest-timeout", "hypothesis")
PYTHON = "3.11"
UNTESTED_EXTRAS = {
    "atmosphere-ai-cli": {"local-model"},
    "atmosphere-ai-ingress": {"mcp", "a2a", "ag-ui"},
    "atmosphere-ai-sandbox": {"mcp"},
    "atmosphere-ai-dispatch": {"a2a"},
}
"""Extras left out of the lane: `local-model` compiles llama.cpp from source (minutes) and holds a
model file; no test of the lane imports it (the model server's own tests run in `.venv`). Ingress's
protocol doors (`mcp`, `a2a`, `ag-ui`), the sandbox's MCP client (`mcp`) and dispatch's A2A client
(`a2a`, remote delegation): their SDKs need newer pydantic, starlette and anyio than the platform's
floors (as the runtime adapters' frameworks do), so installing them here would lift the platform
past its floors; ingress without them serves no door (and says so), the sandbox reports declared
MCP servers INACTIVE, dispatch refuses a remote delegation naming the extra, which is what this
lane tests, and their own tests run on uv.lock's versions in the suite."""


def _project(pyproject: Path) -> dict[str, Any]:
    project: dict[str, Any] = tomllib.loads(pyproject.read_text())["project"]
    return project


def _extras(project: dict[str, Any]) -> dict[str, list[str]]:
    """A member's extras the lane installs (all but `UNTESTED_EXTRAS`), by name."""
    skipped = UNTESTED_EXTRAS.get(str(project["name"]), set())
    return {name: list(deps) for name, deps in project.get("optional-dependencies", {}).items() if name not in skipped}


def _editables() -> Iterator[str]:
    """`<member's directory>[<every tested extra>]` for each workspace member."""
    for pyproject in MEMBERS:
        extras = sorted(_extras(_project(pyproject)))
        yield f"{pyproject.parent}[{','.join(extras)}]" if extras else str(pyproject.parent)


def _locked() -> dict[str, str]:
    """The newest version uv.lock holds of each package from an index (members excluded)."""
    newest: dict[str, str] = {}
    for package in tomllib.loads(LOCK.read_text())["package"]:
        if "registry" not in package.get("source", {}):
            continue
        name, version = package["name"], package["version"]
        if name not in newest or Version(version) > Version(newest[name]):
            newest[name] = version
    return newest


def _fingerprint(requirements: list[str], constraints: str) -> str:
    digest = hashlib.sha256(Path(__file__).read_bytes())
    for pyproject in MEMBERS:
        digest.update(pyproject.read_bytes())
    digest.update("\n".join([*requirements, constraints, PYTHON]).encode())
    return digest.hexdigest()


def sync(venv: Path, uv: str) -> None:
    """Install the floors into `venv`, unless it already holds exactly these inputs."""
    locked = _locked()
    tools = [f"{tool}=={locked[tool]}" for tool in TEST_TOOLS]
    constraints = "".join(f"{name}<={version}\n" for name, version in sorted(locked.items()))
    fingerprint = _fingerprint(tools, constraints)
    stamp = venv / STAMP
    if stamp.is_file() and stamp.read_text() == fingerprint:
        print(f"{venv}: the floors are installed (inputs unchanged)")
        return
    subprocess.run([uv, "venv", "--quiet", "--clear", "--python", PYTHON, str(venv)], check=True)
    capped = venv / "lock-caps.txt"
    capped.write_text(constraints)
    editables = [arg for member in _editables() for arg in ("-e", member)]
    install = [uv, "pip", "install", "--python", str(venv / "bin" / "python"), "--resolution", "lowest-direct"]
    subprocess.run([*install, "--constraints", str(capped), *editables, *tools], check=True)
    stamp.write_text(fingerprint)


def _floors() -> Iterator[tuple[str, str, str]]:
    """(member, package, floor) for each `>=` of each member's dependencies on this platform."""
    members = {str(_project(pyproject)["name"]) for pyproject in MEMBERS}
    for pyproject in MEMBERS:
        project = _project(pyproject)
        declared: list[str] = list(project.get("dependencies", []))
        for extra in _extras(project).values():
            declared.extend(extra)
        for line in declared:
            requirement = Requirement(line)
            if requirement.name in members or (requirement.marker and not requirement.marker.evaluate()):
                continue
            for spec in requirement.specifier:
                if spec.operator in (">=", "=="):
                    yield str(project["name"]), requirement.name, spec.version


def check() -> int:
    """Report every floor that is not the version installed here; 1 if any."""
    wrong = []
    floors = list(_floors())
    for member, package, floor in floors:
        installed = metadata.version(package)
        if Version(installed) != Version(floor):
            wrong.append(f"  {member}: {package} {floor} declared, {installed} installed")
    if wrong:
        print("floors not tested at their own version (raise them to what installs):", *wrong, sep="\n")
        return 1
    print(f"{len(floors)} floors installed at exactly their declared version")
    return 0


def main() -> int:
    """`sync VENV [--uv UV]` or `check`; the exit status."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    sync_command = commands.add_parser("sync", help="install the floors into VENV (when an input changed)")
    sync_command.add_argument("venv", type=Path)
    sync_command.add_argument("--uv", default="uv", help="the uv executable")
    commands.add_parser("check", help="in the lowest env: every floor is the version installed")
    args = parser.parse_args()
    if args.command == "sync":
        sync(args.venv, args.uv)
        return 0
    return check()


if __name__ == "__main__":
    sys.exit(main())
