"""The docker/podman backend: one container per session, with the original's exact flags.

Start (argv, never a shell string): `run -d --rm --name <name> --network none --memory 512m
--cpus 1 --pids-limit 256 --read-only --cap-drop ALL --security-opt no-new-privileges --tmpfs
/workspace:rw,exec,size=512m --tmpfs /tmp:rw,exec,size=256m --env HOME=/workspace --workdir
/workspace --entrypoint sleep <image> <ttlSeconds>`; the setup command with `exec <name> bash -lc`;
code with `exec -i <name> bash|python3|node`, written to stdin; teardown `rm -f <name>`.

Artifacts are read as a tar stream from inside the container (`tar -C /workspace/artifacts -cf -
.`) and parsed in memory: the host touches no path the code controls. Killing the `exec` client
does not stop what it started inside the container, so an execution that times out or floods its
output takes the container down with it: the next one starts a fresh container (files gone, the
result says so).
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import logging
import os
import re
import shutil
import signal
import tarfile
import uuid
from typing import Final

from atmosphere.sandbox.code.artifacts import display_name, mime_type
from atmosphere.sandbox.code.capture import Captured, capture, shown
from atmosphere.sandbox.code.results import Artifact, ExecResult, Language, Limit, SessionUnavailableError
from atmosphere.sandbox.code.settings import MIB, CodeSettings

log = logging.getLogger("atmosphere.sandbox.code")

PROBE_SECONDS: Final = 5.0
COMMAND_SECONDS: Final = 60.0
"""How long `run`, `rm` and the artifact commands may take."""
TMP_SIZE: Final = "256m"
_INTERPRETERS: Final[dict[Language, str]] = {"bash": "bash", "python": "python3", "javascript": "node"}
_NAME = re.compile(r"[^a-zA-Z0-9_.-]+")
_RESET_ARTIFACTS: Final = "rm -rf /workspace/artifacts && mkdir -p /workspace/artifacts"
RESET_NOTE: Final = "\n[the sandbox was stopped and started again: files in /workspace are gone]\n"


def size_flag(size: int) -> str:
    """A byte count as docker writes sizes: `512m` when whole MiB, else bytes."""
    return f"{size // MIB}m" if size % MIB == 0 else str(size)


def run_argv(engine: str, name: str, settings: CodeSettings) -> list[str]:
    """The command starting a session's container (it sleeps `sandbox_ttl_seconds`, then goes)."""
    return [
        engine, "run", "-d", "--rm", "--name", name,
        "--network", settings.network,
        "--memory", settings.memory,
        "--cpus", f"{settings.cpus:g}",
        "--pids-limit", str(settings.pids_limit),
        "--read-only",
        "--cap-drop", "ALL",
        "--security-opt", "no-new-privileges",
        "--tmpfs", f"/workspace:rw,exec,size={size_flag(settings.workspace_bytes)}",
        "--tmpfs", f"/tmp:rw,exec,size={TMP_SIZE}",  # noqa: S108 - the container's own tmpfs
        "--env", "HOME=/workspace",
        "--workdir", "/workspace",
        "--entrypoint", "sleep",
        settings.image, str(max(int(settings.sandbox_ttl_seconds), 1)),
    ]  # fmt: skip


def exec_argv(engine: str, name: str, language: Language) -> list[str]:
    """The command running code (from stdin) in the container."""
    return [engine, "exec", "-i", name, _INTERPRETERS[language]]


def setup_argv(engine: str, name: str, command: str) -> list[str]:
    """The command running the operator's bootstrap in the container."""
    return [engine, "exec", name, "bash", "-lc", command]


def remove_argv(engine: str, name: str) -> list[str]:
    """The command removing the container."""
    return [engine, "rm", "-f", name]


async def _command(argv: list[str], *, timeout: float = COMMAND_SECONDS, cap: int = MIB) -> Captured:
    process = await asyncio.create_subprocess_exec(
        *argv,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        start_new_session=True,
    )
    return await capture(process, cap=cap, timeout=timeout, stop=lambda: _kill(process))


