"""The escape suite (reliability targets S1-S10, S13): real bubblewrap, no mocks.

Each attack fails, a host canary is unchanged and the outcome is a structured result; every test
also ends with no sandbox process or control group left (`no_leftovers`). One session serves the
module (files of one test may meet the next: each test names its own files). Skipped, saying
why, only where `probe()` finds bwrap unable to isolate; CI has it.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import secrets
import socket
import textwrap
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from atmosphere.sandbox.code import CodeSessions, ExecResult, Language
from atmosphere.sandbox.code.bwrap import SANDBOX_UID

from .conftest import bwrap_backend, our_groups, sandbox_processes, settled_leftovers

pytestmark = pytest.mark.asyncio(loop_scope="module")

RUN = "escape-suite"
TIMEOUT = 3.0
CAP = 1024 * 1024
PIDS = 64


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def sandbox(bwrap_ready: str, code_root: Path) -> AsyncIterator[CodeSessions]:
    backend = bwrap_backend(code_root)
    sessions = CodeSessions(backend, backend.settings)
    yield sessions
    await sessions.close()


async def run(sessions: CodeSessions, language: Language, code: str, run_id: str = RUN) -> ExecResult:
    return await sessions.exec(run_id, language, textwrap.dedent(code))


def tree_digest(root: Path) -> str:
    """sha256 over every path, mode and content below `root` (links by their target)."""
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*")):
        info = path.lstat()
        digest.update(f"{path.relative_to(root)}|{info.st_mode:o}|".encode())
        digest.update(os.readlink(path).encode() if path.is_symlink() else path.read_bytes() if path.is_file() else b"")
    return digest.hexdigest()


@pytest.fixture
def canary(tmp_path: Path) -> Path:
    """A host directory the sandbox must never see or touch."""
    directory = tmp_path / "canary"
    (directory / "sub").mkdir(parents=True)
    (directory / "file.txt").write_text("canary-content-" + secrets.token_hex(8))
    (directory / "sub" / "deep.txt").write_text("deep canary")
    return directory


def brief(result: ExecResult) -> str:
    """A result for an assertion message: its outcome, and the ends of its streams."""
    return (
        f"exit={result.exit_code} limit={result.limit} timed_out={result.timed_out} truncated={result.truncated} "
        f"stdout[{len(result.stdout)}]=...{result.stdout[-200:]!r} "
        f"stderr[{len(result.stderr)}]=...{result.stderr[-300:]!r}"
    )


def outcomes(result: ExecResult) -> dict[str, Any]:
    """The JSON object the attack script printed last."""
    assert result.exit_code == 0, brief(result)
    found: dict[str, Any] = json.loads(result.stdout.strip().splitlines()[-1])
    return found


# --- S1 network -----------------------------------------------------------------------------------------


class HostListeners:
    """Loopback listeners on the host: TCP (v4, v6 when the host has it), UDP, a unix and an abstract socket."""

    def __init__(self, directory: Path) -> None:
        self.tcp = socket.create_server(("127.0.0.1", 0))
        self.udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.udp.bind(("127.0.0.1", 0))
        self.tcp6: socket.socket | None = None
        with contextlib.suppress(OSError):
            self.tcp6 = socket.create_server(("::1", 0), family=socket.AF_INET6)
        self.unix_path = directory / "host.sock"
        self.unix = socket.socket(socket.AF_UNIX)
        self.unix.bind(str(self.unix_path))
        self.unix.listen()
        self.abstract_name = f"\0atmo-canary-{os.getpid()}-{secrets.token_hex(4)}"
        self.abstract = socket.socket(socket.AF_UNIX)
        self.abstract.bind(self.abstract_name)
        self.abstract.listen()

    @property
    def ports(self) -> dict[str, object]:
        return {
            "tcp": self.tcp.getsockname()[1],
            "tcp6": self.tcp6.getsockname()[1] if self.tcp6 else 0,
            "udp": self.udp.getsockname()[1],
            "unix": str(self.unix_path),
            "abstract": self.abstract_name[1:],
        }

    def contacts(self) -> list[str]:
        """Every connection or datagram that reached the host."""
        reached = []
        for name, sock in (("tcp", self.tcp), ("tcp6", self.tcp6), ("unix", self.unix), ("abstract", self.abstract)):
            if sock is None:
                continue
            sock.setblocking(False)
            with contextlib.suppress(BlockingIOError):
                sock.accept()
                reached.append(name)
        self.udp.setblocking(False)
        with contextlib.suppress(BlockingIOError):
            self.udp.recvfrom(65536)
            reached.append("udp")
        return reached

    def close(self) -> None:
        for sock in (self.tcp, self.tcp6, self.udp, self.unix, self.abstract):
            if sock is not None:
                sock.close()


NETWORK_PROBES: dict[Language, str] = {
    "python": """
        import json, socket
        ports = json.loads({ports!r})
        out = {{}}
        def attempt(name, make, address):
            try:
                s = make()
                s.settimeout(1)
                s.connect(address)
                out[name] = "connected"
            except OSError as exc:
                out[name] = f"refused ({{exc.__class__.__name__}})"
        attempt("tcp", socket.socket, ("127.0.0.1", ports["tcp"]))
        if ports["tcp6"]:
            attempt("tcp6", lambda: socket.socket(socket.AF_INET6), ("::1", ports["tcp6"]))
        try:
            resolved = socket.getaddrinfo("localhost", ports["tcp"], type=socket.SOCK_STREAM)
            for family, kind, proto, _name, address in resolved:
                attempt(f"localhost-{{address[0]}}", lambda: socket.socket(family, kind, proto), address)
        except OSError as exc:
            out["localhost"] = f"refused ({{exc}})"
        attempt("unix", lambda: socket.socket(socket.AF_UNIX), ports["unix"])
        attempt("abstract", lambda: socket.socket(socket.AF_UNIX), "\\0" + ports["abstract"])
        udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            udp.sendto(b"canary", ("127.0.0.1", ports["udp"]))  # may "succeed": into the sandbox's own lo
        except OSError:
            pass
        for name, family, kind, proto in (("raw", socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP),
                                          ("packet", socket.AF_PACKET, socket.SOCK_RAW, 0)):
            try:
                socket.socket(family, kind, proto)
                out[name] = "connected"
            except OSError as exc:
                out[name] = f"refused ({{exc.__class__.__name__}})"
        with open("/proc/net/dev") as dev:
            out["interfaces"] = ",".join(sorted(line.split(":")[0].strip() for line in dev.readlines()[2:]))
        print(json.dumps(out))
    """,
    "bash": """
        out='{{'
        for target in /dev/tcp/127.0.0.1/{tcp} /dev/udp/127.0.0.1/{udp}; do
          if (exec 3<>"$target" && echo canary >&3) 2>/dev/null; then r=sent; else r=refused; fi
          out="$out\\"$target\\":\\"$r\\","
        done
        ifaces=$(ip -o link 2>/dev/null | awk -F': ' '{{print $2}}' | sort | paste -sd, -)
        echo "$out\\"tcp-udp\\":\\"checked\\",\\"interfaces\\":\\"$ifaces\\"}}"
    """,
    "javascript": """
        const net = require('net');
        const ports = JSON.parse({ports_json});
        const out = {{}};
        const attempt = (name, options) => new Promise((done) => {{
          const socket = net.connect(options);
          socket.setTimeout(1000, () => {{ out[name] = 'refused (timeout)'; socket.destroy(); done(); }});
          socket.on('connect', () => {{ out[name] = 'connected'; socket.destroy(); done(); }});
          socket.on('error', (e) => {{ out[name] = `refused (${{e.code}})`; done(); }});
        }});
        (async () => {{
          await attempt('tcp', {{ host: '127.0.0.1', port: ports.tcp }});
          await attempt('localhost', {{ host: 'localhost', port: ports.tcp }});
          await attempt('unix', {{ path: ports.unix }});
          console.log(JSON.stringify(out));
        }})();
    """,
}


@pytest.mark.parametrize("language", ["python", "bash", "javascript"])
async def test_s1_no_network_reaches_the_host(sandbox: CodeSessions, tmp_path: Path, language: Language) -> None:
    host = HostListeners(tmp_path)
    try:
        ports = host.ports
        code = NETWORK_PROBES[language].format(
            ports=json.dumps(ports), ports_json=json.dumps(json.dumps(ports)), tcp=ports["tcp"], udp=ports["udp"]
        )
        result = await run(sandbox, language, code)
        found = outcomes(result)
        assert host.contacts() == []
    finally:
        host.close()
    assert not [name for name, outcome in found.items() if outcome in {"connected", "sent"} and "udp" not in name]
    if "interfaces" in found:
        assert found["interfaces"] == "lo"
    if language == "python":
        assert {"tcp", "unix", "abstract", "raw", "packet"} <= found.keys()


# --- S2 filesystem --------------------------------------------------------------------------------------

FILESYSTEM_ATTACKS = """
    import ctypes, json, os, stat
    canary, secret = {canary!r}, {secret!r}
    libc = ctypes.CDLL(None, use_errno=True)
    out = {{}}
    def attempt(name, action):
        try:
            action()
            out[name] = "done"
        except OSError as exc:
            out[name] = f"denied ({{exc.__class__.__name__}})"
    def write(path):
        with open(path, "a") as file:
            file.write("pwned")
    def syscall(name, *args):
        if libc.syscall(*args) != 0:
            raise OSError(ctypes.get_errno(), name)
    attempt("absolute", lambda: write(canary + "/file.txt"))
    attempt("absolute-new", lambda: write(canary + "/new.txt"))
    attempt("etc", lambda: write("/etc/passwd"))
    attempt("usr", lambda: write("/usr/bin/pwned"))
    attempt("root", lambda: write("/pwned"))
    attempt("dotdot", lambda: write("/workspace/../../../.." + canary + "/file.txt"))
    os.symlink(canary + "/file.txt", "/workspace/s2-link")
    attempt("symlink", lambda: write("/workspace/s2-link"))
    os.symlink("/etc/passwd", "/workspace/s2-etc-link")
    attempt("symlink-etc", lambda: write("/workspace/s2-etc-link"))
    attempt("hardlink-etc", lambda: os.link("/etc/passwd", "/workspace/s2-hard"))
    attempt("hardlink-usr", lambda: os.link("/usr/bin/bash", "/workspace/s2-hard2"))
    attempt("proc-root", lambda: write("/proc/self/root" + canary + "/file.txt"))
    attempt("proc-1-cwd", lambda: write("/proc/1/cwd" + canary + "/file.txt"))
    attempt("proc-1-root", lambda: write("/proc/1/root/etc/passwd"))
    attempt("mknod", lambda: os.mknod("/workspace/s2-dev", stat.S_IFCHR | 0o666, os.makedev(1, 3)))
    attempt("mount", lambda: syscall("mount", 165, b"none", b"/workspace", b"tmpfs", 0, None))
    attempt("chroot", lambda: os.chroot("/workspace"))
    attempt("pivot_root", lambda: syscall("pivot_root", 155, b"/workspace", b"/workspace"))
    attempt("read-secret", lambda: open(secret).read())
    attempt("read-secret-proc", lambda: open("/proc/1/root" + secret).read())
    seen = []
    for base in ("/", "/proc/1/cwd", "/proc/1/root", "/proc/self/root"):
        try:
            seen += os.listdir(base)
        except OSError:
            pass
    out["listing"] = ",".join(sorted(set(seen)))
    print(json.dumps(out))
