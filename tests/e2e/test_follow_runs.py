"""Following real runs from outside: the plain nats-py example, `atmosphere tape follow`, gRPC `Follow`.

The NATS follower example decodes a run's events with nats-py and the contracts alone; the CLI
follows with the services' own settings; the gRPC example starts a run and resumes it by seq.
"""

from __future__ import annotations

import ast
import asyncio
import importlib.util
import json
import os
import signal
import sys
from collections import defaultdict
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import nats
import pytest
from nats.js.api import DeliverPolicy

from atmosphere.bus import NatsBus, subjects
from atmosphere.contracts.common.v1.service_pb2 import ServiceInfoRequest, ServiceInfoResponse
from atmosphere.contracts.run.v1.run_pb2 import RunEvent
from atmosphere.testing import run_stack

from .wsclient import ask

FOLLOWERS = Path(__file__).resolve().parents[2] / "examples" / "followers"
EXAMPLE = FOLLOWERS / "follow_runs.py"
GRPC_EXAMPLE = FOLLOWERS / "grpc_follow.py"
PROMPT = "hello brave new world"


async def start_follower(nats_url: str, namespace: str, *args: str) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable, str(EXAMPLE), "--server", nats_url, "--namespace", namespace, *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip


async def lines_until_exit(follower: asyncio.subprocess.Process) -> list[dict[str, Any]]:
    out, err = await asyncio.wait_for(follower.communicate(), 30)
    assert follower.returncode == 0, err.decode()
    return [json.loads(line) for line in out.decode().splitlines()]


def assert_decoded_echo_run(events: list[dict[str, Any]], frames: list[dict[str, Any]]) -> str:
    run_id = str(frames[0]["value"])
    assert {e["run"] for e in events} == {run_id}
    assert {e["agent"] for e in events} == {"echo"}
    assert [e["seq"] for e in events] == [f["seq"] for f in frames] == list(range(1, len(frames) + 1))
    first, *texts, last = events
    assert first["kind"] == "metadata"
    assert first["data"] == {"key": "X-Atmosphere-Run-Id", "valueJson": json.dumps(run_id)}
    assert [e["kind"] for e in texts] == ["text_delta"] * len(PROMPT.split(" "))
    assert "".join(e["data"]["text"] for e in texts) == PROMPT
    assert last["kind"] == "complete"
    assert last["answer"] == PROMPT  # followed from seq 1: the answer, every rewind applied
    return run_id


async def test_the_follower_replays_a_finished_run_and_tails_a_live_one(
    services: dict[str, Any], nats_bus: NatsBus, nats_url: str, bus_namespace: str
) -> None:
    async with run_stack(services, bus=nats_bus) as stack:
        url = await stack.ingress_url()
        frames = await ask(url, "echo", PROMPT)
        run_id = str(frames[0]["value"])
        # A finished run is replayed from its first event; the follower exits at its end.
        replay = await start_follower(nats_url, bus_namespace, "--run", run_id)
        assert_decoded_echo_run(await lines_until_exit(replay), frames)

        # Following every run sees only what comes after it subscribed: the next run, whole.
        live = await start_follower(nats_url, bus_namespace, "--runs", "1")
        assert live.stderr is not None
        ready = await asyncio.wait_for(live.stderr.readline(), 30)
        assert ready.decode().startswith(f"following {bus_namespace}.atmo.run.*.evt")
        frames = await ask(url, "echo", PROMPT)
        assert assert_decoded_echo_run(await lines_until_exit(live), frames) != run_id


def follower_module() -> ModuleType:
    """The example follower, imported as a module (it is a script, not a package)."""
    spec = importlib.util.spec_from_file_location("follow_runs_example", EXAMPLE)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class LossySubscription:
    """A live subscription that never got some of the run's events (a plain subscription is at most once).

    It hands out the messages it was given, then reports quiet (`next_msg` timing out at once).
    """

    def __init__(self, subject: str, events: list[RunEvent]) -> None:
        self.subject = subject
        self._events = list(events)
        self.quiet_spells = 0

    async def next_msg(self, timeout: float) -> Any:
        if self._events:
            return SimpleNamespace(data=self._events.pop(0).SerializeToString())
        self.quiet_spells += 1
        assert self.quiet_spells < 5, "the follower kept waiting on a run the stream has whole"
        raise nats.errors.TimeoutError


async def stored_run(nats_url: str, bus_namespace: str, run_id: str) -> list[RunEvent]:
    module = follower_module()
    client = await nats.connect(nats_url)
    try:
        stream = module.events_stream(bus_namespace)
        subject = module.events_subject(bus_namespace, run_id)
        return [event async for event in module.stored(client, stream, subject)]
    finally:
        await client.close()


async def follow_lossy(nats_url: str, bus_namespace: str, live: LossySubscription) -> int:
    module = follower_module()
    client = await nats.connect(nats_url)
    try:
        stream = module.events_stream(bus_namespace)
        tail = module.Tail(client, stream, bus_namespace, 0, module.Printer(1))
        return int(await tail.follow(live, replay=False))
    finally:
        await client.close()


