"""`atmosphere new <dir>`: a starter project: one agent, its test, a pyproject, a README, a deployment.

The deployment is an image of the project's own, which Atmosphere's compose file and kustomize
base run (`new_templates`). The agent and the test are the ones of the guide
`docs/your-own-project.md` (a test keeps them equal), so the starter and the documentation cannot
tell two different stories.
"""

from __future__ import annotations

import keyword
import re
import sys
from pathlib import Path

from atmosphere.cli.new_templates import DEFAULT_TAG, image_problem, kube_name, template_files

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


def image_name(directory: Path, image: str | None) -> str:
    """`image`, else one named after the directory (`my-agents:0.1.0`), a local name to tag and push."""
    name = image if image is not None else f"{kube_name(directory)}:{DEFAULT_TAG}"
    if problem := image_problem(name):
        raise NewProjectError(problem)
    return name


def starter_files(directory: Path, package: str, image: str) -> dict[Path, str]:
    """Each file of the starter project and its text."""
    return {
        directory / package / "__init__.py": "",
        directory / package / "agents.py": AGENTS.format(package=package),
        directory / "tests" / "test_agents.py": TEST.format(package=package),
        directory / "pyproject.toml": PYPROJECT.format(name=project_name(directory), package=package),
        **template_files(directory, distribution=project_name(directory), package=package, image=image),
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
            "  # deploy it in an image of its own, with docker compose or kubectl: the README's Deploy section",
        ]
    )


def new_project(directory: Path, *, package: str | None = None, image: str | None = None) -> list[Path]:
    """Write the starter project into `directory` (created if needed); never overwrite a file."""
    files = starter_files(directory, package_name(directory, package), image_name(directory, image))
    if existing := [str(path) for path in files if path.exists()]:
        msg = f"not overwriting {', '.join(existing)}"
        raise NewProjectError(msg)
    for path, text in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return list(files)
