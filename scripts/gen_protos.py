"""Regenerate `libs/contracts` from `proto/` with grpc_tools.protoc and mypy-protobuf.

The generated tree is committed. `make proto-check` runs this script and fails when the result
differs from what is committed, so a `.proto` change without regeneration cannot land.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
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
    cmd = [sys.executable, "-m", "grpc_tools.protoc", f"-I{PROTO_DIR}", *args]
    subprocess.run(cmd, check=True)


def main() -> int:
    """Delete and regenerate the contracts package."""
    if PACKAGE_DIR.exists():
        shutil.rmtree(PACKAGE_DIR)
    PACKAGE_DIR.mkdir(parents=True)
    protos = _protos()
    relative = [str(p.relative_to(PROTO_DIR)) for p in protos]
    _protoc([f"--python_out={OUT_DIR}", f"--mypy_out={OUT_DIR}", *relative])
    services = [str(p.relative_to(PROTO_DIR)) for p in protos if _declares_service(p)]
    if services:
        _protoc([f"--grpc_python_out={OUT_DIR}", f"--mypy_grpc_out={OUT_DIR}", *services])
    # protoc writes no __init__.py; the namespace root `atmosphere/` must stay without one.
    for directory in sorted(d for d in PACKAGE_DIR.rglob("*") if d.is_dir()):
        (directory / "__init__.py").write_text(HEADER)
    (PACKAGE_DIR / "__init__.py").write_text(HEADER)
    (PACKAGE_DIR / "py.typed").write_text("")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
