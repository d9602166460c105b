"""Architecture rules that code review alone would let slip."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SERVICES = sorted(p.name for p in (ROOT / "services").iterdir() if (p / "src").is_dir())


def imports(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
    return found


def python_files(*roots: Path) -> list[Path]:
    return [p for root in roots for p in root.rglob("*.py")]


def test_services_never_import_each_other() -> None:
    for service in SERVICES:
        others = {f"atmosphere.{s}" for s in SERVICES if s != service}
        for path in python_files(ROOT / "services" / service / "src"):
            bad = {m for m in imports(path) if any(m == o or m.startswith(o + ".") for o in others)}
            assert not bad, f"{path.relative_to(ROOT)} imports another service: {bad}"


# The agent test kit (`libs/testing`) starts services through their `serve()`: what it may import
# of them is held by `tests/test_seams.py` (`app.serve` and the settings class, nothing else).
AGENT_TEST_KIT = ROOT / "libs" / "testing" / "src"


def test_libraries_never_import_services() -> None:
    services = {f"atmosphere.{s}" for s in SERVICES}
    for path in python_files(ROOT / "libs"):
        if AGENT_TEST_KIT in path.parents:
            continue
        bad = {m for m in imports(path) if any(m == s or m.startswith(s + ".") for s in services)}
        assert not bad, f"{path.relative_to(ROOT)} imports a service: {bad}"


def test_only_the_bus_imports_nats() -> None:
    allowed = ROOT / "libs" / "bus" / "src"
    test_support = ROOT / "libs" / "testing" / "src"
    # Outside subscribers: they show what a plain NATS client does without the platform's bus.
    followers = ROOT / "examples" / "followers"
    for path in python_files(ROOT / "libs", ROOT / "services", ROOT / "examples"):
        if any(d in path.parents for d in (allowed, test_support, followers)) or "tests" in path.parts:
            continue
        bad = {m for m in imports(path) if m == "nats" or m.startswith("nats.")}
        assert not bad, f"{path.relative_to(ROOT)} imports nats directly: {bad}"


def test_mcp_clients_live_in_the_sandbox_only() -> None:
    # Dispatch runs on the pinned environment too (CrewAI pins `mcp < 2`), and a stdio MCP server
    # is a child of whoever talks to it: MCP client traffic is the sandbox's alone. The SDK and
    # dispatch only name servers and tools (`atmosphere.sdk._mcp`); ingress's MCP door is a server.
    client = ROOT / "services" / "sandbox" / "src" / "atmosphere" / "sandbox" / "mcp_client"
    roots = [ROOT / "libs", *(ROOT / "services" / s / "src" for s in SERVICES if s not in {"ingress"})]
    for path in python_files(*roots):
        if client in path.parents or "tests" in path.parts:
            continue
        bad = {m for m in imports(path) if m.split(".")[0] in {"mcp", "mcp_types"}}
        assert not bad, f"{path.relative_to(ROOT)} imports the MCP SDK: {bad}"


def test_handlers_hold_logic_without_transport_imports() -> None:
    for path in ROOT.glob("services/*/src/atmosphere/*/handlers.py"):
        bad = {m for m in imports(path) if m.split(".")[0] in {"nats", "fastapi", "starlette", "uvicorn", "grpc"}}
        assert not bad, f"{path.relative_to(ROOT)} imports a transport: {bad}"


# `handlers.py` means one thing: what answers the service's bus subjects. Ingress answers HTTP
# and WebSockets instead (its routes are the `*_api.py` modules), so it has none.
BUS_SERVICES = [s for s in SERVICES if s != "ingress"]


def test_every_service_has_the_standard_anatomy() -> None:
    for service in SERVICES:
        package = ROOT / "services" / service / "src" / "atmosphere" / service
        modules = ("__main__.py", "app.py", "settings.py") + (("handlers.py",) if service in BUS_SERVICES else ())
        for module in modules:
            assert (package / module).is_file(), f"{service} lacks {module}"
    assert not (ROOT / "services" / "ingress" / "src" / "atmosphere" / "ingress" / "handlers.py").exists()
    assert not list(ROOT.glob("*/*/src/atmosphere/__init__.py")), "atmosphere must stay a namespace package"


def test_settings_are_read_only_in_main() -> None:
    # Settings classes are instantiated in __main__ only; everything else receives them.
    for path in python_files(ROOT / "services"):
        if path.name == "__main__.py" or "tests" in path.parts:
            continue
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id.endswith("Settings"):
                raise AssertionError(f"{path.relative_to(ROOT)} instantiates {node.func.id}")


def test_the_sdk_never_imports_the_test_kit() -> None:
    # `import atmosphere.sdk` works without the services installed, and the SDK, the services and
    # the kit form no package loop: the kit (a distribution of its own) imports the SDK, never back.
    for path in python_files(ROOT / "libs" / "sdk" / "src"):
        bad = {m for m in imports(path) if m == "atmosphere.testing" or m.startswith("atmosphere.testing.")}
        assert not bad, f"{path.relative_to(ROOT)} imports the test kit: {bad}"