@pytest.mark.parametrize(
    ("heard", "quiet_spells"),
    [
        (slice(1, 3), 0),  # seq 1 lost (it was, once, under a loaded suite): seq 2 is past a gap
        (slice(0, 3), 1),  # the end lost: the run goes quiet before its terminal event
    ],
    ids=["first-event-lost", "end-lost"],
)
async def test_the_follower_reads_back_what_its_subscription_missed(
    services: dict[str, Any],
    nats_bus: NatsBus,
    nats_url: str,
    bus_namespace: str,
    capsys: pytest.CaptureFixture[str],
    heard: slice,
    quiet_spells: int,
) -> None:
    """A subscription that lost part of a run: the follower reads the rest back from the stream.

    Past a gap it reads what is stored at once; after a quiet spell it looks again. Either way
    the run is printed whole, in seq order, once, with its answer.
    """
    async with run_stack(services, bus=nats_bus) as stack:
        frames = await ask(await stack.ingress_url(), "echo", PROMPT)
    run_id = str(frames[0]["value"])
    events = await stored_run(nats_url, bus_namespace, run_id)
    assert [e.seq for e in events] == list(range(1, len(frames) + 1))
    live = LossySubscription(f"{bus_namespace}.atmo.run.*.evt", events[heard])
    capsys.readouterr()
    assert await follow_lossy(nats_url, bus_namespace, live) == 0
    printed = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert_decoded_echo_run(printed, frames)
    assert live.quiet_spells == quiet_spells


RUNS = 200
AT_ONCE = 10


async def test_a_plain_subscriber_reads_every_runs_events_in_seq_order(
    services: dict[str, Any], nats_bus: NatsBus, nats_url: str, bus_namespace: str
) -> None:
    """200 runs, 10 at a time: the stream holds each run's events in seq order from 1.

    A plain nats-py subscriber (an ordered consumer of `ATMO_EVENTS`, no reordering of its own)
    and the example follower both see every run whole: seq 1 (the run id) first, the terminal
    event last, nothing out of order in between.
    """
    seen: dict[str, list[int]] = defaultdict(list)
    client = await nats.connect(nats_url)
    try:

        async def record(message: Any) -> None:
            event = RunEvent.FromString(message.data)
            seen[event.run_id].append(event.seq)

        async with run_stack(services, bus=nats_bus) as stack:
            url = await stack.ingress_url()
            await client.jetstream().subscribe(
                f"{bus_namespace}.atmo.run.*.evt",
                stream=f"{bus_namespace.upper()}_ATMO_EVENTS",
                ordered_consumer=True,
                deliver_policy=DeliverPolicy.NEW,
                cb=record,
            )
            follower = await start_follower(nats_url, bus_namespace, "--runs", str(RUNS))
            assert follower.stderr is not None
            await asyncio.wait_for(follower.stderr.readline(), 30)
            slots = asyncio.Semaphore(AT_ONCE)

            async def one(n: int) -> list[dict[str, Any]]:
                async with slots:
                    return await ask(url, "echo", f"run {n} says hello")

            runs = await asyncio.gather(*(one(n) for n in range(RUNS)))
            out, err = await asyncio.wait_for(follower.communicate(), 60)
            assert follower.returncode == 0, err.decode()
            expected = {str(frames[0]["value"]): [f["seq"] for f in frames] for frames in runs}
            for frames in expected.values():
                assert frames == list(range(1, len(frames) + 1))
            deadline = asyncio.get_running_loop().time() + 30
            while any(len(seen[r]) < len(s) for r, s in expected.items()):
                assert asyncio.get_running_loop().time() < deadline, "the subscriber missed events"
                await asyncio.sleep(0.05)
    finally:
        await client.close()
    out_of_order = {r: seen[r] for r, seqs in expected.items() if seen[r] != seqs}
    assert not out_of_order, f"{len(out_of_order)} of {RUNS} runs stored out of seq order: {out_of_order}"
    printed: dict[str, list[int]] = defaultdict(list)
    for line in out.decode().splitlines():
        event = json.loads(line)
        printed[event["run"]].append(event["seq"])
    assert printed == expected, "the example follower did not print every run whole"


async def test_the_follower_refuses_a_run_id_that_is_not_a_subject_token(nats_url: str) -> None:
    follower = await start_follower(nats_url, "", "--run", "a.b")
    _, err = await asyncio.wait_for(follower.communicate(), 30)
    assert follower.returncode == 2
    assert "invalid run id 'a.b'" in err.decode()


async def test_the_follower_names_the_missing_stream(nats_url: str, bus_namespace: str) -> None:
    follower = await start_follower(nats_url, bus_namespace, "--run", "r1")
    _, err = await asyncio.wait_for(follower.communicate(), 30)
    assert follower.returncode == 2
    assert f"no stream {bus_namespace.upper()}_ATMO_EVENTS" in err.decode()


def test_the_follower_imports_nothing_of_atmosphere_but_the_contracts() -> None:
    tree = ast.parse(EXAMPLE.read_text())
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    imported |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    ours = {m for m in imported if m.startswith(("atmosphere", "examples"))}
    assert ours == {"atmosphere.contracts.run.v1.run_pb2"}


