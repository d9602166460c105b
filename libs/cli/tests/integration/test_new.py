import importlib.util
import re
import sys
import tomllib
from pathlib import Path

import pytest

from atmosphere.cli.__main__ import main
from atmosphere.cli.new import AGENTS, TEST

# The starter is the project of the guide "Your own project" (its blocks between `own-project` markers).
GUIDE = Path(__file__).resolve().parents[4] / "docs" / "your-own-project.md"


def guide_block(name: str) -> str:
    found = re.search(rf"<!-- own-project:{name} -->\s*```\w+\n(.*?)```", GUIDE.read_text(), re.DOTALL)
    assert found, f"docs/your-own-project.md has no own-project:{name} block"
    return found[1]


def test_the_starter_is_the_guide_project() -> None:
    assert AGENTS.format(package="mypkg") == guide_block("agent")
    assert TEST.format(package="mypkg") == guide_block("test")


def test_new_writes_a_project_whose_own_test_passes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    target = tmp_path / "p-starter-demo"
    assert main(["new", str(target)]) == 0
    assert sorted(p.relative_to(target).as_posix() for p in target.rglob("*") if p.is_file()) == [
        ".dockerignore",
        ".gitignore",
        "Dockerfile",
        "README.md",
        "deploy/compose.env",
        "deploy/k8s/kustomization.yaml",
        "deploy/k8s/namespace.yaml",
        "p_starter_demo/__init__.py",
        "p_starter_demo/agents.py",
        "pyproject.toml",
        "tests/test_agents.py",
    ]
    # Without --image, the image is named after the directory, at the starter's version.
    assert "ATMOSPHERE_IMAGE=p-starter-demo:0.1.0\n" in (target / "deploy" / "compose.env").read_text()
    assert "ATMOSPHERE_APP=p_starter_demo.agents:app " in (target / "Dockerfile").read_text()
    assert "--app p_starter_demo.agents:app" in (target / "README.md").read_text()
    project = tomllib.loads((target / "pyproject.toml").read_text())
    assert project["project"]["name"] == "p-starter-demo"
    assert project["project"]["dependencies"] == ["atmosphere-ai-cli"]
    assert project["tool"]["setuptools"]["packages"] == ["p_starter_demo"]
    printed = capsys.readouterr().out
    assert "wrote" in printed
    # The next steps use the very environment that wrote the project (it holds the platform).
    assert f"{sys.executable} -m pytest -q" in printed
    assert f"{Path(sys.prefix) / 'bin' / 'atmosphere'} dev --app p_starter_demo.agents:app" in printed
    monkeypatch.syspath_prepend(str(target))
    spec = importlib.util.spec_from_file_location("p_starter_demo_test", target / "tests" / "test_agents.py")
    assert spec is not None
    assert spec.loader is not None
    generated = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(generated)
        generated.test_the_counter_calls_its_tool()  # the starter's own test, as pytest would run it
    finally:
        for name in ("p_starter_demo", "p_starter_demo.agents"):
            sys.modules.pop(name, None)


def test_new_never_overwrites_and_refuses_a_bad_package_name(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "README.md").write_text("mine")
    assert main(["new", str(tmp_path), "--package", "demo"]) == 1
    assert "not overwriting" in capsys.readouterr().err
    assert (tmp_path / "README.md").read_text() == "mine"
    assert not (tmp_path / "demo").exists()
    assert main(["new", str(tmp_path / "x"), "--package", "class"]) == 1
    assert "'class' is not a valid Python package name" in capsys.readouterr().err
    assert main(["new", str(tmp_path / "y"), "--image", "Registry/Team:1.2.3"]) == 1
    assert "'Registry/Team:1.2.3' is not an image name" in capsys.readouterr().err
    assert not (tmp_path / "y").exists()
