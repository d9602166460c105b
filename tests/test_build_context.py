"""`make clean` removes what its help says, and the image build context leaves local state out."""

from __future__ import annotations

import fnmatch
import re
import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def clean_paths() -> list[str]:
    found = re.search(r"^CLEAN_PATHS := (.+)$", (ROOT / "Makefile").read_text(), re.MULTILINE)
    assert found, "the Makefile has no CLEAN_PATHS"
    return found[1].split()


def test_make_clean_removes_every_path_it_names_and_keeps_the_install(tmp_path: Path) -> None:
    # On a copy: the real tree's state belongs to whoever runs `make run` right now.
    shutil.copy(ROOT / "Makefile", tmp_path / "Makefile")
    kept = [".venv/marker", ".atmosphere/tools/bin/uv", "libs/keep.py"]
    for name in [*(f"{p}/file" for p in clean_paths()), *kept]:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("x")
    subprocess.run(["make", "--no-print-directory", "-C", str(tmp_path), "clean"], check=True, capture_output=True)
    assert [p for p in clean_paths() if (tmp_path / p).exists()] == []
    assert all((tmp_path / k).exists() for k in kept)
    help_line = next(line for line in (ROOT / "Makefile").read_text().splitlines() if line.startswith("clean:"))
    for said in (".atmosphere/data", "workspace", "dist"):
        assert said in help_line
    assert {".atmosphere/data", ".atmosphere/nats", ".atmosphere/workspace", "dist"} <= set(clean_paths())


def ignored(path: str, patterns: list[str]) -> bool:
    parts = Path(path).parts
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    for pattern in patterns:
        bare = pattern.removeprefix("**/")
        if any(fnmatch.fnmatch(p, pattern) for p in prefixes) or any(fnmatch.fnmatch(part, bare) for part in parts):
            return True
    return False


def test_the_build_context_excludes_local_state_but_not_what_the_image_copies() -> None:
    lines = (ROOT / ".dockerignore").read_text().splitlines()
    patterns = [line.strip() for line in lines if line.strip() and not line.startswith("#")]
    local_state = [
        ".venv/bin/python",
        ".venvs/pinned/bin/python",
        ".atmosphere/data/x",
        ".git/HEAD",
        "libs/sdk/src/x/__pycache__/a.pyc",
        "dist/a",
    ]
    assert [path for path in local_state if not ignored(path, patterns)] == []
    dockerfile = (ROOT / "deploy/docker/service.Dockerfile").read_text()
    copied = [m[1] for m in re.finditer(r"^COPY (?!--from)(\S+)", dockerfile, re.MULTILINE)]
    assert copied, dockerfile
    needed = [*copied, "pyproject.toml", "uv.lock"]
    # Each member's build reads its README and LICENSE (the pyproject names them).
    for member in [*ROOT.glob("libs/*/pyproject.toml"), *ROOT.glob("services/*/pyproject.toml")]:
        base = member.parent.relative_to(ROOT)
        needed += [str(base / "pyproject.toml"), str(base / "README.md"), str(base / "LICENSE")]
        needed += [str(p.relative_to(ROOT)) for p in (member.parent / "src").rglob("*.py")][:3]
    assert [n for n in needed if ignored(n, patterns)] == []


def test_the_image_installs_third_party_dependencies_before_it_copies_the_code() -> None:
    # A code change must not reinstall every dependency: the first `uv sync` sees only the lock
    # and the members' pyproject.toml files (a stage keeps only those), the code comes after it.
    dockerfile = (ROOT / "deploy/docker/service.Dockerfile").read_text()
    build = dockerfile[dockerfile.index("AS build") :]
    # Each layer syncs one of two ways: a pinned adapter's pool from envs/pinned, else the workspace.
    syncs = [m.start() for m in re.finditer(r"uv sync", build)]
    code = [m.start() for m in re.finditer(r"^COPY (libs|services) ", build, re.MULTILINE)]
    assert len(syncs) == 4, build
    first = build[syncs[0] : syncs[2]]
    assert "--no-install-workspace" in first
    assert "--no-install-local" in first
    # A runtime pool's framework (RUNTIME) is a third-party dependency too: in the first layer.
    assert "--package atmosphere-ai-runtime-${RUNTIME}" in first
    assert code, build
    assert syncs[1] < min(code) < syncs[2]
    manifests = dockerfile[dockerfile.index("AS manifests") : dockerfile.index("AS build")]
    assert "! -name pyproject.toml -delete" in manifests
