"""Build the Kubernetes overlays with the real kustomize, in a copy that holds throwaway credentials.

The overlays generate their NATS Secrets from `credentials/`, which the user writes with
`atmosphere bus-credentials` and git ignores; a checkout has none. A build check therefore copies
`deploy/k8s` (leaving any real credentials behind: they are never read) and writes fresh ones
into the copy with the same generator, which are thrown away with it.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

from atmosphere.bus.permissions import AUTH_CONFIG_FILE, Role, write_credentials
from scripts.install_kubectl import kubectl_binary
from scripts.strict_yaml import Document, strict_load_all

ROOT = Path(__file__).resolve().parent.parent
K8S = ROOT / "deploy" / "k8s"
BASE = K8S / "base"
OVERLAYS = ("dev", "production")
SERVICES = ("governance", "memory", "tape", "sandbox", "dispatch", "ingress")
POOLS = (
    "langchain",
    "langgraph",
    "pydantic-ai",
    "openai-agents",
    "anthropic",
    "cohere",
    "adk",
    "agentscope",
    "crewai",
    "semantic-kernel",
    "llamaindex",
)
"""The runtime pools both overlays deploy (`components/pool-<runtime>`) and compose runs: one per adapter."""
COMPONENTS = K8S / "components"
ROLES = tuple(str(role) for role in Role)
"""The roles `atmosphere bus-credentials` writes a `<role>.env` for: the services, `observer`, `provisioner`."""
CREDENTIALS = "credentials"
AUTH_FILE = AUTH_CONFIG_FILE


class BuildError(RuntimeError):
    """kustomize refused to build a directory."""


def kustomize(directory: Path) -> subprocess.CompletedProcess[str]:
    """`kubectl kustomize directory`, with the pinned kubectl; the caller reads the exit code."""
    command = [str(kubectl_binary()), "kustomize", str(directory)]
    return subprocess.run(command, check=False, capture_output=True, text=True, timeout=50)


def build(directory: Path) -> list[Document]:
    """The objects `directory` renders to, read strictly."""
    result = kustomize(directory)
    if result.returncode != 0:
        msg = f"kustomize {directory} failed:\n{result.stderr}"
        raise BuildError(msg)
    return strict_load_all(result.stdout)


@contextlib.contextmanager
def staged_copy() -> Iterator[Path]:
    """A temporary copy of `deploy/k8s` whose overlays have throwaway credentials; removed after."""
    with tempfile.TemporaryDirectory(prefix="atmosphere-k8s-") as scratch:
        copy = Path(scratch) / "k8s"
        shutil.copytree(K8S, copy, ignore=shutil.ignore_patterns(CREDENTIALS))
        for overlay in OVERLAYS:
            # What `atmosphere bus-credentials --out DIR` writes, with fresh passwords.
            write_credentials(copy / "overlays" / overlay / CREDENTIALS)
        yield copy


def render_overlays() -> dict[str, list[Document]]:
    """What each overlay renders to, with throwaway credentials."""
    with staged_copy() as copy:
        return {overlay: build(copy / "overlays" / overlay) for overlay in OVERLAYS}