"""


async def test_s2_no_write_or_read_outside_the_workspace(sandbox: CodeSessions, tmp_path: Path, canary: Path) -> None:
    secret = tmp_path / "secret.txt"
    token = "host-secret-" + secrets.token_hex(8)
    secret.write_text(token)
    before = tree_digest(canary)
    result = await run(sandbox, "python", FILESYSTEM_ATTACKS.format(canary=str(canary), secret=str(secret)))
    found = outcomes(result)
    listing = found.pop("listing")
    assert {name: outcome for name, outcome in found.items() if not outcome.startswith("denied")} == {}
    assert token not in result.stdout + result.stderr
    assert "canary" not in listing
    assert tree_digest(canary) == before
    assert secret.read_text() == token


async def test_s2_shell_attacks_fail_too(sandbox: CodeSessions, canary: Path) -> None:
    before = tree_digest(canary)
    result = await run(
        sandbox,
        "bash",
        f"""
        for attack in "echo pwned >> /etc/passwd" "echo pwned > {canary}/file.txt" "ln /etc/passwd s2b-hard" \
                      "mknod s2b-dev c 1 3" "mount -t tmpfs none /workspace" "chroot /workspace /bin/true" \
                      "unshare -r true" "cat {canary}/file.txt"; do
          if bash -c "$attack" 2>/dev/null; then echo "ESCAPED: $attack"; fi
        done
        echo done
        """,
    )
    assert result.stdout == "done\n"
    assert tree_digest(canary) == before


# --- S3 host-side symlink TOCTOU ------------------------------------------------------------------------

SWAPPER = """
    import os, random, shutil, subprocess, sys
    canary_file, canary_dir, rounds = {canary_file!r}, {canary_dir!r}, {rounds}
    art = "/workspace/artifacts"
    def clear(path):
        if os.path.islink(path) or os.path.isfile(path):
            os.unlink(path)
        elif os.path.isdir(path):
            shutil.rmtree(path)
    def swap(i):
        for name in ("x", "d", "y.png"):
            clear(os.path.join(art, name))
        if i % 2:
            os.symlink(canary_file, art + "/x")
            os.symlink(canary_dir, art + "/d")
            os.symlink(canary_file, art + "/y.png")
        else:
            with open(art + "/x", "w") as f:
                f.write("benign")
            os.mkdir(art + "/d")
            with open(art + "/d/inner", "w") as f:
                f.write("inner")
    for i in range(rounds):
        swap(i)
    swap(random.randrange(2))
    # Left swapping as the execution ends: the host must stop it before it collects (or collect safely).
    subprocess.Popen([sys.executable, "-c", BACKGROUND.format(canary_file=canary_file)])
    print("swapped", rounds)
