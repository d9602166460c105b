"""`atmosphere new <dir>`: a starter project with one agent, its in-process test and a README.

The agent and the test are the ones of the repository README's "Your own project" (a test keeps
them equal), so the starter and the documentation cannot tell two different stories.
"""

from __future__ import annotations

import keyword
import re
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
from atmosphere.sdk.testing import ScriptedModel, Turn, run_agent
from {package}.agents import app


def test_the_counter_calls_its_tool() -> None:
    model = ScriptedModel(Turn.tool_call("word_count", text="one two three"), Turn.text("Three words."))
    result = run_agent(app, "counter", "How many words in 'one two three'?", model=model)
    assert result.completed
    assert result.tool_results() == {{"word_count": "3"}}
    assert result.text == "Three words."
"""

README = """\
# {name}

An Atmosphere app: the `counter` agent in `{package}/agents.py`, with one tool.

Test it in-process (no NATS, no services, a scripted model):

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


def starter_files(directory: Path, package: str) -> dict[Path, str]:
    """Each file of the starter project and its text."""
    return {
        directory / package / "__init__.py": "",
        directory / package / "agents.py": AGENTS.format(package=package),
        directory / "tests" / "test_agents.py": TEST.format(package=package),
        directory / "README.md": README.format(name=directory.resolve().name, package=package),
    }


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
