"""`atmosphere tape follow` and `atmosphere tape export`: flags, output, exit codes.

`follow` runs on the in-memory bus (its connection is the one thing swapped), with events
written the way a run's submitter and worker write them. `export` launches the tape service's
own program (its own tests are the tape's `test_export_cli.py`): here, its flags, and that the
command really exports a real tape database and passes the program's exit status on.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from atmosphere.bus import Bus, JetStreamLayout, subjects
from atmosphere.bus.testing import FakeBus
from atmosphere.cli import __main__ as cli_main
from atmosphere.cli import tape
from atmosphere.cli.tape import EventPrinter, FollowOptions, summary
from atmosphere.contracts.common.v1.common_pb2 import Error
from atmosphere.contracts.run.v1.run_pb2 import (
    Complete,
    InputMessage,
    Metadata,
    ReasoningDelta,
    RunEvent,
    RunInput,
    TextDelta,
    ToolCallDelta,
    ToolResult,
    ToolStart,
)
from atmosphere.testing import wait_until

DEADLINE = 10.0
"""A safety net against a hang, never an assertion."""


# -- flags -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["tape"], "tape_command"),
        (["tape", "follow"], "one of the arguments run_id --all is required"),
        (["tape", "follow", "r1", "--all"], "not allowed with argument"),
        (["tape", "follow", "a.b"], "invalid run id 'a.b'"),
        (["tape", "follow", "r" * 129], "invalid run id"),
        (["tape", "follow", "r1", "--after-seq", "-1"], "'-1' is not a whole number of 0 or more"),
        (["tape", "follow", "r1", "--after-seq", "three"], "'three' is not a whole number"),
        (["tape", "follow", "--all", "--after-seq", "3"], "--after-seq needs a RUN_ID"),
        (["tape", "follow", "r1", "--namespace", "bad ns"], "namespace"),
        (["tape", "follow", "r1", "--colour"], "unrecognized arguments: --colour"),
        (["tape", "export"], "the following arguments are required: OUT.jsonl"),
        (["tape", "export", "out.jsonl", "--max-runs", "-3"], "'-3' is not a whole number"),
    ],
)
def test_bad_flags_are_a_usage_error(argv: list[str], says: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        cli_main.main(argv)
    assert exited.value.code == 2
    assert says in capsys.readouterr().err


def test_follow_says_in_its_help_that_an_unknown_run_is_waited_for(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cli_main.main(["tape", "follow", "--help"])
    assert "is waited for" in " ".join(capsys.readouterr().out.split())


def test_the_nats_settings_are_the_services_unless_a_flag_says_otherwise(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ATMOSPHERE_NATS__URL", "nats://a:4222,nats://b:4222")
    monkeypatch.setenv("ATMOSPHERE_NATS__NAMESPACE", "team")
    parser = cli_main._parser()
    from_env = FollowOptions.resolve(parser.parse_args(["tape", "follow", "r1"]))
    assert (from_env.servers, from_env.namespace) == (["nats://a:4222", "nats://b:4222"], "team")
    flags = FollowOptions.resolve(
        parser.parse_args(["tape", "follow", "r1", "--server", "nats://c:1", "--namespace", ""])
    )
    assert (flags.servers, flags.namespace) == (["nats://c:1"], "")


def test_unreachable_nats_is_a_clear_failure(capsys: pytest.CaptureFixture[str]) -> None:
    # Port 1 (tcpmux) is privileged and served by nothing here: the connection is refused.
    assert cli_main.main(["tape", "follow", "r1", "--server", "nats://127.0.0.1:1"]) == 1
    printed = capsys.readouterr().err
    assert "error: cannot connect to NATS at nats://127.0.0.1:1 (" in printed
    assert printed.rstrip().endswith("is the stack running?")


def test_neither_a_password_nor_a_login_in_a_url_is_ever_printed(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # Invalid settings name the variable and what it must be, never the value pydantic repeats.
    monkeypatch.setenv("ATMOSPHERE_NATS__PASSWORD", "hunter2-hunter2")
    assert cli_main.main(["tape", "follow", "r1"]) == 2
    printed = capsys.readouterr().err
    assert "ATMOSPHERE_NATS__*: a password without a user" in printed
    assert "hunter2" not in printed
    # A server named with a login (user:password@) is named without it.
    monkeypatch.delenv("ATMOSPHERE_NATS__PASSWORD")
    assert cli_main.main(["tape", "follow", "r1", "--server", "nats://observer:s3cret-pass@127.0.0.1:1"]) == 1
    printed = capsys.readouterr().err
    assert "error: cannot connect to NATS at nats://127.0.0.1:1 (" in printed
    assert "s3cret-pass" not in printed


# -- follow ------------------------------------------------------------------------------------


class Run:
    """Writes one run's events as its submitter and worker do: numbered from 1."""

    def __init__(self, bus: FakeBus, run_id: str = "r1") -> None:
        self.bus, self.run_id, self.seq = bus, run_id, 0

    async def emit(self, **kind: Any) -> None:
        self.seq += 1
        event = RunEvent(run_id=self.run_id, seq=self.seq, agent="echo", **kind)
        await self.bus.js_publish(subjects.run_events(self.run_id), event)

    async def answer(self, *pieces: str) -> None:
        await self.emit(metadata=Metadata(key="X-Atmosphere-Run-Id", value_json=json.dumps(self.run_id)))
        for piece in pieces:
            await self.emit(text_delta=TextDelta(text=piece))
        await self.emit(complete=Complete())