"""
BACKGROUND = """
import os
while True:
    try:
        os.unlink("/workspace/artifacts/x")
        os.symlink({canary_file!r}, "/workspace/artifacts/x")
    except OSError:
        pass
"""


async def test_s3_swapping_artifacts_for_links_never_reaches_the_host(sandbox: CodeSessions, canary: Path) -> None:
    before = tree_digest(canary)
    content = (canary / "file.txt").read_bytes()
    returned: list[bytes] = []
    for _ in range(4):  # 4 execs x 84 rounds x 3 names: 1 008 swaps
        code = SWAPPER.format(canary_file=str(canary / "file.txt"), canary_dir=str(canary), rounds=84)
        code = f"BACKGROUND = {BACKGROUND!r}\n" + textwrap.dedent(code)
        result = await run(sandbox, "python", code)
        assert result.stdout == "swapped 84\n", brief(result)
        returned += [artifact.data for artifact in result.artifacts]
        assert settled_leftovers() == []
    # The host's view: replace the whole artifacts dir by a link to the canary dir.
    result = await run(sandbox, "bash", f"rm -rf artifacts && ln -s {canary} artifacts && echo linked")
    assert (result.stdout, result.artifacts) == ("linked\n", [])
    assert content not in returned
    assert set(returned) <= {b"benign"}
    assert tree_digest(canary) == before
    assert (canary / "file.txt").read_bytes() == content


# --- S4 fork bombs --------------------------------------------------------------------------------------

FORK_BOMBS: dict[Language, str] = {
    "bash": ":(){ :|:& };:\nsleep 2\necho survived",
    "python": """
        import os
        failures = 0
        while failures < 200:
            try:
                os.fork()
            except OSError:
                failures += 1
        print("contained")
    """,
    "javascript": """
        const cp = require('child_process');
        let failed = 0;
        for (let i = 0; i < 300; i++) {
          try { cp.spawn('sleep', ['100']).on('error', () => { failed++; }); } catch (e) { failed++; }
        }
        setTimeout(() => { console.log('failed', failed); process.exit(0); }, 1000);
    """,
}


async def _max_pids_while(task: asyncio.Task[ExecResult]) -> int:
    """The most processes one of our groups held while `task` ran (sampled)."""
    most = 0
    while not task.done():
        for group in our_groups():
            with contextlib.suppress(OSError, ValueError):
                most = max(most, int((group / "pids.current").read_text()))
        await asyncio.sleep(0.02)
    return most


@pytest.mark.parametrize("language", ["bash", "python", "javascript"])
async def test_s4_fork_bombs_stop_at_the_pids_limit(sandbox: CodeSessions, language: Language) -> None:
    started = time.monotonic()
    task = asyncio.create_task(run(sandbox, language, FORK_BOMBS[language]))
    most = await _max_pids_while(task)
    result = await task
    assert time.monotonic() - started <= TIMEOUT + 2
    assert result.limit in {"pids", "timeout"}, brief(result)
    assert 0 < most <= PIDS
    assert settled_leftovers() == []


# --- S5 memory bombs ------------------------------------------------------------------------------------

MEMORY_BOMBS: dict[Language, str] = {
    "python": "hog = bytearray(256 * 1024 * 1024)\nprint('allocated')",
    "bash": 's=x; while true; do s="$s$s"; done',
    "javascript": "const hog = []; for (;;) hog.push(new Array(1e6).fill(1.5));",
}


def _rss_kib() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


@pytest.mark.parametrize("language", ["python", "bash", "javascript"])
async def test_s5_memory_bombs_are_killed_in_their_group(sandbox: CodeSessions, language: Language) -> None:
    before = _rss_kib()
    for _ in range(2):
        result = await run(sandbox, language, MEMORY_BOMBS[language])
        assert (result.limit, result.exit_code) == ("memory", 137), brief(result)
        assert "allocated" not in result.stdout
    assert _rss_kib() - before < 50 * 1024  # the service process is not where the memory went


# --- S6 CPU burn ----------------------------------------------------------------------------------------

CPU_BURNS: dict[Language, str] = {
    "python": """
        import threading
        def spin():
            while True:
                pass
        for _ in range(4):
            threading.Thread(target=spin, daemon=True).start()
        spin()
    """,
    "bash": "while :; do :; done",
    "javascript": "for (;;) {}",
}


async def test_s6_cpu_burns_are_killed_at_the_wall_timeout(sandbox: CodeSessions) -> None:
    async def burn(language: Language) -> tuple[ExecResult, float]:
        started = time.monotonic()
        result = await run(sandbox, language, CPU_BURNS[language], run_id=f"{RUN}-cpu-{language}")
        return result, time.monotonic() - started

    burns = await asyncio.gather(*(burn(language) for language in CPU_BURNS))
    for result, elapsed in burns:
        assert (result.timed_out, result.limit, result.exit_code) == (True, "timeout", 137), brief(result)
        assert TIMEOUT - 0.1 <= elapsed <= TIMEOUT + 2
    for language in CPU_BURNS:
        await sandbox.release(f"{RUN}-cpu-{language}")


# --- S7 output floods -----------------------------------------------------------------------------------

FLOODS: dict[Language, tuple[str, str]] = {
    "bash": ("yes", "stdout"),
    # One 100 MiB line without a newline (written in pieces: a single 100 MiB string would hit the memory limit).
    "python": ("import sys\nfor _ in range(1600):\n    sys.stdout.write('x' * 65536)", "stdout"),
    # Writing as fast as the pipe takes it (a loop ignoring backpressure only fills node's own memory: S5).
    "javascript": (
        "const chunk = 'e'.repeat(65536);\n"
        "const flood = () => { while (process.stderr.write(chunk)); process.stderr.once('drain', flood); };\n"
        "flood();",
        "stderr",
    ),
}


@pytest.mark.parametrize("language", ["bash", "python", "javascript"])
async def test_s7_output_floods_are_capped_and_the_code_stopped(sandbox: CodeSessions, language: Language) -> None:
    code, stream = FLOODS[language]
    result = await run(sandbox, language, code)
    text = result.stdout if stream == "stdout" else result.stderr
    assert (result.truncated, result.limit) == (True, "output"), brief(result)
    assert not result.timed_out
    assert len(text.encode()) <= CAP + 1024
    assert text.endswith(f"\n[{stream} truncated: more than {CAP} bytes; the code was stopped]\n")


async def test_s7_terminal_escapes_and_binary_are_neutralised(sandbox: CodeSessions) -> None:
    code = r"""
        import sys
        sys.stdout.buffer.write(b"\x1b[31mred\x1b[0m \x1b]0;title\x07\x1b(B\x00\x07\x08\x9b\xff\xfeok\r\n")
        sys.stderr.buffer.write(b"\x1b[2J\x1b[Hcleared\x1bc\n")
    """
    result = await run(sandbox, "python", code)
    assert result.stdout == "red \ufffd\ufffd\ufffdok\n"
    assert result.stderr == "cleared\n"
    assert not any(ord(c) < 32 and c not in "\n\t" for c in result.stdout + result.stderr)


# --- S8 secrets -----------------------------------------------------------------------------------------

SECRET_HUNT = """
    import glob, json, os
    found = []
    for path in ["/proc/self/environ", "/proc/1/environ", *glob.glob("/proc/*/environ"), *glob.glob("/proc/*/cmdline")]:
        try:
            found.append(open(path, "rb").read().decode(errors="replace"))
        except OSError:
            pass
    found.append(json.dumps(dict(os.environ)))
    writes = {}
    targets = ("/proc/sys/kernel/hostname", "/proc/sys/vm/drop_caches", "/sys/kernel/uevent_helper",
               "/proc/self/oom_score_adj")
    for path in targets:
        try:
            with open(path, "w") as file:
                file.write("1")
            writes[path] = "written"
        except OSError as exc:
            writes[path] = f"denied ({exc.__class__.__name__})"
    pids = [p for p in os.listdir("/proc") if p.isdigit()]
    print("\\n".join(found))
    print(json.dumps({"writes": writes, "pids": len(pids), "env": sorted(os.environ)}))
