import json

from atmosphere.bus import JetStreamLayout, subjects
from atmosphere.bus.testing import FakeBus
from atmosphere.contracts.run.v1.run_pb2 import RunEvent, RunRequest
from atmosphere.dispatch.handlers import RunExecutor, agent_descriptors
from atmosphere.sdk import App, StreamingSession, agent, prompt


@agent(name="echo")
class Echo:
    @prompt
    async def on_prompt(self, message: str, session: StreamingSession) -> None:
        for word in message.split():
            await session.send(word)


@agent(name="broken")
class Broken:
    @prompt
    async def on_prompt(self, message: str, session: StreamingSession) -> None:
        await session.send("partial")
        raise KeyError("secret-internal-detail")


@agent(name="polite")
class Polite:
    @prompt
    async def on_prompt(self, message: str, session: StreamingSession) -> None:
        await session.error("cannot help with that", code="agent.refused")
        await session.send("ignored")


APP = App(agents=[Echo, Broken, Polite])


async def run(agent_name: str, message: str = "a b c") -> list[RunEvent]:
    bus = FakeBus()
    await bus.provision(JetStreamLayout())
    request = RunRequest(run_id="r1", session_id="s1", conversation_id="c1", agent=agent_name, message=message)
    await RunExecutor(APP, bus).execute(request)
    return [RunEvent.FromString(data) for _, data in bus.stream_messages(subjects.EVENTS_STREAM)]


async def test_events_are_numbered_from_two_and_stamped() -> None:
    events = await run("echo")
    assert [e.seq for e in events] == [2, 3, 4, 5]
    assert [e.WhichOneof("kind") for e in events] == ["text_delta"] * 3 + ["complete"]
    assert all((e.run_id, e.session_id, e.conversation_id, e.agent) == ("r1", "s1", "c1", "echo") for e in events)
    assert all(e.timestamp.seconds > 0 for e in events)


async def test_an_unknown_agent_ends_with_a_clear_error() -> None:
    [event] = await run("ghost")
    assert event.error.code == "dispatch.unknown_agent"
    assert event.error.message == "Unknown agent 'ghost'"


async def test_a_crashing_agent_ends_with_an_error_that_hides_internals() -> None:
    events = await run("broken")
    assert [e.WhichOneof("kind") for e in events] == ["text_delta", "error"]
    assert events[-1].error.message == "KeyError"
    assert "secret" not in events[-1].error.SerializeToString().decode(errors="ignore")


async def test_the_agents_own_terminal_is_kept_and_nothing_follows_it() -> None:
    events = await run("polite")
    assert [e.WhichOneof("kind") for e in events] == ["error"]
    assert events[0].error.code == "agent.refused"


def test_descriptors_name_every_agent_and_its_path() -> None:
    descriptors = {d.name: d for d in agent_descriptors(APP)}
    assert set(descriptors) == {"echo", "broken", "polite"}
    assert descriptors["echo"].path == "/atmosphere/agent/echo"
    assert json.loads(json.dumps(descriptors["echo"].kind)) == "agent"
