"""Dispatch finds the runtime through its entry point, in a fresh interpreter, without importing LlamaIndex."""

from __future__ import annotations

import json
import subprocess
import sys

PROBE = """
import json, sys
from atmosphere.sdk.runtime import RuntimeConfig, discover_runtimes
[runtime] = [r for r in discover_runtimes(RuntimeConfig(base_url="http://127.0.0.1:1/v1")) if r.name == "llamaindex"]
print(json.dumps({
    "type": type(runtime).__qualname__,
    "available": runtime.is_available(),
    "hosts_anything": runtime.hosts(object()),
    "loaded": sorted(sys.modules),
}))
"""


def test_the_entry_point_registers_the_runtime_and_imports_no_framework() -> None:
    # A fresh interpreter: this one may have imported LlamaIndex for other tests.
    probe = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, check=True, timeout=60)
    found = json.loads(probe.stdout)
    assert (found["type"], found["available"], found["hosts_anything"]) == ("LlamaIndexAgentRuntime", True, False)
    frameworks = [m for m in found["loaded"] if m.split(".")[0] in {"llama_index", "workflows", "openai"}]
    assert frameworks == []
