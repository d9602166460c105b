"""The docker/podman backend: the original's exact command lines, and its flow against a fake engine.

No engine answers on this machine, so `docker` here is a small script put first on PATH: it
answers `info` as told, and plays `run`/`exec`/`rm` with a directory per "container" (running the
code unsandboxed: it is the engine that is faked, not the isolation under test).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from atmosphere.sandbox.code import CodeSettings, probe
from atmosphere.sandbox.code import container as container_module
from atmosphere.sandbox.code.container import (
    RESET_NOTE,
    ContainerBackend,
    exec_argv,
    probe_engine,
    remove_argv,
    run_argv,
    setup_argv,
)

FAKE_ENGINE = r"""#!/bin/bash
# A fake container engine: FAKE_MODE=up|down|hang for `info`; containers are dirs under FAKE_ROOT.
echo "$*" >> "$FAKE_LOG"
command=$1; shift
case "$command" in
  info)
    case "$FAKE_MODE" in
      up) echo "27.0.1" ;;
      hang) sleep 30 ;;
      *) echo "Cannot connect to the Docker daemon at unix:///var/run/docker.sock." \
              "Is the docker daemon running?" >&2
         exit 1 ;;
    esac ;;
  run)
    while [ "$1" != "--name" ]; do shift; done
    mkdir -p "$FAKE_ROOT/$2/workspace/artifacts"; echo "c0ffee" ;;
  exec)
    [ "$1" = "-i" ] && shift
    name=$1; shift
    workspace="$FAKE_ROOT/$name/workspace"
    [ -d "$workspace" ] || { echo "Error: No such container: $name" >&2; exit 1; }
    cd "$workspace"
    args=()
    for arg in "$@"; do args+=("${arg//\/workspace/$workspace}"); done
    exec "${args[@]}" ;;
  rm)
    rm -rf "$FAKE_ROOT/${@: -1}" ;;
esac
"""


@pytest.fixture
def engine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fake `docker` first on PATH; returns its log (one line per call)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "docker"
    fake.write_text(FAKE_ENGINE)
    fake.chmod(0o755)
    log = tmp_path / "engine.log"
    log.touch()
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_ROOT", str(tmp_path / "containers"))
    monkeypatch.setenv("FAKE_LOG", str(log))
    monkeypatch.setenv("FAKE_MODE", "up")
    return log


def test_the_container_starts_with_the_originals_flags() -> None:
    argv = run_argv("docker", "atmo-code-x", CodeSettings())
    assert argv == [
        "docker", "run", "-d", "--rm", "--name", "atmo-code-x", "--network", "none", "--memory", "512m",
        "--cpus", "1", "--pids-limit", "256", "--read-only", "--cap-drop", "ALL", "--security-opt",
        "no-new-privileges", "--tmpfs", "/workspace:rw,exec,size=512m", "--tmpfs", "/tmp:rw,exec,size=256m",
        "--env", "HOME=/workspace", "--workdir", "/workspace", "--entrypoint", "sleep",
        "mcr.microsoft.com/playwright:v1.60.0-noble", "300",
    ]  # fmt: skip
    assert exec_argv("podman", "n", "python") == ["podman", "exec", "-i", "n", "python3"]
    assert exec_argv("docker", "n", "javascript")[-1] == "node"
    assert setup_argv("docker", "n", "npm i x") == ["docker", "exec", "n", "bash", "-lc", "npm i x"]
    assert remove_argv("docker", "n") == ["docker", "rm", "-f", "n"]


async def test_an_engine_that_does_not_answer_is_inactive_with_its_reason(
    engine: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_MODE", "down")
    availability = await probe(CodeSettings(enabled=True, engine="docker"))
    assert availability.label == (
        "INACTIVE(docker: Cannot connect to the Docker daemon at unix:///var/run/docker.sock. "
        "Is the docker daemon running?)"
    )
    monkeypatch.setenv("FAKE_MODE", "hang")
    monkeypatch.setattr(container_module, "PROBE_SECONDS", 0.3)
    assert await probe_engine("docker") == (False, "no answer within 0.3s")
    monkeypatch.setenv("FAKE_MODE", "up")
    assert (await probe(CodeSettings(enabled=True, engine="docker"))).label == "ACTIVE(docker)"


async def test_auto_names_every_engine_it_tried(engine: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("FAKE_MODE", "down")
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}/nonexistent")  # no podman, no bwrap here
    availability = await probe(CodeSettings(enabled=True), bwrap=str(tmp_path / "no-bwrap"))
    assert not availability.active
    assert availability.reason.startswith("no sandbox engine: bwrap: bubblewrap not installed; docker: Cannot connect")
    assert availability.reason.endswith("; podman: not installed")
    assert (await probe(CodeSettings())).label == "INACTIVE(disabled)"


async def test_a_session_runs_code_keeps_files_and_returns_artifacts(engine: Path) -> None:
    settings = CodeSettings(exec_timeout_seconds=5, setup="echo ready > setup.txt")
    backend = ContainerBackend("docker", settings)
    sandbox = await backend.open("run/1")
    first = await sandbox.run("python", "open('kept.txt', 'w').write('kept')\nprint('hi')")
    second = await sandbox.run(
        "bash", "cat kept.txt setup.txt; printf 'a,b' > artifacts/t.csv; ln -s /etc/passwd artifacts/p.txt"
    )
    assert (first.exit_code, first.stdout) == (0, "hi\n")
    assert (second.stdout, [(a.name, a.data) for a in second.artifacts], second.artifacts_dropped) == (
        "keptready\n", [("t.csv", b"a,b")], 1,
    )  # fmt: skip
    name = sandbox.name
    await sandbox.close()
    calls = engine.read_text().splitlines()
    assert calls[0].startswith(f"run -d --rm --name {name} --network none")
    assert f"exec {name} bash -lc echo ready > setup.txt" in calls
    assert f"exec -i {name} python3" in calls
    assert calls[-1] == f"rm -f {name}"


async def test_a_timed_out_execution_takes_its_container_down(engine: Path) -> None:
    backend = ContainerBackend("docker", CodeSettings(exec_timeout_seconds=0.5))
    sandbox = await backend.open("run-2")
    first = sandbox.name
    result = await sandbox.run("bash", "echo before; sleep 5")
    assert (result.timed_out, result.limit, result.stdout) == (True, "timeout", "before\n")
    assert result.stderr.endswith(RESET_NOTE)
    assert f"rm -f {first}" in engine.read_text()
    again = await sandbox.run("bash", "echo after")
    assert again.stdout == "after\n"
    assert sandbox.name != first
    await sandbox.close()