"""


async def test_s8_no_secret_of_the_host_is_visible(sandbox: CodeSessions, monkeypatch: pytest.MonkeyPatch) -> None:
    token = "canary-" + secrets.token_hex(12)
    monkeypatch.setenv("SANDBOX_CANARY", token)
    result = await run(sandbox, "python", SECRET_HUNT)
    shell = await run(sandbox, "bash", "env; cat /proc/*/environ /proc/*/cmdline 2>/dev/null; echo")
    assert token not in result.stdout + result.stderr + shell.stdout + shell.stderr
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert all(outcome.startswith("denied") for outcome in summary["writes"].values()), summary
    assert summary["pids"] < 30
    assert summary["env"] == ["HOME", "LANG", "PATH", "PWD", "TMPDIR", "USER"]  # PWD: set by bwrap's --chdir


# --- S9 process lifecycle -------------------------------------------------------------------------------


async def test_s9_nothing_outlives_the_execution(sandbox: CodeSessions) -> None:
    code = """
        sleep 1000 &
        ( ( sleep 1000 & ) & )
        setsid sleep 1000 &
        nohup sleep 1000 >/dev/null 2>&1 &
        python3 -c 'import os, signal, time
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                time.sleep(1000)
        time.sleep(1000)' &
        sleep 0.3
        echo started
    """
    started = time.monotonic()
    result = await run(sandbox, "bash", code)
    assert (result.exit_code, result.stdout) == (0, "started\n")
    assert time.monotonic() - started < TIMEOUT
    assert settled_leftovers(2.0) == []


async def test_s9_a_cancelled_execution_leaves_nothing(sandbox: CodeSessions) -> None:
    task = asyncio.create_task(run(sandbox, "bash", "sleep 1000 & setsid sleep 1000 & sleep 1000"))
    deadline = time.monotonic() + 2
    while not sandbox_processes() and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    assert sandbox_processes()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert settled_leftovers(2.0) == []


# --- S10 privilege --------------------------------------------------------------------------------------

PRIVILEGE_ATTACKS = """
    import ctypes, fcntl, json, os, subprocess, termios
    libc = ctypes.CDLL(None, use_errno=True)
    out = {"uid": os.getuid(), "euid": os.geteuid()}
    out["ptrace-1"] = libc.ptrace(16, 1, 0, 0) == 0 and "attached" or f"denied ({ctypes.get_errno()})"
    out["ptrace-parent"] = libc.ptrace(16, os.getppid(), 0, 0) == 0 and "attached" or "denied"
    for name, fd in (("tty", None), ("stdout", 1)):
        try:
            fd = os.open("/dev/tty", os.O_RDWR) if fd is None else fd
            fcntl.ioctl(fd, termios.TIOCSTI, b"x")
            out[f"tiocsti-{name}"] = "injected"
        except OSError as exc:
            out[f"tiocsti-{name}"] = f"denied ({exc.errno})"
    nested = subprocess.run(["unshare", "-r", "id", "-u"], capture_output=True, text=True)
    out["unshare"] = "root" if nested.returncode == 0 and nested.stdout.strip() == "0" else "denied"
    subprocess.run(["cp", "/usr/bin/bash", "/workspace/s10-bash"], check=True)
    os.chmod("/workspace/s10-bash", 0o4755)
    setuid = subprocess.run(["/workspace/s10-bash", "-p", "-c", "id -u"], capture_output=True, text=True)
    out["setuid"] = setuid.stdout.strip()
    for tool in ("sudo", "su"):
        try:
            argv = [tool, "-c", "id -u"] if tool == "su" else [tool, "id", "-u"]
            done = subprocess.run(argv, capture_output=True, text=True)
            out[tool] = "root" if done.stdout.strip() == "0" else "denied"
        except OSError:
            out[tool] = "denied"
    open("/workspace/s10-owned", "w").close()
    print(json.dumps(out))
