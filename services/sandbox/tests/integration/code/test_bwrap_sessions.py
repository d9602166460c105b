"""Sessions on real bubblewrap: files kept across calls, release and the TTL remove them, artifacts
are bounded and shown, code arrives literally, the setup runs once, the workspace has a budget."""

from __future__ import annotations

import asyncio
import base64
import json
import os
from pathlib import Path

import pytest

from atmosphere.contracts.tool.v1.tool_pb2 import ToolCall
from atmosphere.sandbox.code import CodeSessions, make_backend, probe, run_code_exec
from atmosphere.sandbox.code.bwrap import BwrapBackend
from services.sandbox.tests.unit.code.fakes import PNG

from .conftest import bwrap_backend, sandbox_processes, small_settings


def workspaces(root: Path, run_id: str) -> list[Path]:
    return list(root.glob(f"{run_id}-*/workspace"))


async def test_files_persist_between_calls_and_release_removes_them(sessions: CodeSessions, code_root: Path) -> None:
    first = await sessions.exec("keep", "python", "open('notes.txt', 'w').write('from call 1')")
    second = await sessions.exec("keep", "bash", "cat notes.txt")
    third = await sessions.exec("keep", "javascript", "console.log(require('fs').readFileSync('notes.txt', 'utf8'))")
    assert (first.exit_code, second.stdout, third.stdout) == (0, "from call 1", "from call 1\n")
    assert workspaces(code_root, "keep")
    await sessions.release("keep")
    assert workspaces(code_root, "keep") == []
    other = await sessions.exec("other", "bash", "cat notes.txt 2>&1; echo $?")
    assert other.stdout.endswith("1\n")


async def test_an_idle_sandbox_is_torn_down_after_its_ttl(bwrap_ready: str, code_root: Path) -> None:
    backend = bwrap_backend(code_root, sandbox_ttl_seconds=0.2)
    sessions = CodeSessions(backend, backend.settings)
    await sessions.exec("idle", "bash", "echo hi > f")
    assert workspaces(code_root, "idle")
    for _ in range(100):
        if not workspaces(code_root, "idle"):
            break
        await asyncio.sleep(0.02)
    assert (workspaces(code_root, "idle"), len(sessions)) == ([], 0)
    await sessions.close()


async def test_code_arrives_literally_whatever_it_holds(sessions: CodeSessions) -> None:
    tricky = "a 'single' \"double\" $HOME `uname` $(id) ; | & > < \\ \n* ~ {a,b} \u00e9\u4e2d"
    python = await sessions.exec("literal", "python", f"print({tricky!r})")
    bash = await sessions.exec("literal", "bash", f"cat <<'END'\n{tricky}\nEND\nread line; echo \"stdin:$line:$?\"")
    javascript = await sessions.exec("literal", "javascript", f"console.log({json.dumps(tricky)})")
    assert python.stdout == bash.stdout.removesuffix("stdin::1\n") == javascript.stdout == tricky + "\n"
    assert bash.stdout.endswith("stdin::1\n")  # the script is not on its own stdin


async def test_artifacts_are_bounded_and_images_become_data_uris(sessions: CodeSessions) -> None:
    png = base64.b64encode(PNG).decode()
    code = f"""
import base64, os
os.makedirs("artifacts", exist_ok=True)
open("artifacts/0-plot.png", "wb").write(base64.b64decode("{png}"))
open("artifacts/1-table.csv", "w").write("a,b\\n")
for i in range(2, 10):
    open(f"artifacts/{{i}}-extra.txt", "w").write(str(i))
os.mkdir("artifacts/sub")
print("made")
"""
    call = ToolCall(
        call_id="c1",
        name="code_exec",
        run_id="artifacts",
        arguments_json=json.dumps({"language": "python", "code": code}),
    )
    reply = await run_code_exec(sessions, call)
    content = json.loads(reply.content)
    assert (content["stdout"], content["artifactCount"], content["artifactsDropped"]) == ("made\n", 8, 3)
    step, image, table, *others = reply.events
    assert json.loads(step.agent_step.data_json)["artifacts"][:2] == ["0-plot.png", "1-table.csv"]
    assert image.text_delta.text == f"![0-plot.png](data:image/png;base64,{png})"
    assert (table.content.file_name, table.content.mime_type, table.content.data) == (
        "1-table.csv",
        "text/csv",
        b"a,b\n",
    )
    assert len(others) == 6
    after = await sessions.exec("artifacts", "bash", "ls -A artifacts | wc -l")
    assert after.stdout == "0\n"  # collected, then removed


async def test_artifacts_over_the_byte_budget_are_dropped_whole(bwrap_ready: str, code_root: Path) -> None:
    backend = bwrap_backend(code_root, max_artifact_bytes=1000)
    sessions = CodeSessions(backend, backend.settings)
    result = await sessions.exec(
        "budget", "bash", "head -c 600 /dev/zero > artifacts/a.bin; head -c 600 /dev/zero > artifacts/b.bin"
    )
    assert ([a.name for a in result.artifacts], result.artifacts_dropped) == (["a.bin"], 1)
    await sessions.close()