def _kill(process: asyncio.subprocess.Process) -> None:
    """SIGKILL the engine's client and whatever it started on this host (its own process group)."""
    # Not `process.kill()`: its `poll()` may reap the child under asyncio's watcher.
    if process.returncode is None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGKILL)


def _last_line(data: bytes) -> str:
    lines = data.decode("utf-8", errors="replace").strip().splitlines()
    return lines[-1].strip() if lines else ""


async def probe_engine(engine: str) -> tuple[bool, str]:
    """Whether `engine`'s server answers `info` within `PROBE_SECONDS`: (True, version) or (False, why)."""
    found = shutil.which(engine)
    if found is None:
        return False, "not installed"
    try:
        result = await _command([found, "info", "--format", "{{.ServerVersion}}"], timeout=PROBE_SECONDS)
    except OSError as exc:
        return False, exc.strerror or str(exc)
    if result.timed_out:
        return False, f"no answer within {PROBE_SECONDS:g}s"
    version = _last_line(result.stdout)
    if result.exit_code != 0 or not version:
        return False, _last_line(result.stderr) or f"info exited with {result.exit_code}"
    return True, f"server {version}"


def untar_artifacts(data: bytes, *, max_count: int, max_bytes: int) -> tuple[list[Artifact], int]:
    """The regular files at the top of a tar stream (in name order), within the bounds; and how many dropped."""
    members: dict[str, bytes | None] = {}
    with contextlib.suppress(tarfile.TarError, EOFError), tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tar:
        for member in tar:
            name = member.name.removeprefix("./")
            if not name or name == ".":
                continue
            if "/" in name or not member.isreg():
                members.setdefault(name.split("/", 1)[0], None)
                continue
            extracted = tar.extractfile(member)
            members[name] = extracted.read() if extracted is not None else None
    found: list[Artifact] = []
    dropped = 0
    remaining = max_bytes
    for name in sorted(members):
        content = members[name]
        if content is None or len(found) >= max_count or len(content) > remaining:
            dropped += 1
            continue
        remaining -= len(content)
        shown_name = display_name(name)
        found.append(Artifact(name=shown_name, mime_type=mime_type(shown_name), data=content))
    return found, dropped


