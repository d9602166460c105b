"""`code_exec`: bash, python and javascript run in an isolated sandbox, one per run.

`probe` says whether and where code can run (`Availability.label`: `ACTIVE(bwrap)`,
`INACTIVE(disabled)`...); `make_backend` builds that backend; `CodeSessions` keeps a sandbox per
run; `code_exec_descriptor` and `run_code_exec` are the tool as the model sees it.
"""

from __future__ import annotations

from pathlib import Path

from atmosphere.sandbox.code.availability import Availability, probe
from atmosphere.sandbox.code.bwrap import BwrapBackend
from atmosphere.sandbox.code.container import ContainerBackend
from atmosphere.sandbox.code.results import Artifact, Backend, ExecResult, Language, SessionUnavailableError
from atmosphere.sandbox.code.sessions import CodeSessions
from atmosphere.sandbox.code.settings import CodeSettings
from atmosphere.sandbox.code.tool import CODE_EXEC_TOOL, code_exec_descriptor, run_code_exec


def make_backend(settings: CodeSettings, availability: Availability, root: Path) -> Backend:
    """The backend `availability` (an active `probe` answer) names; bwrap workspaces go under `root`.

    Raises:
        ValueError: `availability` is inactive, or the bwrap backend cannot use `root`.
    """
    if not availability.active:
        msg = f"code_exec is {availability.label}"
        raise ValueError(msg)
    if availability.backend == "bwrap":
        return BwrapBackend(settings, root)
    return ContainerBackend(availability.backend, settings)


__all__ = [
    "CODE_EXEC_TOOL",
    "Artifact",
    "Availability",
    "Backend",
    "BwrapBackend",
    "CodeSessions",
    "CodeSettings",
    "ContainerBackend",
    "ExecResult",
    "Language",
    "SessionUnavailableError",
    "code_exec_descriptor",
    "make_backend",
    "probe",
    "run_code_exec",
]
