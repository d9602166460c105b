"""Loading the CrewAI runtime imports no framework: every dispatch loads every installed runtime when it starts."""

from __future__ import annotations

import subprocess
import sys

PROBE = """
import sys
from atmosphere.sdk.runtime import RuntimeConfig, discover_runtimes
runtimes = discover_runtimes(RuntimeConfig(base_url="http://127.0.0.1:1/v1"), environ={})
assert any(r.name == "crewai" for r in runtimes)
print(sorted(m for m in ("crewai", "openai", "litellm") if m in sys.modules))
"""


def test_loading_it_imports_no_framework() -> None:
    loaded = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, check=True, timeout=60)
    assert loaded.stdout.strip() == "[]"