class ContainerSandbox:
    """One session's container, started on the first execution and again after a forced stop."""

    def __init__(self, engine: str, settings: CodeSettings, session_id: str) -> None:
        """A sandbox of `engine` for `session_id` (nothing started yet)."""
        self._engine = engine
        self._settings = settings
        label = _NAME.sub("-", session_id)[:40].strip("-") or "session"
        self._label = label
        self._name = ""
        self._lock = asyncio.Lock()
        self._closed = False

    @property
    def name(self) -> str:
        """The running container's name (empty when none runs)."""
        return self._name

    async def start(self) -> None:
        """Start the container and run the setup command.

        Raises:
            SessionUnavailableError: the engine refused, or the setup command failed.
        """
        name = f"atmo-code-{self._label}-{uuid.uuid4().hex[:8]}"
        try:
            started = await _command(run_argv(self._engine, name, self._settings))
        except OSError as exc:
            raise SessionUnavailableError(f"{self._engine}: {exc.strerror or exc}") from exc
        if started.exit_code != 0 or started.timed_out:
            await self._remove(name)
            why = _last_line(started.stderr) or f"run exited with {started.exit_code}"
            raise SessionUnavailableError(f"{self._engine} could not start a container: {why}")
        self._name = name
        if self._settings.setup.strip():
            setup = await _command(
                setup_argv(self._engine, name, self._settings.setup), timeout=self._settings.exec_timeout_seconds
            )
            if setup.exit_code != 0 or setup.timed_out:
                await self._stop()
                how = "timed out" if setup.timed_out else f"exited with {setup.exit_code}"
                tail = _last_line(setup.stderr) or _last_line(setup.stdout)
                raise SessionUnavailableError(f"the setup command {how}" + (f": {tail}" if tail else ""))

    async def run(self, language: Language, code: str) -> ExecResult:
        """Run `code` in the container (starting one if none runs)."""
        async with self._lock:
            if self._closed:
                msg = "the sandbox was closed"
                raise SessionUnavailableError(msg)
            if not self._name:
                await self.start()
            return await self._run(language, code)

    async def _run(self, language: Language, code: str) -> ExecResult:
        settings = self._settings
        process = await asyncio.create_subprocess_exec(
            *exec_argv(self._engine, self._name, language),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            start_new_session=True,
        )
        try:
            captured = await capture(
                process,
                cap=settings.max_output_bytes,
                timeout=settings.exec_timeout_seconds,
                stop=lambda: _kill(process),
                stdin=code.encode("utf-8", errors="surrogatepass"),
            )
        except BaseException:
            _kill(process)
            await asyncio.shield(self._stop())  # what it started inside goes only with the container
            raise
        stderr = shown(captured.stderr, stream="stderr", cap=settings.max_output_bytes, cut=captured.stderr_cut)
        limit: Limit | None = "timeout" if captured.timed_out else "output" if captured.cut else None
        artifacts: list[Artifact] = []
        dropped = 0
        if limit in {"timeout", "output"}:
            await self._stop()
            stderr += RESET_NOTE
        else:
            artifacts, dropped = await self._artifacts()
        return ExecResult(
            exit_code=captured.exit_code,
            stdout=shown(captured.stdout, stream="stdout", cap=settings.max_output_bytes, cut=captured.stdout_cut),
            stderr=stderr,
            truncated=captured.cut,
            timed_out=captured.timed_out,
            limit=limit,
            artifacts=artifacts,
            artifacts_dropped=dropped,
        )

    async def _artifacts(self) -> tuple[list[Artifact], int]:
        settings = self._settings
        tar_argv = [self._engine, "exec", self._name, "tar", "-C", "/workspace/artifacts", "-cf", "-", "."]
        listed = await _command(tar_argv, cap=settings.max_artifact_bytes + MIB)
        await _command([self._engine, "exec", self._name, "sh", "-c", _RESET_ARTIFACTS])
        if listed.exit_code != 0 or listed.cut:
            return [], 1 if listed.cut else 0
        return untar_artifacts(listed.stdout, max_count=settings.max_artifacts, max_bytes=settings.max_artifact_bytes)

    async def _stop(self) -> None:
        name, self._name = self._name, ""
        if name:
            await self._remove(name)

    async def _remove(self, name: str) -> None:
        with contextlib.suppress(OSError):
            removed = await _command(remove_argv(self._engine, name))
            if removed.exit_code != 0:
                log.warning("code_exec: %s rm -f %s failed: %s", self._engine, name, _last_line(removed.stderr))

    async def close(self) -> None:
        """Remove the container; idempotent."""
        if self._closed:
            return
        self._closed = True
        async with self._lock:
            await self._stop()


class ContainerBackend:
    """Makes container sandboxes with `engine` (`docker` or `podman`)."""

    def __init__(self, engine: str, settings: CodeSettings) -> None:
        """Sandboxes of `engine` (a name on PATH, or a path), bounded by `settings`."""
        self._engine = shutil.which(engine) or engine
        self._kind = os.path.basename(engine)
        self._settings = settings

    @property
    def name(self) -> str:
        """`docker` or `podman`."""
        return self._kind

    def languages(self) -> tuple[Language, ...]:
        """All three: the image is the operator's to choose (the default one has them)."""
        return ("bash", "python", "javascript")

    async def open(self, session_id: str) -> ContainerSandbox:
        """A sandbox with its container started and set up."""
        sandbox = ContainerSandbox(self._engine, self._settings, session_id)
        await sandbox.start()
        return sandbox