"""


async def test_s10_no_privilege_is_gained(sandbox: CodeSessions, code_root: Path) -> None:
    result = await run(sandbox, "python", PRIVILEGE_ATTACKS)
    found = outcomes(result)
    assert (found.pop("uid"), found.pop("euid"), found.pop("setuid")) == (65534, 65534, "65534")
    assert {name: outcome for name, outcome in found.items() if not str(outcome).startswith("denied")} == {}
    owned = next(code_root.glob("escape-suite-*/workspace/s10-owned"))
    assert owned.stat().st_uid == SANDBOX_UID


async def test_s10_sandbox_processes_run_as_nobody_on_the_host(sandbox: CodeSessions) -> None:
    task = asyncio.create_task(run(sandbox, "bash", "sleep 1.5; echo done"))
    seen: dict[int, str] = {}
    while not task.done():
        for pid, _name in sandbox_processes():
            with contextlib.suppress(OSError):
                status = Path(f"/proc/{pid}/status").read_text()
                seen[pid] = next(line for line in status.splitlines() if line.startswith("Uid:"))
        await asyncio.sleep(0.05)
    assert (await task).stdout == "done\n"
    assert seen
    assert all(line.split()[1:] == [str(SANDBOX_UID)] * 4 for line in seen.values()), seen


# --- S13 two sessions -----------------------------------------------------------------------------------

CROSS_PROBES = """
    import json, os, random, signal
    target_dir, target_pids = {target_dir!r}, {target_pids!r}
    mine = {{int(p) for p in os.listdir("/proc") if p.isdigit()}}
    reached = []
    for i in range(100):
        probes = [
            ("list", lambda: os.listdir(target_dir)),
            ("read", lambda: open(os.path.join(target_dir, "a-secret.txt")).read()),
            ("proc", lambda: os.listdir(f"/proc/{{random.choice(target_pids)}}")),
            ("signal", lambda: os.kill(random.choice(target_pids), signal.SIGKILL)),
        ]
        name, probe = probes[i % len(probes)]
        try:
            probe()
            reached.append(name)
        except OSError:
            pass
        pid = random.randrange(2, 4194304)
        if pid not in mine:
            try:
                os.kill(pid, 0)
                reached.append(f"pid {{pid}}")
            except OSError:
                pass
    print(json.dumps({{"reached": reached}}))
