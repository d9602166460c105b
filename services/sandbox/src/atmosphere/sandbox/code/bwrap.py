"""The bubblewrap backend: each execution a fresh set of namespaces and control groups on this host.

What code sees: its own user, pid, network (only `lo`), IPC, UTS (`sandbox`) and mount namespaces;
a root of nothing but `/usr` (read-only, with the `/bin`, `/lib`... links the host has), a
few generated `/etc` files (passwd, group, hosts) and the host's loader cache and alternatives,
a fresh `/proc`, a minimal `/dev`, a bounded tmpfs at `/tmp`, and its session's workspace at
`/workspace`. No capability, no further user namespace (`--disable-userns`), a seccomp filter
(`seccomp`), a new session (no terminal to inject into), an environment of five variables (and bwrap's `PWD`).
Nothing names the workspace's host path: bwrap takes its options from a memfd (`--args`), so
its command line, which the code can read as `/proc/1/cmdline`, is `bwrap --args <fd> -- python3
-`; the workspace is a tmpfs of its own where the service may mount one (`tmpfs`), else
`/proc/self/mountinfo` shows the directory's path (the service logs that at start); and what
bwrap says on stderr has that path replaced by `/workspace`.

On the host: started as root, the sandbox runs as uid/gid 65534 (`nobody`), never as root; the
first process joins the execution's control groups before anything else runs (`launcher`), with
rlimits as a backstop (`RLIMIT_CPU`, `RLIMIT_FSIZE`, `RLIMIT_NOFILE`, `RLIMIT_CORE` 0, and
without a memory/pids group `RLIMIT_DATA`/`RLIMIT_NPROC`). Every way an execution ends (exit,
timeout, output over the cap, workspace over its budget, cancellation, the session closing)
kills every process in its groups and removes them; bwrap's `--die-with-parent` and the pid
namespace (its init gone, the kernel kills the rest) are the second line.

Code enters through a pipe, never a command line: `python3 -` and `node -` read it from stdin
(so imports resolve from `/workspace`, as with the original's `exec -i`); bash runs it from a
read-only file bwrap makes from a memfd, so the script's own commands see an empty stdin instead
of eating the rest of the script.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shutil
import signal
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from atmosphere.sandbox.code import tmpfs
from atmosphere.sandbox.code.artifacts import collect
from atmosphere.sandbox.code.capture import Captured, capture, shown
from atmosphere.sandbox.code.cgroups import CgroupHost, CgroupLimits, ExecCgroup, detect
from atmosphere.sandbox.code.launcher import LaunchSpec
from atmosphere.sandbox.code.results import Artifact, ExecResult, Language, Limit, SessionUnavailableError
from atmosphere.sandbox.code.seccomp import filter_for_machine
from atmosphere.sandbox.code.settings import MIB, CodeSettings
from atmosphere.sandbox.code.workspace import SessionDirectory, unreachable

log = logging.getLogger("atmosphere.sandbox.code")

SANDBOX_UID: Final = 65534
SANDBOX_GID: Final = 65534
HOSTNAME: Final = "sandbox"
PATH: Final = "/usr/local/bin:/usr/bin:/bin"
LAUNCHER: Final = str(Path(__file__).with_name("launcher.py"))
TMP_BYTES: Final = 256 * MIB
"""The size of `/tmp` (and `/dev/shm`), a tmpfs counted in the memory limit (the original's 256m)."""
SANDBOX_TMP: Final = "/tmp"  # noqa: S108 - the sandbox's own tmpfs, not the host's /tmp
SANDBOX_SHM: Final = "/dev/shm"  # noqa: S108 - likewise
WATCH_SECONDS: Final = 1.0
"""How often the workspace's size is checked while code runs."""
PROBE_SECONDS: Final = 10.0
REMOVE_SECONDS: Final = 5.0

# The host's top-level links or directories the interpreters need; `/usr` itself is bound read-only.
_SYSTEM_PATHS: Final = ("/bin", "/sbin", "/lib", "/lib64", "/lib32", "/libx32")
_HOST_ETC: Final = ("/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/alternatives", "/etc/localtime")
_PASSWD: Final = (
    f"root:x:0:0:root:/root:/usr/sbin/nologin\nsandbox:x:{SANDBOX_UID}:{SANDBOX_GID}::/workspace:/bin/bash\n"
)
_GROUP: Final = f"root:x:0:\nsandbox:x:{SANDBOX_GID}:\n"
_HOSTS: Final = f"127.0.0.1\tlocalhost {HOSTNAME}\n::1\tlocalhost\n"

_COMMANDS: Final[dict[Language, list[str]]] = {
    "bash": ["bash", "/run/code/main.sh"],
    "python": ["python3", "-"],
    "javascript": ["node", "-"],
}
_BINARIES: Final[dict[Language, str]] = {"bash": "bash", "python": "python3", "javascript": "node"}


def host_languages() -> tuple[Language, ...]:
    """The languages whose interpreter is under `/usr` (all the sandbox sees of the host's programs)."""
    return tuple(lang for lang, binary in _BINARIES.items() if shutil.which(binary, path=PATH))


def _system_binds() -> list[str]:
    """`/usr` read-only, and `/bin`, `/lib`... as they are on the host (links or read-only binds)."""
    args = ["--ro-bind", "/usr", "/usr"]
    for path in _SYSTEM_PATHS:
        if os.path.islink(path):
            args += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            args += ["--ro-bind", path, path]
    for path in _HOST_ETC:
        args += ["--ro-bind-try", path, path]
    return args


class _Fds:
    """The memfds handed to bwrap (filter, generated files, bash code), closed once it started."""

    def __init__(self) -> None:
        self.fds: list[int] = []

    def add(self, name: str, data: bytes) -> int:
        fd = os.memfd_create(name, 0)  # no MFD_CLOEXEC: bwrap inherits it (pass_fds)
        self.fds.append(fd)
        os.write(fd, data)
        os.lseek(fd, 0, os.SEEK_SET)
        return fd

    def close(self) -> None:
        for fd in self.fds:
            os.close(fd)
        self.fds.clear()


def bwrap_argv(
    bwrap: str,
    command: list[str],
    fds: _Fds,
    *,
    workspace: Path | None,
    tmp_bytes: int,
    seccomp: bytes | None,
    code: bytes | None = None,
) -> list[str]:
    """The bwrap command line running `command` (never code: that comes through `fds` or stdin)."""
    args = [bwrap, "--unshare-all", "--unshare-user", "--disable-userns", "--die-with-parent", "--new-session"]
    args += ["--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_GID), "--hostname", HOSTNAME, "--cap-drop", "ALL"]
    args += ["--clearenv", "--setenv", "PATH", PATH, "--setenv", "HOME", "/workspace"]
    args += ["--setenv", "LANG", "C.UTF-8", "--setenv", "TMPDIR", SANDBOX_TMP, "--setenv", "USER", "sandbox"]
    args += _system_binds()
    for name, text in (("passwd", _PASSWD), ("group", _GROUP), ("hosts", _HOSTS)):
        args += ["--perms", "0444", "--ro-bind-data", str(fds.add(name, text.encode())), f"/etc/{name}"]
    args += ["--proc", "/proc", "--dev", "/dev"]
    args += ["--size", str(tmp_bytes), "--tmpfs", SANDBOX_TMP, "--size", str(tmp_bytes), "--tmpfs", SANDBOX_SHM]
    if workspace is not None:
        args += ["--bind", str(workspace), "/workspace", "--chdir", "/workspace"]
    if code is not None:
        args += ["--perms", "0444", "--ro-bind-data", str(fds.add("code", code)), "/run/code/main.sh"]
    # Last of the mounts: the root's own tmpfs is no place to write, and /proc is read-only (as nsjail has it).
    args += ["--remount-ro", "/", "--remount-ro", "/proc"]
    if seccomp is not None:
        args += ["--seccomp", str(fds.add("seccomp", seccomp))]
    # Through a memfd, not the command line: the code can read bwrap's (`/proc/1/cmdline`), and
    # the options name host paths (the workspace's). The command itself must stay on the line.
    hidden = b"".join(arg.encode() + b"\0" for arg in args[1:])
    return [bwrap, "--args", str(fds.add("args", hidden)), "--", *command]


@dataclass(frozen=True, slots=True)
class Bounds:
    """How one execution is held in: its control groups (if the host gives any) and rlimits."""

    cgroups: CgroupHost | None
    limits: CgroupLimits
    rlimits: dict[str, int]
    note: str
    """What bounds code here, in words: `cgroup v1 (pids, memory, cpu, freezer) + rlimits`, or
    `rlimits only (<why no cgroups>)`."""


def bounds_for(settings: CodeSettings, cgroups: CgroupHost | str) -> Bounds:
    """The bounds `settings` ask for, with `cgroups` (or the reason there are none)."""
    limits = CgroupLimits(memory_bytes=settings.memory_bytes, pids=settings.pids_limit, cpus=settings.cpus)
    rlimits = {
        "RLIMIT_CPU": settings.cpu_limit_seconds,
        "RLIMIT_FSIZE": settings.file_size_bytes,
        "RLIMIT_NOFILE": settings.open_files,
        "RLIMIT_CORE": 0,
    }
    if isinstance(cgroups, str):
        # RLIMIT_NPROC counts every process of the sandbox user on the host, not just this run's.
        rlimits |= {"RLIMIT_DATA": settings.memory_bytes, "RLIMIT_NPROC": settings.pids_limit}
        return Bounds(None, limits, rlimits, f"rlimits only ({cgroups})")
    if "memory" not in cgroups.controllers:
        rlimits["RLIMIT_DATA"] = settings.memory_bytes
    missing = f"; without {', '.join(cgroups.missing)}" if cgroups.missing else ""
    used = ", ".join(cgroups.controllers)
    return Bounds(cgroups, limits, rlimits, f"cgroup v{cgroups.version} ({used}) + rlimits{missing}")


def _owner() -> tuple[int, int] | None:
    """Who the sandbox runs as on the host: `nobody` when we are root; else ourselves (None)."""
    return (SANDBOX_UID, SANDBOX_GID) if os.geteuid() == 0 else None


def _launch_spec(argv: list[str], bounds: Bounds, group: ExecCgroup | None) -> LaunchSpec:
    uid, gid = _owner() or (None, None)
    cgroups = group.procs_files() if group is not None else []
    return LaunchSpec(cgroups=cgroups, rlimits=bounds.rlimits, uid=uid, gid=gid, argv=argv)


_LAUNCH_ENV: Final = {"PATH": PATH, "LANG": "C.UTF-8"}
"""The launcher's (and so bwrap's own) environment: nothing of the service's (its secrets) passes."""


async def _spawn(spec: LaunchSpec, fds: _Fds, *, stdin: bool) -> asyncio.subprocess.Process:
    try:
        return await asyncio.create_subprocess_exec(
            sys.executable,
            "-I",
            "-S",
            LAUNCHER,
            json.dumps(spec),
            stdin=asyncio.subprocess.PIPE if stdin else asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            pass_fds=tuple(fds.fds),
            env=_LAUNCH_ENV,
            start_new_session=True,
        )
    finally:
        fds.close()


class _Execution:
    """One running execution: what stops it, and the cleanup that follows every ending."""

    def __init__(self, process: asyncio.subprocess.Process, group: ExecCgroup | None) -> None:
        self.process = process
        self.group = group
        self.stopped_for: Limit | None = None
        self.limit_hit: Limit | None = None
        self._finished: asyncio.Task[None] | None = None

    def stop(self, reason: Limit | None = None) -> None:
        """Kill every process of the execution now (no waiting; `finish` waits)."""
        if reason is not None and self.stopped_for is None:
            self.stopped_for = reason
        if self.group is not None:
            self.group.kill()  # bwrap itself is in the group too
        elif self.process.returncode is None:
            # Not `process.kill()`: its `poll()` may reap the child under asyncio's watcher.
            # bwrap dying takes the sandbox with it (`--die-with-parent`, then its pid namespace).
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.process.pid, signal.SIGKILL)

    async def finish(self) -> None:
        """Kill what is left, reap, and remove the groups; runs to its end even if the caller is cancelled."""
        if self._finished is None:
            self._finished = asyncio.create_task(self._finish())
        await asyncio.shield(self._finished)

    async def _finish(self) -> None:
        self.stop()
        if self.group is not None:
            self.limit_hit = self.group.limit_hit()  # read before the groups (and their counters) go
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.process.wait(), REMOVE_SECONDS)
        if self.group is not None and not await self.group.destroy(REMOVE_SECONDS):
            log.error("code_exec: processes of %s outlived SIGKILL", self.group.dirs[0].name)