@dataclass
class Terminal:
    out: io.StringIO = field(default_factory=io.StringIO)
    err: io.StringIO = field(default_factory=io.StringIO)

    async def err_says(self, text: str) -> None:
        async def said() -> bool:
            return text in self.err.getvalue()

        await wait_until(said, what=f"stderr to say {text!r}")


def on(bus: Bus) -> Callable[[FollowOptions], contextlib.AbstractAsyncContextManager[Bus]]:
    @contextlib.asynccontextmanager
    async def connect(_options: FollowOptions) -> AsyncIterator[Bus]:
        yield bus

    return connect


@pytest.fixture
async def bus() -> FakeBus:
    bus = FakeBus()
    await bus.provision(JetStreamLayout())
    return bus


async def follow(bus: Bus, terminal: Terminal, run_id: str | None = "r1", **options: Any) -> int:
    settings = FollowOptions(["nats://test:4222"], "", run_id, **options)
    async with asyncio.timeout(DEADLINE):
        return await tape.follow(settings, connect=on(bus), out=terminal.out, err=terminal.err, hint_after=0)


async def test_a_finished_run_is_printed_text_inline_and_the_command_ends_with_it(bus: FakeBus) -> None:
    await Run(bus).answer("hello ", "brave ", "world")
    terminal = Terminal()
    assert await follow(bus, terminal) == 0
    assert terminal.out.getvalue() == ('#1 metadata X-Atmosphere-Run-Id = "r1"\nhello brave world\n#5 complete\n')


async def test_json_prints_one_object_per_event_after_the_seq_given(bus: FakeBus) -> None:
    await Run(bus).answer("a ", "b")
    terminal = Terminal()
    assert await follow(bus, terminal, after_seq=2, as_json=True) == 0
    lines = [json.loads(line) for line in terminal.out.getvalue().splitlines()]
    assert lines == [
        {"run": "r1", "seq": 3, "agent": "echo", "kind": "text_delta", "data": {"text": "b"}},
        {"run": "r1", "seq": 4, "agent": "echo", "kind": "complete", "data": {}},
    ]


async def test_a_live_run_is_printed_as_it_happens(bus: FakeBus) -> None:
    run = Run(bus)
    await run.emit(metadata=Metadata(key="X-Atmosphere-Run-Id", value_json='"r1"'))
    terminal = Terminal()
    following = asyncio.create_task(follow(bus, terminal))

    async def printed(text: str) -> None:
        async def there() -> bool:
            return text in terminal.out.getvalue()

        await wait_until(there, what=repr(text))

    await printed("#1 metadata")
    await run.emit(text_delta=TextDelta(text="live "))
    await printed("live ")
    assert not following.done()
    await run.emit(text_delta=TextDelta(text="text"))
    await run.emit(error=Error(code="run.cancelled", message="cancelled by the user"))
    assert await following == 0
    assert terminal.out.getvalue().endswith("live text\n#4 error run.cancelled: cancelled by the user\n")


async def test_an_unknown_run_is_waited_for_with_a_hint(bus: FakeBus) -> None:
    terminal = Terminal()
    following = asyncio.create_task(follow(bus, terminal, "later"))
    await terminal.err_says("nothing is stored for run later yet")
    assert "still waiting" in terminal.err.getvalue()
    await Run(bus, "later").answer("at last")
    assert await following == 0
    assert "at last\n#3 complete" in terminal.out.getvalue()


async def test_bus_trouble_is_a_clear_failure() -> None:
    unprovisioned = FakeBus()  # no `ATMO_EVENTS`: reading a run's events fails
    terminal = Terminal()
    assert await follow(unprovisioned, terminal) == 1
    assert terminal.err.getvalue().startswith("error: following stopped:")


