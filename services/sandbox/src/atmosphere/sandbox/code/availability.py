"""Whether `code_exec` can run here, and on what: decided by starting a sandbox, not by looking for a binary.

`probe` answers once, at start: `ACTIVE(bwrap)`, `ACTIVE(docker)`, or `INACTIVE(<why>)`: `disabled`,
`bubblewrap not installed`, bwrap's own error line (user namespaces off...), `docker: <why>`. With
`engine=auto`, bwrap is tried first, then docker, then podman, and an INACTIVE answer names each.
"""

from __future__ import annotations

from dataclasses import dataclass

from atmosphere.sandbox.code.bwrap import bounds_for, probe_bwrap
from atmosphere.sandbox.code.cgroups import detect
from atmosphere.sandbox.code.container import probe_engine
from atmosphere.sandbox.code.settings import CodeSettings

AUTO_ORDER = ("bwrap", "docker", "podman")


@dataclass(frozen=True, slots=True)
class Availability:
    """Whether code runs here, on which backend, and the detail (why not; or what bounds it)."""

    active: bool
    backend: str
    """`bwrap`, `docker` or `podman` (the one tried, when inactive with one engine; empty otherwise)."""
    reason: str
    """Inactive: why. Active: what bounds code (bwrap: `cgroup v1 (pids, memory, cpu, freezer) + rlimits`
    or `rlimits only (<why no cgroups>)`; docker/podman: `server <version>`)."""

    @property
    def label(self) -> str:
        """`ACTIVE(bwrap)`, `INACTIVE(disabled)`, `INACTIVE(bubblewrap not installed)`..."""
        return f"ACTIVE({self.backend})" if self.active else f"INACTIVE({self.reason})"


async def probe_one(engine: str, settings: CodeSettings, *, bwrap: str | None = None) -> Availability:
    """Whether `engine` (`bwrap`, `docker`, `podman`) starts sandboxes here."""
    if engine == "bwrap":
        ok, why = await probe_bwrap(bwrap)
        if not ok:
            return Availability(False, "bwrap", why)
        return Availability(True, "bwrap", bounds_for(settings, detect()).note)
    ok, why = await probe_engine(engine)
    return Availability(ok, engine, why if ok else f"{engine}: {why}")


async def probe(settings: CodeSettings, *, bwrap: str | None = None) -> Availability:
    """Where `code_exec` runs with `settings`, or why it does not."""
    if not settings.enabled:
        return Availability(False, "", "disabled")
    if settings.engine != "auto":
        return await probe_one(settings.engine, settings, bwrap=bwrap)
    tried = []
    for engine in AUTO_ORDER:
        found = await probe_one(engine, settings, bwrap=bwrap)
        if found.active:
            return found
        tried.append(found.reason if found.reason.startswith(f"{engine}:") else f"{engine}: {found.reason}")
    return Availability(False, "", "no sandbox engine: " + "; ".join(tried))