class BwrapSandbox:
    """One session's bubblewrap sandbox: a workspace on the host, one execution at a time."""

    def __init__(self, backend: BwrapBackend, directory: SessionDirectory) -> None:
        """A sandbox working in `directory`."""
        self._backend = backend
        self._directory = directory
        self._settings = backend.settings
        self._lock = asyncio.Lock()
        self._closed = False
        self._running: _Execution | None = None

    @property
    def workspace(self) -> Path:
        """The host directory bound at `/workspace`."""
        return self._directory.workspace

    async def run(self, language: Language, code: str) -> ExecResult:
        """Run `code` in `language`; executions of this sandbox wait for each other."""
        data = code.encode("utf-8", errors="surrogatepass")
        if language == "bash":
            return await self._execute(_COMMANDS[language], code=data)
        return await self._execute(_COMMANDS[language], stdin=data)

    async def setup(self, command: str) -> ExecResult:
        """Run the operator's bootstrap `command` with `bash -lc`."""
        return await self._execute(["bash", "-lc", command])

    async def _execute(
        self, command: list[str], *, code: bytes | None = None, stdin: bytes | None = None
    ) -> ExecResult:
        async with self._lock:
            if self._closed:
                msg = "the sandbox was closed"
                raise SessionUnavailableError(msg)
            return await self._execute_now(command, code=code, stdin=stdin)

    async def _execute_now(self, command: list[str], *, code: bytes | None, stdin: bytes | None) -> ExecResult:
        backend, settings = self._backend, self._settings
        group = backend.new_cgroup()
        fds = _Fds()
        argv = bwrap_argv(
            backend.bwrap, command, fds, workspace=self.workspace, tmp_bytes=backend.tmp_bytes,
            seccomp=backend.seccomp, code=code,
        )  # fmt: skip
        try:
            process = await _spawn(_launch_spec(argv, backend.bounds, group), fds, stdin=stdin is not None)
        except BaseException:
            if group is not None:
                await group.destroy()
            raise
        execution = self._running = _Execution(process, group)
        watchdog = asyncio.create_task(self._watch(execution))
        try:
            captured = await capture(
                process, cap=settings.max_output_bytes, timeout=settings.exec_timeout_seconds,
                stop=execution.stop, stdin=stdin,
            )  # fmt: skip
        finally:
            watchdog.cancel()
            self._running = None
            await execution.finish()
        return await self._result(captured, execution)

    async def _watch(self, execution: _Execution) -> None:
        """Stop the execution once its workspace is over budget (checked every `WATCH_SECONDS`)."""
        budget = self._settings.workspace_bytes
        while True:
            await asyncio.sleep(WATCH_SECONDS)
            usage = await asyncio.to_thread(self._directory.measure)
            if usage.over(budget):
                execution.stop("workspace")
                return

    async def _result(self, captured: Captured, execution: _Execution) -> ExecResult:
        settings = self._settings
        cap = settings.max_output_bytes
        # bwrap's own complaints (a mount that failed) name the host path: the code sees /workspace.
        stderr = shown(captured.stderr, stream="stderr", cap=cap, cut=captured.stderr_cut).replace(
            str(self.workspace), "/workspace"
        )
        over = execution.stopped_for == "workspace" or (await asyncio.to_thread(self._directory.measure)).over(
            settings.workspace_bytes
        )
        if over:
            await asyncio.to_thread(self._directory.wipe)
            stderr += (
                f"\n[workspace over {settings.workspace_bytes} bytes: the code was stopped and /workspace emptied]\n"
            )
            artifacts: list[Artifact] = []
            dropped = 0
        else:
            artifacts, dropped = await asyncio.to_thread(self._collect)
        limit: Limit | None
        if captured.timed_out:
            limit = "timeout"
        elif over:
            limit = "workspace"
        elif captured.cut:
            limit = "output"
        else:
            limit = execution.limit_hit
        return ExecResult(
            exit_code=captured.exit_code,
            stdout=shown(captured.stdout, stream="stdout", cap=cap, cut=captured.stdout_cut),
            stderr=stderr,
            truncated=captured.cut,
            timed_out=captured.timed_out,
            limit=limit,
            artifacts=artifacts,
            artifacts_dropped=dropped,
        )

    def _collect(self) -> tuple[list[Artifact], int]:
        with self._directory.open_workspace() as fd:
            found = collect(fd, max_count=self._settings.max_artifacts, max_bytes=self._settings.max_artifact_bytes)
            self._directory.reset_artifacts(fd)
            return found

    async def close(self) -> None:
        """Stop a running execution, then remove the workspace; idempotent."""
        if self._closed:
            return
        self._closed = True
        running = self._running
        if running is not None:
            running.stop()
        async with self._lock:  # the running execution (if any) has cleaned up once this is ours
            await asyncio.to_thread(self._directory.remove)