"""


async def test_s13_two_sessions_cannot_reach_each_other(sandbox: CodeSessions, code_root: Path) -> None:
    a_code = "echo a-secret > a-secret.txt\nsleep 1.5\ncat a-secret.txt"
    a_task = asyncio.create_task(run(sandbox, "bash", a_code, run_id=f"{RUN}-a"))
    deadline = time.monotonic() + 2
    while time.monotonic() < deadline and not (pids := [pid for pid, name in sandbox_processes() if name == "sleep"]):
        await asyncio.sleep(0.02)
    assert pids
    a_workspace = next(code_root.glob(f"{RUN}-a-*/workspace"))
    probes = CROSS_PROBES.format(target_dir=str(a_workspace), target_pids=pids)
    b_result = await run(sandbox, "python", probes, run_id=f"{RUN}-b")
    a_result = await a_task
    assert outcomes(b_result) == {"reached": []}
    assert (a_result.exit_code, a_result.stdout) == (0, "a-secret\n")
    await sandbox.release(f"{RUN}-a")
    await sandbox.release(f"{RUN}-b")
    assert not list(code_root.glob(f"{RUN}-a-*"))


# --- S14 the host path of the session ---------------------------------------------------------------

HOST_PATH_HUNT = """
import glob, os
seen = []

