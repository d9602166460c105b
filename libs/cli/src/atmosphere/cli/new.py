"""`atmosphere new <dir>`: a starter project with one agent, its in-process test, a pyproject and a README.

The agent and the test are the ones of the guide `docs/your-own-project.md` (a test keeps them
equal), so the starter and the documentation cannot tell two different stories.
"""

from __future__ import annotations

import keyword
import re
import sys
from pathlib import Path

AGENTS = '''\
# {package}/agents.py
from atmosphere.sdk import App, agent, tool


@tool
def word_count(text: str) -> int:
    """Count the words in a text.

    Args:
        text: The text to count.
    """
    return len(text.split())


@agent(name="counter", system_prompt="Count words with the word_count tool.", tools=[word_count])
class Counter:
    """Each prompt goes to the model, which calls word_count."""


app = App(agents=[Counter])
'''

TEST = """\
# tests/test_agents.py
from atmosphere.testing import ScriptedModel, Turn, run_agent
from {package}.agents import app


def test_the_counter_calls_its_tool() -> None:
    model = ScriptedModel(Turn.tool_call("word_count", text="one two three"), Turn.text("Three words."))
    result = run_agent(app, "counter", "How many words in 'one two three'?", model=model)
    assert result.completed
    assert result.tool_results() == {{"word_count": "3"}}
    assert result.text == "Three words."
"""

PYPROJECT = """\
[project]
name = "{name}"
version = "0.1.0"
description = "Agents served by Atmosphere."
requires-python = ">=3.11"
# The SDK, the six services and the `atmosphere` command.
dependencies = ["atmosphere-ai-cli"]

[project.optional-dependencies]
# The agent test kit (`atmosphere.testing`), which brings pytest.
test = ["atmosphere-ai-testing"]

[build-system]
requires = ["setuptools>=68"]
build-backend = "setuptools.build_meta"

[tool.setuptools]
packages = ["{package}"]

[tool.pytest.ini_options]
# The tests import `{package}` from the project directory, installed or not.
pythonpath = ["."]
testpaths = ["tests"]
"""

README = """\
# {name}

An Atmosphere app: the `counter` agent in `{package}/agents.py`, with one tool.

Install it into a virtualenv that has the Atmosphere distributions (`atmosphere-ai-*`: built into
`dist/` of an Atmosphere checkout, see its `docs/your-own-project.md`):

    python3.11 -m venv .venv
    .venv/bin/pip install --find-links /path/to/atmosphere/dist -e '.[test]'

Test it on the platform's own services, inside the test's process (no NATS, a scripted model):

    .venv/bin/python -m pytest -q tests

Serve it (tool calls need a model that supports them, behind any OpenAI-compatible API):

    LLM_BASE_URL=https://api.openai.com/v1 LLM_MODEL=gpt-4o-mini LLM_API_KEY=sk-... \\
      .venv/bin/atmosphere dev --app {package}.agents:app

then talk to `ws://127.0.0.1:8080/atmosphere/agent/counter`.
"""


class NewProjectError(ValueError):
    """The starter project cannot be written as asked."""


def package_name(directory: Path, package: str | None) -> str:
    """`package`, else the directory's name made an identifier (`my-agents` → `my_agents`)."""
    name = package if package is not None else re.sub(r"\W", "_", directory.resolve().name.lower())
    if not name.isidentifier() or keyword.iskeyword(name):
        msg = f"{name!r} is not a valid Python package name; choose one with --package"
        raise NewProjectError(msg)
    return name


def project_name(directory: Path) -> str:
    """A distribution name from the directory's name (PEP 508: letters, digits, `-`, `_`, `.`)."""
    name = re.sub(r"[^A-Za-z0-9._-]+", "-", directory.resolve().name).strip("-._")
    return name or "atmosphere-agents"


def starter_files(directory: Path, package: str) -> dict[Path, str]:
    """Each file of the starter project and its text."""
    return {
        directory / package / "__init__.py": "",
        directory / package / "agents.py": AGENTS.format(package=package),
        directory / "tests" / "test_agents.py": TEST.format(package=package),
        directory / "pyproject.toml": PYPROJECT.format(name=project_name(directory), package=package),
        directory / "README.md": README.format(name=directory.resolve().name, package=package),
    }


def next_steps(directory: Path, package: str) -> str:
    """What to run next, with the interpreter and `atmosphere` of the environment that wrote it.

    That environment already holds the platform (it ran `atmosphere new`), so its own commands
    work as printed; the test kit (`atmosphere-ai-testing`, with pytest) may still be missing from
    it, and the hint says how to add it.
    """
    python = sys.executable
    atmosphere = Path(sys.prefix) / "bin" / "atmosphere"
    return "\n".join(
        [
            "",
            "Next steps:",
            f"  cd {directory}",
            f"  {python} -m pytest -q            # its test (it needs the test kit and pytest: "
            f"{python} -m pip install atmosphere-ai-testing)",
            "  # serve it (tool calls need a model that supports them, behind any OpenAI-compatible API):",
            f"  LLM_BASE_URL=https://api.openai.com/v1 LLM_MODEL=gpt-4o-mini LLM_API_KEY=sk-... "
            f"{atmosphere} dev --app {package}.agents:app",
            f"  # then talk to ws://127.0.0.1:8080/atmosphere/agent/counter; the guide: {directory / 'README.md'}",
        ]
    )


def new_project(directory: Path, *, package: str | None = None) -> list[Path]:
    """Write the starter project into `directory` (created if needed); never overwrite a file."""
    files = starter_files(directory, package_name(directory, package))
    if existing := [str(path) for path in files if path.exists()]:
        msg = f"not overwriting {', '.join(existing)}"
        raise NewProjectError(msg)
    for path, text in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return list(files)