class BwrapBackend:
    """Makes bubblewrap sandboxes under `root` (a directory per session)."""

    name: Final = "bwrap"

    def __init__(
        self, settings: CodeSettings, root: Path, *, bwrap: str | None = None, cgroups: CgroupHost | str | None = None
    ) -> None:
        """Sandboxes bounded by `settings`, their workspaces under `root`.

        `cgroups`: how to make control groups, or why there are none (default: `cgroups.detect()`).

        Raises:
            ValueError: bwrap is missing, or the sandbox user could not reach workspaces under `root`.
        """
        found = shutil.which(bwrap or "bwrap")
        if found is None:
            msg = "bubblewrap (bwrap) is not installed"
            raise ValueError(msg)
        owner = _owner()
        if owner is not None and (reason := unreachable(root, *owner)) is not None:
            msg = f"code_exec workspaces cannot live under {root}: {reason}"
            raise ValueError(msg)
        self.settings = settings
        self.root = root
        self.bwrap = found
        self.bounds = bounds_for(settings, detect() if cgroups is None else cgroups)
        if self.bounds.cgroups is not None and (stale := self.bounds.cgroups.sweep_stale()):
            log.info("code_exec: removed %d control groups left by a service process that is gone", stale)
        self.seccomp = filter_for_machine()
        self.tmp_bytes = min(TMP_BYTES, settings.memory_bytes)
        self.workspace_tmpfs = _workspace_tmpfs(settings, root, owner)
        """The size of each session's workspace tmpfs (None: plain directories, see `tmpfs`)."""
        self._languages = host_languages()

    @property
    def note(self) -> str:
        """What bounds code here, in words (for the availability line and the logs)."""
        seccomp = "" if self.seccomp is not None else "; no seccomp filter for this machine"
        return self.bounds.note + seccomp

    def languages(self) -> tuple[Language, ...]:
        """bash, python and javascript, as far as this host has them."""
        return self._languages

    def new_cgroup(self) -> ExecCgroup | None:
        """Fresh groups for one execution (None without cgroups).

        Raises:
            SessionUnavailableError: the host gives cgroups but they could not be made now.
        """
        if self.bounds.cgroups is None:
            return None
        try:
            return self.bounds.cgroups.create(self.bounds.limits)
        except OSError as exc:
            msg = f"cannot make the execution's control groups ({exc.strerror or exc})"
            raise SessionUnavailableError(msg) from exc

    async def open(self, session_id: str) -> BwrapSandbox:
        """A sandbox with a fresh workspace, its setup command run.

        Raises:
            SessionUnavailableError: the workspace could not be made, or the setup command failed.
        """
        try:
            directory = await asyncio.to_thread(
                SessionDirectory, self.root, session_id, owner=_owner(), tmpfs_bytes=self.workspace_tmpfs
            )
        except OSError as exc:
            # The path is for the operator's log; the model (and so the code) gets the reason alone.
            log.warning("code_exec: cannot make a workspace under %s: %s", self.root, exc)
            msg = f"cannot make a workspace ({exc.strerror or type(exc).__name__})"
            raise SessionUnavailableError(msg) from exc
        sandbox = BwrapSandbox(self, directory)
        if self.settings.setup.strip():
            try:
                result = await sandbox.setup(self.settings.setup)
            except BaseException:
                await sandbox.close()
                raise
            if result.exit_code != 0 or result.timed_out:
                await sandbox.close()
                raise SessionUnavailableError(_setup_failure(result))
        return sandbox


