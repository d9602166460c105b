"""A user's own project, as the guide docs/your-own-project.md says: install, write, test, serve.

The commands and files come from the guide itself (between `<!-- own-project:* -->` markers),
so it cannot drift from what works: a missing block fails this test, never skips it. They run
in a shell as a fresh machine's: Python, make and pip, no uv on `PATH` and none of this
workspace's virtualenv. The only changes made to them: `/path/to/atmosphere` and `~/myproject`
become this checkout and a temporary directory, the `LLM_BASE_URL` of the serve line points at a
scripted provider, and `atmosphere dev` gets free ports (a test cannot rely on 8080 being free).
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import ROOT
from .dev_process import port_args, serves_the_counter, started

pytestmark = pytest.mark.timeout(240)

GUIDE = ROOT / "docs" / "your-own-project.md"


def guide_block(name: str) -> tuple[str, str]:
    """The (language, text) of the fenced block between the `own-project:<name>` markers."""
    found = re.search(
        rf"<!-- own-project:{name} -->\s*```(\w+)\n(.*?)```\s*<!-- /own-project:{name} -->",
        GUIDE.read_text(),
        re.DOTALL,
    )
    assert found, f"docs/your-own-project.md has no own-project:{name} block"
    return found[1], found[2]


def guide_file(name: str, project: Path) -> Path:
    """Write the guide's file block `name` where its first line (`# path`) says."""
    _, text = guide_block(name)
    first = text.split("\n", 1)[0]
    assert first.startswith("# "), f"the own-project:{name} block must start with '# <path>'"
    path = project / first[2:].strip()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def user_env() -> dict[str, str]:
    """A shell as a fresh machine's: no uv on PATH, none of this workspace's virtualenv."""
    env = {k: v for k, v in os.environ.items() if k not in {"VIRTUAL_ENV", "PYTHONPATH", "UV_PROJECT_ENVIRONMENT"}}
    venv_bin = str(Path(sys.executable).parent)
    path = [d for d in env.get("PATH", "").split(os.pathsep) if d and d != venv_bin]
    # A directory that holds uv leaves PATH unless it also holds the system's Python (then uv stays
    # reachable there, as on a machine that has both; the guide never calls a bare `uv` anyway).
    env["PATH"] = os.pathsep.join(d for d in path if not (Path(d) / "uv").exists() or (Path(d) / "python3").exists())
    return env


def run_bash(script: str, *, cwd: Path, env: dict[str, str], timeout: float) -> str:
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert done.returncode == 0, f"{script}\n--- exit {done.returncode}\n{done.stdout}\n{done.stderr}"
    return done.stdout


async def test_a_fresh_virtualenv_installs_tests_and_serves_the_guide_agent(tmp_path: Path) -> None:
    project = tmp_path / "myproject"
    env = user_env()
    assert shutil.which("python3.11", path=env["PATH"]), "the guide's install block needs python3.11 on PATH"

    # Install: build the wheels here, a virtualenv outside the repository, exactly the guide's commands.
    lang, install = guide_block("install")
    assert lang == "bash"
    script = install.replace("/path/to/atmosphere", shlex.quote(str(ROOT))).replace("~/myproject", str(project))
    run_bash(script, cwd=tmp_path, env=env, timeout=180)
    # Installed, not linked: the SDK the project imports lives in the project's own virtualenv.
    where = run_bash(
        ".venv/bin/python -c 'import atmosphere.sdk; print(atmosphere.sdk.__file__)'", cwd=project, env=env, timeout=60
    )
    assert Path(where.strip()).is_relative_to(project / ".venv"), where

    # Write: the one-tool agent and its in-process test; run that test in the user's venv.
    guide_file("agent", project)
    guide_file("test", project)
    _, run_test = guide_block("run-test")
    assert "1 passed" in run_bash(run_test, cwd=project, env=env, timeout=120)

    # Serve: the guide's line, with a scripted model that calls the tool.
    _, serve = guide_block("serve")
    words = shlex.split(serve.strip())
    assignments = {w.split("=", 1)[0]: w.split("=", 1)[1] for w in words if re.fullmatch(r"[A-Z_]+=.*", w)}
    command = [w for w in words if not re.fullmatch(r"[A-Z_]+=.*", w)]
    assert "LLM_BASE_URL" in assignments, serve
    assert command[:4] == [".venv/bin/atmosphere", "dev", "--app", "mypkg.agents:app"], serve
    env = {**env, **assignments}
    await serves_the_counter(command, cwd=project, env=env, log=tmp_path / "dev.log")


def test_an_app_that_does_not_import_stops_atmosphere_dev_at_once(tmp_path: Path) -> None:
    atmosphere = str(Path(sys.executable).parent / "atmosphere")
    done = subprocess.run(
        [atmosphere, "dev", "--app", "does.not:exist", *port_args(), "--no-model"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=30,  # the bound: no restart loop, no 60 s readiness wait
        check=False,
    )
    assert done.returncode != 0
    assert "No module named 'does'" in done.stderr
    assert "ATMOSPHERE_APP='does.not:exist'" in done.stderr
    assert "restarting" not in done.stdout


def test_a_service_that_cannot_load_the_app_stops_the_stack_instead_of_restarting(tmp_path: Path) -> None:
    # Imports in `atmosphere dev`'s own check, fails in the services (they get a probe port): the
    # second line of defence, the services' exit code 4, must stop the stack just the same.
    (tmp_path / "p_only_in_dev.py").write_text(
        "import os\n"
        "from atmosphere.sdk import App\n"
        "if os.environ.get('ATMOSPHERE_PROBE_PORT'):\n"
        "    raise RuntimeError('the weather API key is missing')\n"
        "app = App()\n"
    )
    atmosphere = str(Path(sys.executable).parent / "atmosphere")
    log = tmp_path / "dev.log"
    env = {k: v for k, v in os.environ.items() if k != "ATMOSPHERE_PROBE_PORT"}
    argv = [
        atmosphere,
        "dev",
        "--app",
        "p_only_in_dev:app",
        "--home",
        str(tmp_path / "home"),
        *port_args(),
        "--no-model",
    ]
    with started(argv, cwd=tmp_path, env=env, log=log) as process:
        assert process.wait(90) == 1, log.read_text()
    output = log.read_text()
    assert "RuntimeError: the weather API key is missing" in output
    assert "not restarting" in output
    assert "restarting in" not in output, output
