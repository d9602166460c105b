"""What CrewAI may do in a platform process: no telemetry, no tracing, nothing written to the home.

CrewAI reads these variables when it acts (not once at import), so setting them when the runtime
is created is enough for everything its runs do:

- `CREWAI_DISABLE_TELEMETRY=true`: CrewAI's anonymous usage telemetry (OpenTelemetry spans sent to
  CrewAI's collector) is off (`crewai_core.telemetry.Telemetry._is_telemetry_disabled`).
- `CREWAI_TRACING_ENABLED=false`: CrewAI's execution tracing to its cloud, and its first-run
  consent prompt, are off (`crewai.events.listeners.tracing.utils.should_enable_tracing`: an
  explicit no). Every crew the runtime runs is also built with `tracing=False`.
- `CREWAI_STORAGE_DIR=<temp dir>/atmosphere-crewai`: every `Crew` opens a SQLite file of its
  last kickoff's task outputs (and memory, knowledge and flow state go there too) under
  `appdirs.user_data_dir(CREWAI_STORAGE_DIR)`, i.e. `~/.local/share/<working directory name>`;
  an absolute path puts it there instead.

Each is a default: a value the operator set is kept. `OTEL_SDK_DISABLED` is not set, although
CrewAI honours it too: it switches off the OpenTelemetry SDK of the whole process, the
platform's own tracing included.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

STORAGE_DIRECTORY = "atmosphere-crewai"


def keep_crewai_local() -> None:
    """Set CrewAI's telemetry, tracing and storage defaults in this process (see the module)."""
    os.environ.setdefault("CREWAI_DISABLE_TELEMETRY", "true")
    os.environ.setdefault("CREWAI_TRACING_ENABLED", "false")
    os.environ.setdefault("CREWAI_STORAGE_DIR", str(Path(tempfile.gettempdir()) / STORAGE_DIRECTORY))
