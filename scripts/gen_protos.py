"""Regenerate `libs/contracts` from `proto/` with grpc_tools.protoc and mypy-protobuf.

The generated tree is committed. `make proto-check` runs this script and fails when the result
differs from what is committed, so a `.proto` change without regeneration cannot land.
"""

from __future__ import annotations

import argparse
import filecmp
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROTO_DIR = ROOT / "proto"
OUT_DIR = ROOT / "libs" / "contracts" / "src"
PACKAGE_DIR = OUT_DIR / "atmosphere" / "contracts"
HEADER = '"""Generated from proto/ by scripts/gen_protos.py. Do not edit."""\n'


def _protos() -> list[Path]:
    return sorted(PROTO_DIR.rglob("*.proto"))


def _declares_service(proto: Path) -> bool:
    return any(line.startswith("service ") for line in proto.read_text().splitlines())


def _protoc(args: list[str]) -> None:
    # The mypy-protobuf plugins live next to this interpreter; name them so PATH does not matter.
    bindir = Path(sys.executable).parent
    plugins = [f"--plugin=protoc-gen-{name}={bindir / f'protoc-gen-{name}'}" for name in ("mypy", "mypy_grpc")]
    cmd = [sys.executable, "-m", "grpc_tools.protoc", f"-I{PROTO_DIR}", *plugins, *args]
    result = subprocess.run(cmd, check=False, capture_output=True, text=True)
    if result.returncode != 0:
        sys.stderr.write(result.stdout + result.stderr)
        raise SystemExit(result.returncode)


def generate(out_dir: Path) -> None:
    """Generate the `atmosphere.contracts` tree under `out_dir` (a `src` directory)."""
    package_dir = out_dir / "atmosphere" / "contracts"
    if package_dir.exists():
        shutil.rmtree(package_dir)
    package_dir.mkdir(parents=True)
    protos = _protos()
    relative = [str(p.relative_to(PROTO_DIR)) for p in protos]
    _protoc([f"--python_out={out_dir}", f"--mypy_out={out_dir}", *relative])
    services = [str(p.relative_to(PROTO_DIR)) for p in protos if _declares_service(p)]
    if services:
        _protoc([f"--grpc_python_out={out_dir}", f"--mypy_grpc_out={out_dir}", *services])
    # protoc writes no __init__.py; the namespace root `atmosphere/` must stay without one.
    for directory in sorted(d for d in package_dir.rglob("*") if d.is_dir()):
        (directory / "__init__.py").write_text(HEADER)
    (package_dir / "__init__.py").write_text(HEADER)
    (package_dir / "py.typed").write_text("")
    # Ship the sources beside the code, at their import paths, so anyone can generate their own.
    for proto in protos:
        shutil.copyfile(proto, out_dir / proto.relative_to(PROTO_DIR))


def _differences(expected: Path, actual: Path) -> list[str]:
    """Relative paths that differ, are missing or are extra between two trees."""
    problems: list[str] = []
    comparison = filecmp.dircmp(expected, actual, ignore=["__pycache__"])
    stack = [(comparison, Path())]
    while stack:
        node, rel = stack.pop()
        problems += [f"missing: {rel / n}" for n in node.left_only]
        problems += [f"extra: {rel / n}" for n in node.right_only]
        _, mismatch, errors = filecmp.cmpfiles(node.left, node.right, node.common_files, shallow=False)
        problems += [f"stale: {rel / n}" for n in mismatch + errors]
        stack += [(sub, rel / name) for name, sub in node.subdirs.items()]
    return problems


def main() -> int:
    """Regenerate `libs/contracts`, or with `--check` report whether it is stale."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--check", action="store_true", help="fail if the committed code is stale")
    if not parser.parse_args().check:
        generate(OUT_DIR)
        return 0
    with tempfile.TemporaryDirectory() as scratch:
        generate(Path(scratch))
        problems = _differences(Path(scratch) / "atmosphere" / "contracts", PACKAGE_DIR)
    if problems:
        print("libs/contracts is stale; run `make proto` and commit:", *problems, sep="\n  ", file=sys.stderr)
        return 1
    print("libs/contracts matches proto/")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