async def test_all_prints_every_runs_new_events_each_line_naming_its_run(bus: FakeBus) -> None:
    await Run(bus, "before").answer("not shown")
    terminal = Terminal()
    following = asyncio.create_task(follow(bus, terminal, None))
    await terminal.err_says("following every run's new events")
    one, two = Run(bus, "one"), Run(bus, "two")
    await one.emit(text_delta=TextDelta(text="from "))
    await two.emit(text_delta=TextDelta(text="other"))
    await one.emit(text_delta=TextDelta(text="one"))
    await one.emit(complete=Complete())

    async def all_there() -> bool:
        return "#3 complete" in terminal.out.getvalue()

    await wait_until(all_there, what="the events")
    following.cancel()  # what Ctrl-C does
    with pytest.raises(asyncio.CancelledError):
        await following
    assert terminal.out.getvalue() == "one from \ntwo other\none one\none #3 complete\n"


# -- printing ----------------------------------------------------------------------------------


def printed(*events: RunEvent, all_runs: bool = False) -> str:
    out = io.StringIO()
    printer = EventPrinter(out, as_json=False, all_runs=all_runs)
    for event in events:
        printer.show(event)
    printer.close()
    return out.getvalue()


def test_sub_agent_text_and_reasoning_get_lines_of_their_own() -> None:
    events = [
        RunEvent(run_id="r", seq=1, reasoning_delta=ReasoningDelta(text="hmm")),
        RunEvent(run_id="r", seq=2, text_delta=TextDelta(text="Asking. ")),
        RunEvent(run_id="r", seq=3, origin_run_id="s", origin_agent="helper", text_delta=TextDelta(text="sub")),
        RunEvent(run_id="r", seq=4, tool_call_delta=ToolCallDelta(call_id="c", arguments_fragment='{"a"')),
        RunEvent(run_id="r", seq=5, text_delta=TextDelta(text="Done.")),
    ]
    assert printed(*events) == "(thinking) hmm\nAsking. \n[helper] sub\nDone.\n"


def rewound_run(run_id: str = "r") -> list[RunEvent]:
    """A run resumed mid-answer whose model, asked again, answered differently."""
    rewind = Metadata(key="ai.run.answer_rewound", value_json=json.dumps({"discard": 8}))
    return [
        RunEvent(run_id=run_id, seq=1, metadata=Metadata(key="X-Atmosphere-Run-Id", value_json=json.dumps(run_id))),
        RunEvent(run_id=run_id, seq=3, text_delta=TextDelta(text="The sky ")),
        RunEvent(run_id=run_id, seq=4, text_delta=TextDelta(text="is green")),  # the first worker's, then it died
        RunEvent(run_id=run_id, seq=5, metadata=Metadata(key="ai.run.resumed", value_json='{"fromSeq": 5}')),
        RunEvent(run_id=run_id, seq=6, metadata=rewind),
        RunEvent(run_id=run_id, seq=7, text_delta=TextDelta(text="looks blue.")),
        RunEvent(run_id=run_id, seq=8, complete=Complete()),
    ]


def test_a_rewound_answer_is_printed_again_as_it_stands_never_spliced() -> None:
    shown = printed(*rewound_run())
    assert shown == (
        '#1 metadata X-Atmosphere-Run-Id = "r"\n'
        "The sky is green\n"
        '#5 metadata ai.run.resumed = {"fromSeq": 5}\n'
        "#6 answer rewound: 8 characters withdrawn; the answer again:\n"
        "The sky looks blue.\n"
        "#8 complete\n"
    )
    assert "The sky is greenlooks blue." not in shown.replace("\n", "")  # what ignoring the marker shows


def test_a_rewind_of_a_run_followed_from_a_later_seq_says_what_to_drop() -> None:
    # Its start was not followed here: there is no whole answer to print again.
    assert printed(*rewound_run()[2:]) == (
        "is green\n"
        '#5 metadata ai.run.resumed = {"fromSeq": 5}\n'
        "#6 answer rewound: drop the last 8 characters of the answer\n"
        "looks blue.\n"
        "#8 complete\n"
    )


def test_a_runs_last_json_line_carries_its_answer_with_every_rewind_applied() -> None:
    out = io.StringIO()
    printer = EventPrinter(out, as_json=True, all_runs=True)
    for event in rewound_run("a"):
        printer.show(event)
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [line["kind"] for line in lines][-2:] == ["text_delta", "complete"]
    assert lines[-1]["answer"] == "The sky looks blue."
    assert all("answer" not in line for line in lines[:-1])