def read(path):
    try:
        with open(path, "rb") as f:
            seen.append(f.read().decode("utf-8", "replace"))
    except OSError as exc:
        seen.append(f"{{path}}: {{exc}}")

def link(path):
    try:
        seen.append(os.readlink(path))
    except OSError as exc:
        seen.append(f"{{path}}: {{exc}}")

procs = glob.glob("/proc/[0-9]*") + ["/proc/self", "/proc/thread-self"]
for proc in procs:
    for name in ("cmdline", "environ", "mountinfo", "mounts", "mountstats", "maps", "stat", "status"):
        read(f"{{proc}}/{{name}}")
    for name in ("cwd", "root", "exe"):
        link(f"{{proc}}/{{name}}")
    for fd in glob.glob(f"{{proc}}/fd/*"):
        link(fd)
        read(fd) if "memfd" in (os.readlink(fd) if os.path.islink(fd) else "") else None
seen += [os.getcwd(), repr(dict(os.environ)), repr(os.listdir("/"))]
try:
    open("/workspace/../../escape-probe", "w")
except OSError as exc:
    seen.append(str(exc))
print("\\n".join(seen))
mine = [line for line in open("/proc/self/mountinfo").read().splitlines() if line.split(" ")[4] == "/workspace"]
print(json.dumps({{"workspace_mounts": [line.split(" ")[3] for line in mine]}}))
"""


async def test_s14_code_never_learns_the_host_path_of_its_session(sandbox: CodeSessions, code_root: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("only as root may the service give each workspace a filesystem of its own")
    result = await run(sandbox, "python", "import json\n" + HOST_PATH_HUNT.format())
    shell = await run(sandbox, "bash", "cat /proc/*/cmdline /proc/*/mountinfo; env; pwd; cd ..; pwd; ls -la /proc/1/fd")
    [session] = [p for p in code_root.iterdir() if p.name.startswith(RUN)]
    everything = result.stdout + result.stderr + shell.stdout + shell.stderr
    for host in (str(code_root), session.name, str(code_root.parent)):
        assert host not in everything, (host, [line for line in everything.splitlines() if host in line][:5])
    # /workspace is a filesystem of its own: its root is `/`, not a directory somewhere on the host.
    assert outcomes(result) == {"workspace_mounts": ["/"]}
