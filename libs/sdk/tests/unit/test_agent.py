from pathlib import Path

import pytest

from atmosphere.bus.runs import SinkHost
from atmosphere.contracts.run.v1.run_pb2 import RunEvent
from atmosphere.sdk import App, StreamingSession, UserError, agent, prompt
from atmosphere.sdk.host import load_app, spec_of


@agent(name="helper", system_prompt="Be brief.")
class Helper:
    """Helps."""

    @prompt
    async def on_prompt(self, message: str, session: StreamingSession) -> None:
        await session.send(message)


def test_agent_records_its_spec() -> None:
    spec = spec_of(Helper)
    assert (spec.name, spec.path, spec.kind) == ("helper", "/atmosphere/agent/helper", "agent")
    assert spec.system_prompt == "Be brief."
    assert spec.description == "Helps."
    assert spec.prompt_method == "on_prompt"


def test_name_defaults_to_the_class_name() -> None:
    @agent()
    class Weather:
        @prompt
        async def ask(self, message: str, session: StreamingSession) -> None: ...

    assert spec_of(Weather).name == "weather"


def test_misuse_fails_at_decoration_time() -> None:
    with pytest.raises(UserError, match="async def"):

        @prompt
        def not_async(self: object, message: str, session: StreamingSession) -> None: ...

    with pytest.raises(UserError, match="must take"):

        @prompt
        async def wrong_arity(self: object, message: str) -> None: ...

    with pytest.raises(UserError, match="at most one is allowed"):

        @agent(name="twice")
        class Twice:
            @prompt
            async def a(self, message: str, session: StreamingSession) -> None: ...

            @prompt
            async def b(self, message: str, session: StreamingSession) -> None: ...

    with pytest.raises(UserError, match="agent name"):

        @agent(name="has space")
        class Spaced:
            @prompt
            async def p(self, message: str, session: StreamingSession) -> None: ...

    with pytest.raises(UserError, match="without arguments"):

        @agent(name="needs-args")
        class NeedsArgs:
            def __init__(self, token: str) -> None:
                self.token = token

            @prompt
            async def p(self, message: str, session: StreamingSession) -> None: ...


def test_app_registration_is_explicit_and_unique() -> None:
    app = App(agents=[Helper])
    assert list(app.agents) == ["helper"]
    assert app.agent("helper") is spec_of(Helper)
    assert app.agent("missing") is None
    with pytest.raises(UserError, match="two agents"):
        App(agents=[Helper, Helper])
    with pytest.raises(UserError, match="is not an @agent"):
        App(agents=[int])


def test_load_app_by_reference(tmp_path: Path) -> None:
    package = tmp_path / "myagents_pkg"
    package.mkdir()
    (package / "__init__.py").write_text(
        "from atmosphere.sdk import App, agent, prompt\n"
        "@agent(name='x')\n"
        "class X:\n"
        "    @prompt\n"
        "    async def p(self, message, session): ...\n"
        "app = App(agents=[X])\n"
        "not_an_app = 3\n"
    )
    assert list(load_app("myagents_pkg:app", app_dir=tmp_path).agents) == ["x"]
    with pytest.raises(UserError, match=r"package\.module:app"):
        load_app("no_colon")
    with pytest.raises(UserError, match="cannot import"):
        load_app("does_not_exist_anywhere:app", app_dir=tmp_path)
    with pytest.raises(UserError, match=r"not an atmosphere\.sdk\.App"):
        load_app("myagents_pkg:not_an_app", app_dir=tmp_path)


async def test_the_first_terminal_wins_and_later_sends_are_dropped() -> None:
    sent: list[RunEvent] = []

    async def sink(event: RunEvent) -> None:
        sent.append(event)

    session = StreamingSession(SinkHost(sink), run_id="r", session_id="s", conversation_id="c")
    await session.send("a")
    await session.progress("thinking", 0.5)
    await session.metadata("model", {"name": "m"})
    await session.complete("done")
    await session.send("late")
    await session.error("too late")
    assert [e.WhichOneof("kind") for e in sent] == ["text_delta", "progress", "metadata", "complete"]
    assert sent[2].metadata.value_json == '{"name": "m"}'
    assert session.closed
    assert session.dropped == 2
