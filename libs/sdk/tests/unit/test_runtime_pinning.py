"""Pinning agents to a runtime (`@agent(runtime=...)`), hosting framework objects, and an app's pools."""

from __future__ import annotations

from typing import Any

import pytest

from atmosphere.sdk import App, UserError, agent, coordinator, hosted_agent, tool
from atmosphere.sdk import _hosted as hosted_module
from atmosphere.sdk.host import spec_of


@tool
def lookup(city: str) -> str:
    """Look a city up."""
    return city


@agent(name="plain", tools=[lookup])
class Plain:
    """Pinned to nothing."""


@agent(name="chained", runtime="langchain")
class Chained:
    """Pinned to LangChain."""


@coordinator(name="lead", fleet=[Plain, Chained], runtime="pydantic-ai")
class Lead:
    """Delegates across pools."""


def test_an_agent_pinned_to_a_runtime_is_in_that_runtimes_pool() -> None:
    assert (spec_of(Plain).runtime, spec_of(Plain).pool) == ("", "")
    assert (spec_of(Chained).runtime, spec_of(Chained).pool) == ("langchain", "langchain")


@pytest.mark.parametrize("name", ["LangChain", "lang.chain", "a b", "*", ">", "-x", "x" * 33])
def test_a_runtime_name_must_be_a_safe_lower_case_token(name: str) -> None:
    with pytest.raises(UserError, match="runtime"):

        @agent(name="bad", runtime=name)
        class Bad: ...


def test_an_app_lists_its_pools_and_each_pool_serves_only_its_agents() -> None:
    app = App(agents=[Plain, Chained, Lead])
    assert app.pools == ("langchain", "pydantic-ai")
    assert list(app.served_by("").agents) == ["plain"]
    assert list(app.served_by("langchain").agents) == ["chained"]
    # The coordinator's fleet is in other pools: it is served all the same, its fleet by theirs.
    lead_pool = app.served_by("pydantic-ai")
    assert list(lead_pool.agents) == ["lead"]
    assert lead_pool.tools == {}
    assert app.served_by("").tools == {"lookup": lookup}
    assert list(app.served_by("anthropic").agents) == []
    assert app.policies == lead_pool.policies


class Graph:
    """Stands in for a framework object: only its type matters to the runtimes' `hosts`."""


class _Hosts:
    name = "graphs"

    @classmethod
    def hosts(cls, native: object) -> bool:
        return isinstance(native, Graph)


class _HostsNothing:
    name = "other"

    @classmethod
    def hosts(cls, native: object) -> bool:
        del native
        return False


class _Entry:
    def __init__(self, name: str, loaded: Any) -> None:
        self.name = name
        self._loaded = loaded

    def load(self) -> Any:
        return self._loaded


def installed(monkeypatch: pytest.MonkeyPatch, *runtimes: tuple[str, Any]) -> None:
    """Pretend these runtimes are the installed entry points (third-party plugins: not ours to run here)."""
    entries = [_Entry(name, cls) for name, cls in runtimes]
    monkeypatch.setattr(hosted_module, "entry_points", lambda group: entries if group == "atmosphere.runtimes" else [])


def test_a_hosted_object_is_run_by_the_runtime_that_hosts_it(monkeypatch: pytest.MonkeyPatch) -> None:
    installed(monkeypatch, ("graphs", _Hosts), ("other", _HostsNothing))
    graph = Graph()
    spec = spec_of(hosted_agent("research", graph))
    assert (spec.name, spec.path, spec.runtime, spec.native) == (
        "research",
        "/atmosphere/agent/research",
        "graphs",
        graph,
    )
    assert spec.description == "Graph hosted as research"
    assert [h.value for h in spec.harness] == ["memory"]
    # Registered like any agent, in its runtime's pool.
    assert App(agents=[Plain, hosted_agent("research", graph)]).pools == ("graphs",)


def test_naming_the_runtime_skips_the_search(monkeypatch: pytest.MonkeyPatch) -> None:
    installed(monkeypatch)
    spec = spec_of(hosted_agent("research", Graph(), runtime="langgraph", description="Finds things."))
    assert (spec.runtime, spec.description) == ("langgraph", "Finds things.")


def test_an_object_no_installed_runtime_hosts_is_refused_with_the_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    installed(monkeypatch, ("other", _HostsNothing))
    with pytest.raises(UserError, match="no installed runtime hosts a Graph: install its adapter"):
        hosted_agent("research", Graph())


def test_an_object_several_runtimes_host_needs_a_choice(monkeypatch: pytest.MonkeyPatch) -> None:
    installed(monkeypatch, ("graphs", _Hosts), ("more-graphs", _Hosts))
    with pytest.raises(UserError, match=r"several runtimes host a Graph \(graphs, more-graphs\): pass runtime="):
        hosted_agent("research", Graph())


@pytest.mark.parametrize("name", ["", "a.b", "bad name"])
def test_a_hosted_agents_name_is_checked(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    installed(monkeypatch, ("graphs", _Hosts))
    with pytest.raises(UserError, match="agent name"):
        hosted_agent(name, Graph())


GRAPH = Graph()
"""An object an app names by its import path (`hosted_agent("research", "<this module>:GRAPH")`)."""


def test_an_object_named_by_its_path_is_imported_only_when_its_pool_asks(monkeypatch: pytest.MonkeyPatch) -> None:
    installed(monkeypatch)  # no runtime installed here: nothing is asked, nothing is imported
    spec = spec_of(hosted_agent("research", f"{__name__}:GRAPH", runtime="graphs"))
    assert (spec.runtime, spec.description) == ("graphs", f"{__name__}:GRAPH hosted as research")
    assert App(agents=[Plain, hosted_agent("research", f"{__name__}:GRAPH", runtime="graphs")]).pools == ("graphs",)
    assert spec.hosted_object() is GRAPH


def test_a_path_that_does_not_import_is_said_when_its_pool_loads_it() -> None:
    spec = spec_of(hosted_agent("research", "no_such_module_here.crew:crew", runtime="crewai"))
    with pytest.raises(UserError, match=r"cannot import the hosted object 'no_such_module_here.crew:crew': No module"):
        spec.hosted_object()
    missing = spec_of(hosted_agent("research", f"{__name__}:NOT_THERE", runtime="graphs"))
    with pytest.raises(UserError, match=r"cannot import the hosted object .*NOT_THERE"):
        missing.hosted_object()


@pytest.mark.parametrize("path", ["", "crew", "my crew:crew", "pkg.mod:", ":crew", "pkg..mod:crew", "pkg.mod:a:b"])
def test_an_import_path_must_name_an_attribute_of_a_module(path: str) -> None:
    with pytest.raises(UserError, match=r"is not an import path like 'package\.module:attribute'"):
        hosted_agent("research", path, runtime="crewai")


def test_an_import_path_needs_its_runtime_named() -> None:
    with pytest.raises(UserError, match=r"needs runtime= \(the one hosting it\)"):
        hosted_agent("research", "mycrew.crew:crew")
