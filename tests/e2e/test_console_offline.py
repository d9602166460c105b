"""The console in a network namespace closed to everything but loopback (`unshare --net`).

The stack (`atmosphere dev`) and the browser both run inside it, so a request to a CDN, a font or
a beacon would not merely be recorded: it would fail, and `console_offline.py` fails on any
failed request.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from .conftest import ROOT
from .test_console import ARTIFACTS, chromium


def test_the_console_works_with_the_network_closed() -> None:
    probe = subprocess.run(["unshare", "--net", "true"], capture_output=True, text=True, check=False)
    if probe.returncode != 0:
        pytest.skip(f"this machine cannot make a network namespace (unshare --net): {probe.stderr.strip()}")
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    result = subprocess.run(
        ["unshare", "--net", sys.executable, "-m", "tests.e2e.console_offline", chromium(), str(ARTIFACTS)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=170,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "the console worked with the network closed" in result.stdout