def test_a_summary_is_one_short_line_and_the_models_input_is_only_counted() -> None:
    long_result = RunEvent(tool_result=ToolResult(tool_name="read", result="line\n" * 500))
    assert "\n" not in summary(long_result)
    assert len(summary(long_result)) == tape.SUMMARY_CHARS
    assert summary(long_result).endswith("…")
    assert summary(RunEvent(tool_start=ToolStart(tool_name="add", arguments_json='{"a": 1}'))) == 'tool add {"a": 1}'
    model_input = RunEvent(input=RunInput(messages=[InputMessage(role="system", content="secret")], model="m"))
    assert summary(model_input) == "input: 1 messages for m"
    assert summary(RunEvent()) == "an event of a kind this command does not know"


# -- export ------------------------------------------------------------------------------------


def test_export_says_in_its_help_what_it_writes(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        cli_main.main(["tape", "export", "--help"])
    assert exited.value.code == 0
    assert 'Write one {"messages": [...]} line per completed run' in " ".join(capsys.readouterr().out.split())


def test_export_runs_the_tapes_own_program_with_the_flags_given() -> None:
    program = [sys.executable, "-m", "atmosphere.tape.export_cli"]
    assert tape.export_argv(Path("-odd.jsonl"), db=None) == [*program, "--max-runs", "0", "--", "-odd.jsonl"]
    assert tape.export_argv(Path("o.jsonl"), db=Path("t.db"), max_runs=5) == [
        *program,
        "--max-runs",
        "5",
        "--db",
        "t.db",
        "--",
        "o.jsonl",
    ]


# Written by the tape's own `Recorder`, in a process of its own: this library never imports a service.
RECORD = """
import asyncio, sys
from pathlib import Path
from atmosphere.contracts.run.v1.run_pb2 import RunEvent
from atmosphere.tape.recorder import Recorder
from atmosphere.tape.store import TapeStore

async def record() -> None:
    events = [RunEvent.FromString(bytes.fromhex(line)) for line in sys.stdin.read().split()]
    async with TapeStore.open(Path(sys.argv[1])) as store:
        await Recorder(store).record(events)

asyncio.run(record())
"""


def record(db: Path, *runs: list[RunEvent]) -> None:
    events = "\n".join(event.SerializeToString().hex() for run in runs for event in run)
    argv = [sys.executable, "-c", RECORD, str(db)]
    recorded = subprocess.run(argv, input=events, capture_output=True, text=True, check=False, timeout=60)
    assert recorded.returncode == 0, recorded.stderr


def tape_run(run_id: str, *, prompt: bool) -> list[RunEvent]:
    kinds: list[dict[str, Any]] = [{"metadata": Metadata(key="X-Atmosphere-Run-Id", value_json=json.dumps(run_id))}]
    if prompt:
        messages = [InputMessage(role="system", content="Be brief."), InputMessage(role="user", content="Hi")]
        kinds.append({"input": RunInput(messages=messages)})
    kinds += [{"text_delta": TextDelta(text="Hello")}, {"text_delta": TextDelta(text=" there.")}]
    kinds.append({"complete": Complete()})
    return [RunEvent(run_id=run_id, seq=n, agent="helper", **kind) for n, kind in enumerate(kinds, start=1)]


def test_the_command_exports_a_real_tape(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    db, out = tmp_path / "data" / "tape.db", tmp_path / "sets" / "chat.jsonl"
    record(db, tape_run("prompted", prompt=True), tape_run("bare", prompt=False))
    assert cli_main.main(["tape", "export", str(out), "--db", str(db)]) == 0
    assert [json.loads(line) for line in out.read_text().splitlines()] == [
        {
            "messages": [
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": "Hi"},
                {"role": "assistant", "content": "Hello there."},
            ]
        }
    ]
    err = capfd.readouterr().err
    assert "\r[##############################] 2/2 runs\n" in err
    assert f"wrote 1 of 2 runs to {out}" in err
    assert "skipped: 0 not completed, 1 without a model input, 0 without an answer" in err


def test_a_missing_database_fails_through_the_command(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    assert cli_main.main(["tape", "export", str(tmp_path / "out.jsonl"), "--db", str(tmp_path / "none.db")]) == 1
    assert f"error: no tape database at {tmp_path / 'none.db'}" in capfd.readouterr().err
    assert not (tmp_path / "out.jsonl").exists()


def test_without_the_tape_installed_export_says_so(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(tape, "TAPE_PACKAGE", "atmosphere.no_such_service")  # what find_spec finds nowhere
    assert cli_main.main(["tape", "export", str(tmp_path / "out.jsonl")]) == 1
    assert capsys.readouterr().err == "error: the tape service (atmosphere-ai-tape) is not installed\n"
