"""`make proto-check`'s `buf breaking` rules (buf.yaml: WIRE_JSON) catch wire breaks and only those.

`buf breaking` compares the working tree's `proto/` with a copy; here the copy is the one
edited, which is the same comparison seen from the other side.
"""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]
RUN_PROTO = Path("atmosphere/contracts/run/v1/run.proto")
SERVICE_PROTO = Path("atmosphere/contracts/common/v1/service.proto")


@pytest.fixture(scope="module")
def check() -> ModuleType:
    spec = importlib.util.spec_from_file_location("check_proto_breaking", ROOT / "scripts" / "check_proto_breaking.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def edited_copy(tmp_path: Path, file: Path, old: str, new: str) -> Path:
    """A copy of `proto/` with `old` replaced by `new` in `file` (exactly once)."""
    copy = tmp_path / "proto"
    shutil.copytree(ROOT / "proto", copy)
    text = (copy / file).read_text()
    assert text.count(old) == 1, f"{old!r} is not in {file} exactly once"
    (copy / file).write_text(text.replace(old, new))
    return copy


def test_the_same_protos_are_compatible(check: ModuleType, tmp_path: Path) -> None:
    shutil.copytree(ROOT / "proto", tmp_path / "proto")
    assert check.buf_breaking(tmp_path / "proto") == 0


def test_a_changed_field_number_breaks(check: ModuleType, tmp_path: Path) -> None:
    copy = edited_copy(
        tmp_path, RUN_PROTO, "message TextDelta {\n  string text = 1;", "message TextDelta {\n  string text = 7;"
    )
    assert check.buf_breaking(copy) != 0


def test_a_changed_field_type_breaks(check: ModuleType, tmp_path: Path) -> None:
    copy = edited_copy(
        tmp_path, RUN_PROTO, "message TextDelta {\n  string text = 1;", "message TextDelta {\n  int64 text = 1;"
    )
    assert check.buf_breaking(copy) != 0


def test_renaming_a_request_message_is_allowed(check: ModuleType, tmp_path: Path) -> None:
    copy = edited_copy(tmp_path, SERVICE_PROTO, "message HealthCheckRequest {}", "message HealthProbe {}")
    assert check.buf_breaking(copy) == 0
