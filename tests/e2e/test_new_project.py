"""`atmosphere new` outside the repository: its own test passes, its wheel installs and `atmosphere dev` serves it.

What the image of the project does (README.md, "Deploy your own agents"), on this machine: the
project is written into an empty directory, its test runs, its wheel is built with pip (as its
README says) and installed into a directory of its own, and the project's source is deleted, so
the services can only import the app from the installed wheel. `atmosphere dev` (this
workspace's: it holds the platform the image would) then serves the app, each service importing
it as in a container, and the agent answers over a WebSocket with its tool's result.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import ROOT
from .dev_process import serves_the_counter

pytestmark = pytest.mark.timeout(180)

APP = "my_agents.agents:app"


def clean_env() -> dict[str, str]:
    """This environment without the outer test run's or the stack's own settings."""
    dropped = ("ATMOSPHERE_", "LLM_", "PYTEST_", "PYTHONPATH", "VIRTUAL_ENV")
    return {k: v for k, v in os.environ.items() if not k.startswith(dropped)}


def run(argv: list[str], *, cwd: Path, env: dict[str, str], timeout: float = 120) -> str:
    done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False)
    assert done.returncode == 0, f"{argv}\n--- exit {done.returncode}\n{done.stdout}\n{done.stderr}"
    return done.stdout


def build_and_install(project: Path, site: Path, env: dict[str, str]) -> Path:
    """The project's wheel, built as its README says (pip, setuptools from PyPI), installed into `site`."""
    # A virtualenv of its own, with pip (ensurepip, offline): the `python3.11` first on PATH may be
    # a uv-made one without pip (`make test` runs inside this workspace's virtualenv).
    builder = project.parent / "builder"
    run([sys.executable, "-m", "venv", str(builder)], cwd=project, env=env)
    python = str(builder / "bin" / "python")
    quiet = ["--disable-pip-version-check", "-q"]
    run([python, "-m", "pip", "wheel", *quiet, "--no-deps", "-w", "dist", "."], cwd=project, env=env)
    [wheel] = (project / "dist").glob("my_agents-0.1.0-*.whl")
    run([python, "-m", "pip", "install", *quiet, "--no-deps", "--target", str(site), str(wheel)], cwd=project, env=env)
    return wheel


async def test_a_new_project_outside_the_repository_is_tested_built_and_served_from_its_wheel(tmp_path: Path) -> None:
    assert not tmp_path.is_relative_to(ROOT)
    env = {**clean_env(), "PIP_ROOT_USER_ACTION": "ignore"}
    atmosphere = str(Path(sys.executable).parent / "atmosphere")

    # Written into an empty directory; its own test passes on this workspace's test kit.
    run([atmosphere, "new", "my-agents"], cwd=tmp_path, env=env)
    project = tmp_path / "my-agents"
    assert "1 passed" in run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"], cwd=project, env=env)

    # Its wheel, installed on its own; the source goes, so nothing can import the app from it.
    site = tmp_path / "site"
    build_and_install(project, site, env)
    shutil.rmtree(project / "my_agents")
    elsewhere = tmp_path / "run"
    elsewhere.mkdir()
    served = {**env, "PYTHONPATH": str(site)}
    where = run([sys.executable, "-c", "import my_agents.agents as m; print(m.__file__)"], cwd=elsewhere, env=served)
    assert Path(where.strip()).is_relative_to(site), where

    # Served by `atmosphere dev` from a directory that holds nothing of it: every service imports
    # the installed app; a scripted model calls the project's tool.
    argv = [atmosphere, "dev", "--app", APP, "--app-dir", str(elsewhere), "--home", str(tmp_path / "home")]
    await serves_the_counter(argv, cwd=elsewhere, env=served, log=tmp_path / "dev.log")
