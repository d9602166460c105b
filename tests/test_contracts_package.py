"""The contracts wheel ships the `.proto` sources, and outsiders can generate working code from them."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from atmosphere.contracts.run.v1.run_pb2 import RunEvent, TextDelta

ROOT = Path(__file__).resolve().parents[1]
PROTO_DIR = ROOT / "proto"


def uv() -> str:
    # The same lookup as the Makefile: uv on PATH, else the one it bootstrapped.
    found = shutil.which("uv") or shutil.which("uv", path=str(ROOT / ".atmosphere" / "tools" / "bin"))
    assert found, "uv not found: run `make install`"
    return found


@pytest.fixture(scope="module")
def unpacked_wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    command = [uv(), "build", "--quiet", "--wheel", "--out-dir", str(out), str(ROOT / "libs" / "contracts")]
    subprocess.run(command, check=True, capture_output=True, timeout=50)
    (wheel,) = out.glob("*.whl")
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(out / "site")
    return out / "site"


def test_the_wheel_ships_every_proto_at_its_import_path(unpacked_wheel: Path) -> None:
    expected = {p.relative_to(PROTO_DIR) for p in PROTO_DIR.rglob("*.proto")}
    shipped = {p.relative_to(unpacked_wheel) for p in unpacked_wheel.rglob("*.proto")}
    assert shipped == expected
    for relative in expected:
        assert (unpacked_wheel / relative).read_bytes() == (PROTO_DIR / relative).read_bytes()


def test_code_generated_from_the_shipped_protos_decodes_a_run_event(unpacked_wheel: Path, tmp_path: Path) -> None:
    # What an outsider does: protoc with the installed package as the include path.
    protos = ["atmosphere/contracts/run/v1/run.proto", "atmosphere/contracts/common/v1/common.proto"]
    command = [sys.executable, "-m", "grpc_tools.protoc", f"-I{unpacked_wheel}", f"--python_out={tmp_path}", *protos]
    result = subprocess.run(command, check=False, capture_output=True, text=True, timeout=50)
    assert result.returncode == 0, result.stderr
    # protoc writes no __init__.py; with them the generated tree is a package of its own, which
    # the interpreter below imports instead of the project's `atmosphere.contracts`.
    for directory in [tmp_path / "atmosphere", *(d for d in (tmp_path / "atmosphere").rglob("*") if d.is_dir())]:
        (directory / "__init__.py").touch()
    wire = RunEvent(run_id="r1", seq=2, agent="echo", text_delta=TextDelta(text="hi")).SerializeToString()
    result = subprocess.run(
        [sys.executable, "-c", DECODE, str(tmp_path), wire.hex()],
        check=False,
        capture_output=True,
        text=True,
        timeout=50,
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == {"runId": "r1", "seq": "2", "agent": "echo", "textDelta": {"text": "hi"}}


DECODE = """
import json, sys
sys.path.insert(0, sys.argv[1])
from google.protobuf.json_format import MessageToDict
from atmosphere.contracts.run.v1 import run_pb2
assert run_pb2.__file__.startswith(sys.argv[1]), run_pb2.__file__
print(json.dumps(MessageToDict(run_pb2.RunEvent.FromString(bytes.fromhex(sys.argv[2])))))
"""