async def run_command(*argv: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    process = await asyncio.create_subprocess_exec(
        *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=env
    )
    out, err = await asyncio.wait_for(process.communicate(), 30)
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


def _interruptible() -> None:
    """In the child before it runs: SIGINT does what it does at a terminal."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


async def stopped(process: asyncio.subprocess.Process, *, within: float) -> None:
    """Wait for `process` to end; one still running after `within` s fails with its threads' stacks."""
    try:
        await asyncio.wait_for(process.wait(), within)
    except TimeoutError:
        process.send_signal(signal.SIGABRT)  # faulthandler prints every thread's stack, then it dies
        await process.wait()
        assert process.stderr is not None
        where = (await process.stderr.read()).decode(errors="replace")
        raise AssertionError(f"still running {within:g} s after SIGINT:\n{where}") from None


def tape_follow(*args: str) -> tuple[str, ...]:
    return (sys.executable, "-m", "atmosphere.cli", "tape", "follow", *args)


async def test_the_tape_follow_command_replays_a_run_and_tails_every_run(
    services: dict[str, Any], nats_bus: NatsBus, nats_url: str, bus_namespace: str
) -> None:
    async with run_stack(services, bus=nats_bus) as stack:
        url = await stack.ingress_url()
        frames = await ask(url, "echo", PROMPT)
        run_id = str(frames[0]["value"])
        where = ("--server", nats_url, "--namespace", bus_namespace)
        # A finished run: its text inline, the other events a line each; exit 0 at its end.
        code, out, err = await run_command(*tape_follow(run_id, *where))
        assert code == 0, err
        first, text, last = out.splitlines()
        assert first == f'#1 metadata X-Atmosphere-Run-Id = "{run_id}"'
        assert text == PROMPT
        assert last == f"#{len(frames)} complete"
        # The services' own settings when no flag is given; JSON lines after a seq.
        env = {"ATMOSPHERE_NATS__URL": nats_url, "ATMOSPHERE_NATS__NAMESPACE": bus_namespace, "PATH": ""}
        code, out, err = await run_command(*tape_follow(run_id, "--json", "--after-seq", "1"), env=env)
        assert code == 0, err
        lines = [json.loads(line) for line in out.splitlines()]
        assert [line["seq"] for line in lines] == list(range(2, len(frames) + 1))
        assert "".join(line["data"]["text"] for line in lines if line["kind"] == "text_delta") == PROMPT

        # Every run, live, until Ctrl-C (its normal end: exit 0).
        # Ctrl-C as a terminal sends it: SIGINT's default action restored in the child, since a
        # suite started in the background (`make test &`) passes SIGINT on ignored, and an
        # ignored SIGINT stays ignored in Python. faulthandler: a follower that does not stop is
        # made to show where it is (below).
        every = await asyncio.create_subprocess_exec(
            *tape_follow("--all", *where),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env={**os.environ, "PYTHONFAULTHANDLER": "1"},
            preexec_fn=_interruptible,
        )
        assert every.stdout is not None
        assert every.stderr is not None
        ready = await asyncio.wait_for(every.stderr.readline(), 30)
        assert ready.decode().startswith("following every run's new events")
        frames = await ask(url, "echo", PROMPT)
        next_run = str(frames[0]["value"])
        seen = [(await asyncio.wait_for(every.stdout.readline(), 30)).decode() for _ in range(3)]
        every.send_signal(signal.SIGINT)
        await stopped(every, within=30)
        assert every.returncode == 0
        assert seen == [
            f'{next_run} #1 metadata X-Atmosphere-Run-Id = "{next_run}"\n',
            f"{next_run} {PROMPT}\n",
            f"{next_run} #{len(frames)} complete\n",
        ]


async def test_the_grpc_example_runs_an_agent_and_follows_a_run_by_seq(
    services: dict[str, Any], nats_bus: NatsBus
) -> None:
    async with run_stack(services, bus=nats_bus):
        reply = await nats_bus.request(subjects.service_info("dispatch"), ServiceInfoRequest(), ServiceInfoResponse)
        target = json.loads(reply.info_json)["grpc"]
        code, out, err = await run_command(sys.executable, str(GRPC_EXAMPLE), "--target", target, "echo", PROMPT)
        assert code == 0, err
        assert out == PROMPT
        run_id = err.split("[run ", 1)[1].split("]", 1)[0]
        code, out, err = await run_command(
            sys.executable, str(GRPC_EXAMPLE), "--target", target, "--run", run_id, "--after-seq", "3"
        )
        assert code == 0, err
        assert out == " ".join(PROMPT.split(" ")[2:])


def test_the_grpc_example_imports_nothing_of_atmosphere_but_the_contracts() -> None:
    tree = ast.parse(GRPC_EXAMPLE.read_text())
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    ours = {m for m in imported if m.startswith(("atmosphere", "examples"))}
    assert ours == {"atmosphere.contracts.dispatch.v1"}