def _workspace_tmpfs(settings: CodeSettings, root: Path, owner: tuple[int, int] | None) -> int | None:
    """Each workspace's tmpfs size, if this service may mount one (only as root), else None (logged)."""
    if owner is None:
        log.warning("code_exec: not root, so workspaces are host directories: /proc/self/mountinfo shows their path")
        return None
    root.mkdir(parents=True, exist_ok=True)
    why = tmpfs.unavailable(root)
    if why is not None:
        log.warning("code_exec: cannot mount a tmpfs per workspace (%s): /proc/self/mountinfo shows their path", why)
        return None
    if stale := tmpfs.sweep_stale(root):
        log.info("code_exec: unmounted %d workspaces left by a service process that is gone", stale)
    return 2 * settings.workspace_bytes


def _setup_failure(result: ExecResult) -> str:
    tail = (result.stderr or result.stdout).strip()[-500:]
    how = "timed out" if result.timed_out else f"exited with {result.exit_code}"
    return f"the setup command {how}" + (f": {tail}" if tail else "")


async def probe_bwrap(bwrap: str | None = None) -> tuple[bool, str]:
    """Whether bwrap really starts a sandbox with our isolation here: (True, note) or (False, why).

    The binary being there proves nothing (user namespaces may be off, a seccomp policy may refuse
    them): this starts one with the exact flags, as the sandbox user, and runs `true` in it.
    """
    found = shutil.which(bwrap or "bwrap")
    if found is None:
        return False, "bubblewrap not installed"
    fds = _Fds()
    argv = bwrap_argv(found, ["true"], fds, workspace=None, tmp_bytes=MIB, seccomp=filter_for_machine())
    uid, gid = _owner() or (None, None)
    spec = LaunchSpec(cgroups=[], rlimits={}, uid=uid, gid=gid, argv=argv)
    try:
        process = await _spawn(spec, fds, stdin=False)
        _out, err = await asyncio.wait_for(process.communicate(), PROBE_SECONDS)
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            os.kill(process.pid, signal.SIGKILL)
        return False, f"bwrap did not start a sandbox within {PROBE_SECONDS:g}s"
    except OSError as exc:
        return False, f"bwrap: {exc.strerror or exc}"
    if process.returncode != 0:
        lines = err.decode("utf-8", errors="replace").strip().splitlines()
        return False, lines[-1] if lines else f"bwrap exited with {process.returncode}"
    return True, ""