async def test_the_setup_command_runs_once_per_session(bwrap_ready: str, code_root: Path) -> None:
    backend = bwrap_backend(code_root, setup="echo set-up >> setup.log; echo $HOME > home.txt")
    sessions = CodeSessions(backend, backend.settings)
    await sessions.exec("setup", "bash", "true")
    result = await sessions.exec("setup", "bash", "cat setup.log home.txt")
    assert result.stdout == "set-up\n/workspace\n"
    await sessions.close()


async def test_a_failing_setup_makes_the_session_unavailable(bwrap_ready: str, code_root: Path) -> None:
    backend = bwrap_backend(code_root, setup="echo no such package >&2; exit 3")
    sessions = CodeSessions(backend, backend.settings)
    call = ToolCall(
        call_id="c1", name="code_exec", run_id="broken", arguments_json='{"language": "bash", "code": "true"}'
    )
    reply = await run_code_exec(sessions, call)
    assert reply.is_error
    assert reply.content == (
        "Error: Code execution is not available for this session. the setup command exited with 3: no such package"
    )
    assert workspaces(code_root, "broken") == []
    await sessions.close()


async def test_a_workspace_over_its_budget_stops_the_code_and_is_emptied(bwrap_ready: str, code_root: Path) -> None:
    backend = bwrap_backend(code_root, workspace_bytes=4 * 1024 * 1024, file_size_bytes=2 * 1024 * 1024)
    sessions = CodeSessions(backend, backend.settings)
    await sessions.exec("full", "bash", "echo keep > keep.txt")
    result = await sessions.exec(
        "full", "bash", "for i in $(seq 1 50); do head -c 1500000 /dev/zero > f$i; sleep 0.05; done"
    )
    assert result.limit == "workspace"
    assert result.stderr.endswith("/workspace emptied]\n")
    assert (await sessions.exec("full", "bash", "ls")).stdout == "artifacts\n"
    big = await sessions.exec("full", "bash", "head -c 3000000 /dev/zero > big; echo $?")
    assert big.stdout != "0\n"  # one file is bounded by RLIMIT_FSIZE
    await sessions.close()


async def test_probe_and_backend_say_what_bounds_code(bwrap_ready: str, code_root: Path) -> None:
    availability = await probe(small_settings())
    assert availability.label == "ACTIVE(bwrap)"
    assert availability.reason.startswith(("cgroup v1 (pids, memory", "cgroup v2", "rlimits only ("))
    backend = make_backend(small_settings(), availability, code_root)
    assert isinstance(backend, BwrapBackend)
    assert backend.note.startswith(("cgroup v1 (pids, memory", "cgroup v2", "rlimits only ("))
    assert backend.languages() == ("bash", "python", "javascript")
    missing = await probe(small_settings(), bwrap="/nonexistent/bwrap")
    assert missing.label == "INACTIVE(bubblewrap not installed)"
    with pytest.raises(ValueError, match="INACTIVE"):
        make_backend(small_settings(), missing, code_root)


def test_a_root_the_sandbox_user_cannot_reach_is_refused(bwrap_ready: str, tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("only as root does the sandbox run as another user")
    with pytest.raises(ValueError, match="cannot live under"):
        BwrapBackend(small_settings(), tmp_path / "closed")  # pytest's tmp dirs are 0700


async def test_without_cgroups_rlimits_bound_the_code_and_say_so(bwrap_ready: str, code_root: Path) -> None:
    backend = BwrapBackend(small_settings(exec_timeout_seconds=1), code_root, cgroups="no write access (test)")
    assert backend.note == "rlimits only (no write access (test))"
    sessions = CodeSessions(backend, backend.settings)
    hog = await sessions.exec("rlimits", "python", "hog = bytearray(256 * 1024 * 1024)")
    assert (hog.exit_code, hog.stderr.strip().splitlines()[-1]) == (1, "MemoryError")
    assert (await sessions.exec("rlimits", "javascript", "console.log(6 * 7)")).stdout == "42\n"
    stuck = await sessions.exec("rlimits", "bash", "sleep 1000 & setsid sleep 1000 & sleep 1000")
    assert (stuck.timed_out, stuck.limit) == (True, "timeout")
    await sessions.close()


async def test_release_during_an_execution_kills_it_and_removes_the_workspace(
    sessions: CodeSessions, code_root: Path
) -> None:
    running = asyncio.create_task(sessions.exec("busy", "bash", "sleep 1000 & setsid sleep 1000 & sleep 1000"))
    for _ in range(100):  # until the execution is under way
        if sandbox_processes():
            break
        await asyncio.sleep(0.02)
    await sessions.release("busy")
    result = await running
    assert (result.exit_code, result.timed_out) == (137, False)
    assert workspaces(code_root, "busy") == []
