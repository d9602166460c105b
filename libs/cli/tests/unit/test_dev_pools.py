"""`atmosphere dev` runs a dispatch process per runtime pool the app pins agents to."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import pytest

from atmosphere.cli.app_check import POOLS_LINE, main
from atmosphere.cli.dev import DevOptions, child_specs
from atmosphere.cli.dev_layout import dev_layout


def options(home: Path, **changes: object) -> DevOptions:
    base = DevOptions(app="examples.echo:app", home=home, probe_base_port=6400, grpc_port=6500, no_model=True)
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]


def test_one_dispatch_per_pool_beside_the_default_one(tmp_path: Path) -> None:
    specs = {s.name: s for s in child_specs(options(tmp_path, pools=("langchain", "pydantic-ai")))}
    dispatches = [name for name in specs if name.startswith("dispatch")]
    assert dispatches == ["dispatch", "dispatch-langchain", "dispatch-pydantic-ai"]
    assert [specs[n].env["ATMOSPHERE_DISPATCH__POOL"] for n in dispatches] == ["", "langchain", "pydantic-ai"]
    for name in dispatches:
        assert specs[name].argv[1:] == ["-m", "atmosphere.dispatch"]
        assert specs[name].env["ATMOSPHERE_DISPATCH__RUNTIME"] == "built-in"
    # Every child (the provisioner first) knows every pool: each pool's queue is made.
    assert {s.env.get("ATMOSPHERE_DISPATCH__POOLS") for s in specs.values() if s.env} == {"langchain,pydantic-ai"}
    # The pools' probes follow every other worker's; their gRPC port is picked when they start.
    probes = {p.name: p.probe_port for p in dev_layout(options(tmp_path, pools=("langchain", "pydantic-ai"))).processes}
    assert (probes["dispatch-langchain"], probes["dispatch-pydantic-ai"]) == (6405, 6406)
    assert len(set(probes.values()) - {0}) == len(probes) - 1  # ingress has none; no two share one
    assert specs["dispatch-langchain"].env["ATMOSPHERE_DISPATCH__GRPC_PORT"] == "0"


def test_a_pool_runs_on_the_interpreter_asked_for(tmp_path: Path) -> None:
    pinned = str(tmp_path / "pinned" / "bin" / "python")
    asked = options(tmp_path, pools=("crewai", "langchain"), pool_python=(("crewai", pinned),))
    specs = {s.name: s for s in child_specs(asked)}
    assert specs["dispatch-crewai"].argv == [pinned, "-m", "atmosphere.dispatch"]
    # Every other process, the default pool's dispatch too, stays on this one.
    assert {s.argv[0] for n, s in specs.items() if n != "dispatch-crewai" and s.argv[0].endswith("python")} <= {
        sys.executable
    }
    assert specs["dispatch-langchain"].argv[0] == sys.executable


def test_without_pools_the_stack_is_unchanged(tmp_path: Path) -> None:
    names = [s.name for s in child_specs(options(tmp_path))]
    assert [n for n in names if n.startswith("dispatch")] == ["dispatch"]


def test_the_default_pools_runtime_is_the_one_asked_for(tmp_path: Path) -> None:
    specs = {s.name: s for s in child_specs(options(tmp_path, default_runtime="auto"))}
    assert specs["dispatch"].env["ATMOSPHERE_DISPATCH__RUNTIME"] == "auto"


def test_the_app_check_lists_the_apps_pools(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    (tmp_path / "pools_app.py").write_text(
        "from atmosphere.sdk import App, agent\n"
        "@agent(name='a', runtime='langchain')\nclass A: ...\n"
        "@agent(name='b')\nclass B: ...\n"
        "@agent(name='c', runtime='anthropic')\nclass C: ...\n"
        "app = App(agents=[A, B, C])\n"
    )
    assert main(["pools_app:app", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert f"{POOLS_LINE}anthropic,langchain" in out.splitlines()
