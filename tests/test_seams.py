"""The seams stay where issue 10 put them: short functions (and, since issue 24, classes), error
codes only in `errors.py`, one definition per concept. Each failure lists every offender.

And where issue 24 put them: a library reaches a service at one seam only. The agent test kit
(`libs/testing`) starts each service through its `app.serve` and configures it with its settings
class (`atmosphere.<service>.settings`: public configuration, what the environment sets); it
imports nothing else of a service (no handlers, stores, runtimes), and no other library imports a
service at all (`libs/sdk` included: the kit is a distribution of its own, so the SDK, the services
and the kit form no package loop). A run is made only by `atmosphere.bus.runs.new_run`: no other
module builds a `RunSubmission(...)`."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MAX_FUNCTION_LINES = 60
MAX_CLASS_LINES = 300

# Our wire codes: `<area>.<reason>`, e.g. `ingress.bad_request`, `provider.timeout`.
SERVICE_CODE = re.compile(
    r"^(ingress|admin|dispatch|governance|budget|run|runtime|provider|memory|tape|sandbox|agent|interceptor|bus|tool)"
    r"\.[a-z_]+$"
)
# OpenAI's `error.code` values that our OpenAI-shaped answers (ingress, the model servers) send.
OPENAI_CODES = frozenset(
    {
        "context_length_exceeded",
        "insufficient_quota",
        "invalid_api_key",
        "model_not_found",
        "payload_too_large",
        "rate_limit_exceeded",
    }
)
# Strings that look like codes and are not, each with the reason.
NOT_CODES = {
    "governance.db": "the governance service's SQLite file name",
    "memory.db": "the memory service's SQLite file name",
    "tape.db": "the tape service's SQLite file name",
    "memory.limit_in_bytes": "a cgroup v1 memory controller file (code_exec's and the tool workers' limits)",
    "memory.max": "a cgroup v2 memory controller file",
    "memory.oom_control": "a cgroup v1 memory controller file (whether code was OOM-killed)",
    "memory.events": "a cgroup v2 memory controller file (whether code was OOM-killed)",
}


def _assignment(name: str) -> re.Pattern[str]:
    """`NAME = ...` or `NAME: type = ...` at the start of a line (not `NAME == ...`)."""
    return re.compile(rf"^\s*{name}\s*(:[^=\n]*)?=(?!=)", re.MULTILINE)


# Concepts defined once: the line that defines each must be in exactly one src file. Matched
# as whole names, so `new_run_request` is not `new_run`, and with or without an annotation.
DEFINED_ONCE = {
    "TERMINAL_KINDS =": _assignment("TERMINAL_KINDS"),
    "HISTORY_METADATA_KEY =": _assignment("HISTORY_METADATA_KEY"),
    "CONTEXT_METADATA_KEY =": _assignment("CONTEXT_METADATA_KEY"),
    "NESTING_METADATA_KEY =": _assignment("NESTING_METADATA_KEY"),
    # Atmosphere's `task` depth is a second level, not a second parser: it lives beside the nesting.
    "SUBAGENT_DEPTH_METADATA_KEY =": _assignment("SUBAGENT_DEPTH_METADATA_KEY"),
    "def nesting_of": re.compile(r"\bdef nesting_of\b"),
    "def parse_strategy": re.compile(r"\bdef parse_strategy\b"),
    "def new_run": re.compile(r"\bdef new_run\b"),
    "RUN_ID_METADATA_KEY =": _assignment("RUN_ID_METADATA_KEY"),
}
# Literal wire names that may be spelled in exactly one src module (their constant's home).
SPELLED_ONCE = ("ai.subagent.depth", "atmosphere.run.nesting", "ai.request.history", "ai.request.context")


SERVICES = sorted(p.name for p in (ROOT / "services").iterdir() if (p / "src").is_dir())
TEST_KIT = ROOT / "libs" / "testing" / "src"
RUN_MAKER = ROOT / "libs" / "bus" / "src" / "atmosphere" / "bus" / "runs.py"
# Empty `RunSubmission()`s that are not runs made, each with the reason.
NOT_RUNS_MADE = {
    "services/ingress/src/atmosphere/ingress/openai_api.py": "a copy's target (`CopyFrom` a run new_run made)",
}


def _is_generated(path: Path) -> bool:
    return path.name.endswith(("_pb2.py", "_pb2_grpc.py"))


def src_modules() -> list[Path]:
    """Every hand-written module of every library and service."""
    paths = [
        p for pattern in ("libs/*/src", "services/*/src") for root in ROOT.glob(pattern) for p in root.rglob("*.py")
    ]
    return sorted(p for p in paths if not _is_generated(p))


def _relative(path: Path) -> str:
    return str(path.relative_to(ROOT))


def _functions(tree: ast.AST) -> Iterator[ast.FunctionDef | ast.AsyncFunctionDef]:
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            yield node


def _docstrings(tree: ast.AST) -> set[int]:
    """The ids of the constants that are docstrings (prose, where a code may be named)."""
    found: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                found.add(id(first.value))
    return found


def _looks_like_code(text: str) -> bool:
    return (bool(SERVICE_CODE.match(text)) or text in OPENAI_CODES) and text not in NOT_CODES


def _code_literals(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    prose = _docstrings(tree)
    hits = [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and id(node) not in prose
        and _looks_like_code(node.value)
    ]
    hits.sort(key=lambda node: (node.lineno, node.col_offset))
    return [f"{_relative(path)}:{node.lineno}: {node.value!r}" for node in hits]


def test_no_function_is_longer_than_sixty_lines() -> None:
    long = [
        f"{_relative(path)}:{fn.lineno} {fn.name} ({lines} lines)"
        for path in src_modules()
        for fn in _functions(ast.parse(path.read_text(), filename=str(path)))
        if (lines := (fn.end_lineno or fn.lineno) - fn.lineno + 1) > MAX_FUNCTION_LINES
    ]
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines:\n" + "\n".join(long)


def test_no_class_is_longer_than_three_hundred_lines() -> None:
    # A class past this holds several concerns: the ones found split by concern (issue 24).
    long = [
        f"{_relative(path)}:{node.lineno} {node.name} ({lines} lines)"
        for path in src_modules()
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path)))
        if isinstance(node, ast.ClassDef)
        and (lines := (node.end_lineno or node.lineno) - node.lineno + 1) > MAX_CLASS_LINES
    ]
    assert not long, f"classes over {MAX_CLASS_LINES} lines:\n" + "\n".join(long)


def test_error_codes_are_spelled_only_in_errors_modules() -> None:
    found = [hit for path in src_modules() if path.name != "errors.py" for hit in _code_literals(path)]
    assert not found, "error-code literals outside an errors.py:\n" + "\n".join(found)


def test_each_concept_is_defined_in_one_src_file() -> None:
    texts = {path: path.read_text() for path in src_modules()}
    wrong = []
    for definition, pattern in DEFINED_ONCE.items():
        where = [_relative(path) for path, text in texts.items() if pattern.search(text)]
        if len(where) != 1:
            wrong.append(f"{definition!r} in {len(where)} files: {', '.join(where) or 'none'}")
    searched = {**texts, **{path: path.read_text() for path in sorted((ROOT / "examples").rglob("*.py"))}}
    for name in SPELLED_ONCE:
        where = [_relative(path) for path, text in searched.items() if f'"{name}"' in text]
        if len(where) != 1:
            wrong.append(f"{name!r} spelled in {len(where)} files: {', '.join(where) or 'none'}")
    assert not wrong, "concepts not defined exactly once:\n" + "\n".join(wrong)


def test_the_scan_recognises_codes_and_skips_what_is_not_one() -> None:
    # Guards the guard: a broken pattern would make the code check pass vacuously.
    assert _looks_like_code("ingress.bad_request")
    assert _looks_like_code("provider.rate_limited")
    assert _looks_like_code("payload_too_large")
    assert not _looks_like_code("memory.db")
    assert not _looks_like_code("atmosphere.bus")
    assert not _looks_like_code("ingress.Bad")
    assert DEFINED_ONCE["def new_run"].search("def new_run(\n")
    assert not DEFINED_ONCE["def new_run"].search("def new_run_request(")
    assert DEFINED_ONCE["TERMINAL_KINDS ="].search("TERMINAL_KINDS: frozenset[str] = frozenset()")
    assert not DEFINED_ONCE["TERMINAL_KINDS ="].search("TERMINAL_KINDS == kinds")
    assert src_modules(), "no src modules found"


def test_every_catalogued_error_reads_back_as_its_class() -> None:
    # Each code's class must take what `from_proto` gives it, or a caller would crash on the error.
    import atmosphere.governance.errors
    import atmosphere.ingress.errors
    import atmosphere.memory.errors
    import atmosphere.tape.errors  # noqa: F401
    from atmosphere.bus.errors import ServiceError, catalogue
    from atmosphere.contracts.common.v1.common_pb2 import Error

    assert len(catalogue()) >= 50
    for code, cls in catalogue().items():
        error = ServiceError.from_proto(Error(code=code, message="m", retryable=True, details={"k": "v"}))
        assert type(error) is cls, code
        assert (error.wire_code, error.message, error.details, error.retryable) == (code, "m", {"k": "v"}, True)
        assert error.to_proto() == Error(code=code, message="m", retryable=True, details={"k": "v"})


def _service_of(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[0] == "atmosphere" and parts[1] in SERVICES else None


def _seam_allows(path: Path, module: str, names: list[str]) -> bool:
    """Whether a library module may import `names` from service module `module` (see the docstring)."""
    service = _service_of(module)
    if TEST_KIT not in path.parents or service is None or not names:
        return False
    if module == f"atmosphere.{service}.app":
        return set(names) == {"serve"}
    return module == f"atmosphere.{service}.settings" and all(name.endswith("Settings") for name in names)


def _service_imports(path: Path) -> Iterator[str]:
    """Each import of a service by `path` that its seam does not allow, as `<path>:<line>: <import>`."""
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        found: list[tuple[str, list[str]]]
        if isinstance(node, ast.Import):
            found = [(alias.name, []) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found = [(node.module, [alias.name for alias in node.names])]
        else:
            continue
        for module, names in found:
            if _service_of(module) is not None and not _seam_allows(path, module, names):
                yield f"{_relative(path)}:{node.lineno}: {module} {names or ''}".rstrip()


def test_libraries_reach_a_service_only_through_its_serve_and_settings() -> None:
    modules = [p for p in src_modules() if (ROOT / "libs") in p.parents]
    found = [hit for path in modules for hit in _service_imports(path)]
    assert not found, "libraries importing a service past its seam:\n" + "\n".join(found)


def _runs_made(path: Path) -> Iterator[str]:
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
        empty = not node.args and not node.keywords
        if name == "RunSubmission" and not (empty and _relative(path) in NOT_RUNS_MADE):
            yield f"{_relative(path)}:{node.lineno}"


def test_only_new_run_makes_a_run_submission() -> None:
    modules = [*src_modules(), *sorted((ROOT / "examples").rglob("*.py"))]
    found = [hit for path in modules if path != RUN_MAKER for hit in _runs_made(path)]
    assert not found, "RunSubmission(...) made outside atmosphere.bus.runs.new_run:\n" + "\n".join(found)


def test_the_seam_checks_recognise_what_they_look_for() -> None:
    # Guards the guards: a broken pattern would make the checks above pass vacuously.
    kit = TEST_KIT / "atmosphere" / "testing" / "x.py"
    assert _seam_allows(kit, "atmosphere.dispatch.app", ["serve"])
    assert _seam_allows(kit, "atmosphere.sandbox.settings", ["SandboxSettings"])
    assert not _seam_allows(kit, "atmosphere.dispatch.app", ["serve", "Dispatch"])
    assert not _seam_allows(kit, "atmosphere.dispatch.handlers", ["RunExecutor"])
    assert not _seam_allows(kit, "atmosphere.dispatch.settings", ["DispatchOptions"])
    assert not _seam_allows(ROOT / "libs" / "sdk" / "src" / "x.py", "atmosphere.dispatch.app", ["serve"])
    assert _service_of("atmosphere.bus.runs") is None
    assert list(_runs_made(RUN_MAKER)), "new_run's own RunSubmission(...) is not seen"
