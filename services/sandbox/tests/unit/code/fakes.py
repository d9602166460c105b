"""A backend that runs nothing: for the session and tool logic, apart from any real sandbox."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from atmosphere.sandbox.code.results import Artifact, ExecResult, Language, SessionUnavailableError


@dataclass
class FakeSandbox:
    session_id: str
    delay: float = 0.0
    result: ExecResult | None = None
    runs: list[tuple[Language, str]] = field(default_factory=list)
    closed: bool = False
    running: int = 0
    most_running: int = 0

    async def run(self, language: Language, code: str) -> ExecResult:
        if self.closed:
            raise SessionUnavailableError("the sandbox was closed")
        self.running += 1
        self.most_running = max(self.most_running, self.running)
        try:
            await asyncio.sleep(self.delay)
            self.runs.append((language, code))
            return self.result or ExecResult(exit_code=0, stdout=f"ran {language}: {code}", stderr="")
        finally:
            self.running -= 1

    async def close(self) -> None:
        self.closed = True


@dataclass
class FakeBackend:
    languages_: tuple[Language, ...] = ("bash", "python", "javascript")
    delay: float = 0.0
    open_delay: float = 0.0
    fail_opens: int = 0
    result: ExecResult | None = None
    opened: list[FakeSandbox] = field(default_factory=list)

    @property
    def name(self) -> str:
        return "fake"

    def languages(self) -> tuple[Language, ...]:
        return self.languages_

    async def open(self, session_id: str) -> FakeSandbox:
        await asyncio.sleep(self.open_delay)
        if self.fail_opens:
            self.fail_opens -= 1
            raise SessionUnavailableError("the fake backend refused")
        sandbox = FakeSandbox(session_id, delay=self.delay, result=self.result)
        self.opened.append(sandbox)
        return sandbox


PNG = (
    b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\x00\x00\x00\x01\x00\x00\x00\x01\x08\x06\x00\x00\x00\x1f\x15\xc4\x89"
    b"\x00\x00\x00\rIDATx\x9cc\xf8\x0f\x00\x00\x01\x01\x00\x05\x18\xd8N\x00\x00\x00\x00IEND\xaeB`\x82"
)
"""A 1x1 PNG."""


def image_and_file() -> list[Artifact]:
    return [Artifact("plot.png", "image/png", PNG), Artifact("data.csv", "text/csv", b"a,b\n1,2\n")]
