"""What one execution comes to, and the interface every sandbox backend offers."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Protocol

Language = Literal["bash", "python", "javascript"]
"""The languages `code_exec` runs (the model's other spellings are mapped onto these)."""

Limit = Literal["memory", "pids", "output", "timeout", "workspace"]
"""What stopped an execution: its memory, its process count, an output stream over the cap, the
wall-clock timeout, or its workspace over its disk budget."""


class SessionUnavailableError(Exception):
    """No sandbox for this session: the backend failed to start one, or too many are alive."""


@dataclass(frozen=True, slots=True)
class Artifact:
    """A file the code left in `/workspace/artifacts`, read safely by the host."""

    name: str
    mime_type: str
    data: bytes

    @property
    def is_image(self) -> bool:
        """Shown inline (a data URI) rather than offered as a file."""
        return self.mime_type.startswith("image/")


@dataclass(frozen=True, slots=True)
class ExecResult:
    """The outcome of one execution: its exit code, its (capped, cleaned) output and what stopped it."""

    exit_code: int
    stdout: str
    stderr: str
    truncated: bool = False
    timed_out: bool = False
    limit: Limit | None = None
    artifacts: list[Artifact] = field(default_factory=list)
    artifacts_dropped: int = 0
    """Files in `/workspace/artifacts` not returned: over the count or the byte budget, or not regular files."""


class Sandbox(Protocol):
    """One session's sandbox: files persist between its executions, which run one at a time."""

    async def run(self, language: Language, code: str) -> ExecResult:
        """Run `code`, given to the interpreter as a file or on stdin (never on a command line)."""
        ...

    async def close(self) -> None:
        """Kill whatever still runs and remove the sandbox and its files; idempotent."""
        ...


class Backend(Protocol):
    """Makes sandboxes of one kind (bubblewrap, docker, podman)."""

    @property
    def name(self) -> str:
        """`bwrap`, `docker` or `podman`."""
        ...

    def languages(self) -> tuple[Language, ...]:
        """The languages its sandboxes can run."""
        ...

    async def open(self, session_id: str) -> Sandbox:
        """A new sandbox for `session_id` (its setup command, if any, already run).

        Raises:
            SessionUnavailableError: the sandbox could not be made.
        """
        ...
