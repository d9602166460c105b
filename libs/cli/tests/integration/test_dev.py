import asyncio
import importlib.util
import io
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from atmosphere.cli import __main__ as cli_main
from atmosphere.cli import dev
from atmosphere.cli.dev import SERVICES, DevOptions, banner, child_specs, wait_for_ready
from atmosphere.cli.supervisor import ChildSpec, Supervisor, restart_delay
from atmosphere.testing import wait_until


def test_child_specs_start_the_broker_first_and_ingress_last(tmp_path: Path) -> None:
    options = DevOptions(
        app="examples.echo:app", home=tmp_path, nats_port=5000, http_port=5001, probe_base_port=5100, no_model=True
    )
    specs = child_specs(options)
    assert [s.name for s in specs] == ["nats", "provision", *SERVICES]
    # The layout is made once, before any service starts, by `python -m atmosphere.dispatch.provision`.
    assert specs[1].once
    assert specs[1].argv[1:] == ["-m", "atmosphere.dispatch.provision"]
    assert not any(s.once for s in specs[2:])
    assert specs[-1].name == "ingress"
    assert specs[-1].env["ATMOSPHERE_INGRESS__PORT"] == "5001"
    probes = {s.name: s.env.get("ATMOSPHERE_PROBE_PORT", "") for s in specs[2:-1]}
    assert sorted(probes.values()) == ["5100", "5101", "5102", "5103", "5104"]
    assert all(s.env["ATMOSPHERE_NATS__URL"] == "nats://127.0.0.1:5000" for s in specs[1:])
    assert "-js" in specs[0].argv
    assert "ws://127.0.0.1:5001/atmosphere/agent/<agent>" in banner(options)
    assert specs[-1].env["ATMOSPHERE_AI_OPENAI_ENABLED"] == "true"
    assert "http://127.0.0.1:5001/atmosphere/v1" in banner(options)


def test_the_admin_token_reaches_ingress_and_the_banner(tmp_path: Path) -> None:
    options = DevOptions(app="a:b", home=tmp_path, no_model=True, admin_token="s3cret-token", openai_enabled=False)
    ingress = child_specs(options)[-1]
    assert ingress.env["ATMOSPHERE_ADMIN_TOKEN"] == "s3cret-token"
    assert ingress.env["ATMOSPHERE_AI_OPENAI_ENABLED"] == "false"
    assert "Authorization: Bearer s3cret-token" in banner(options)  # made for this run: shown, or nobody knows it
    assert "/atmosphere/v1" not in banner(options)


def test_the_operators_own_admin_token_is_never_printed(tmp_path: Path) -> None:
    options = DevOptions(app="a:b", home=tmp_path, no_model=True, admin_token="s3cret-token", admin_token_given=True)
    assert child_specs(options)[-1].env["ATMOSPHERE_ADMIN_TOKEN"] == "s3cret-token"
    assert "s3cret-token" not in banner(options)
    assert "Authorization: Bearer $ATMOSPHERE_ADMIN_TOKEN" in banner(options)


def test_the_banner_says_why_there_is_no_model(tmp_path: Path) -> None:
    chosen = DevOptions(app="a:b", home=tmp_path, no_model=True, llm_base_url="")
    assert "none (--no-model): set LLM_BASE_URL" in banner(chosen)
    assert "[local-model]" not in banner(chosen)  # the user chose no model: no advice to install one
    configured = DevOptions(app="a:b", home=tmp_path, no_model=True, llm_base_url="http://h:1/v1")
    assert "http://h:1/v1 (LLM_BASE_URL)" in banner(configured)


def test_without_the_local_model_the_banner_says_how_to_install_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Outside this repository `make install` means nothing: the hint names the extra to install.
    monkeypatch.setattr("atmosphere.cli.dev.llama_available", lambda: False)
    missing = DevOptions(app="a:b", home=tmp_path, llm_base_url="")
    assert not missing.local_model
    assert "pip install 'atmosphere-ai-cli[local-model]'" in banner(missing)


def test_restart_delay_doubles_up_to_a_cap() -> None:
    assert [restart_delay(n) for n in range(1, 9)] == [0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0]


async def test_supervisor_prefixes_output_and_restarts_a_crashed_child() -> None:
    out = io.StringIO()
    events: list[str] = []
    supervisor = Supervisor(out=out, on_event=events.append)
    await supervisor.start(ChildSpec(name="flaky", argv=[sys.executable, "-c", "print('hi'); raise SystemExit(3)"]))
    for _ in range(100):
        if sum(e.startswith("started flaky") for e in events) >= 2:
            break
        await asyncio.sleep(0.05)
    await supervisor.stop()
    assert "flaky     | hi" in out.getvalue()
    assert "exited with 3; restarting in 0.5s" in out.getvalue()
    assert sum(e.startswith("started flaky") for e in events) >= 2


async def test_a_child_restarting_when_the_stack_stops_is_stopped_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The restart's process exists but its pipes are still being connected when stop() comes:
    # stop() cancels the restart, and the process it made must not be left running unheld.
    real_exec = asyncio.create_subprocess_exec
    made: list[asyncio.subprocess.Process] = []

    async def slow_to_connect(*args: Any, **kwargs: Any) -> asyncio.subprocess.Process:
        process = await real_exec(*args, **kwargs)
        made.append(process)
        if len(made) > 1:
            await asyncio.sleep(0.5)
        return process

    monkeypatch.setattr(asyncio, "create_subprocess_exec", slow_to_connect)
    supervisor = Supervisor(out=io.StringIO())
    # The first run crashes; the restart would run for a minute.
    ran = tmp_path / "ran"
    script = f"import pathlib, sys, time; p = pathlib.Path({str(ran)!r}); p.exists() and time.sleep(60); p.touch()"
    script += "; sys.exit(3)"
    await supervisor.start(ChildSpec(name="flaky", argv=[sys.executable, "-c", script]))

    async def restarting() -> bool:
        return len(made) > 1

    await wait_until(restarting, what="the restart")
    await supervisor.stop()
    assert [process.returncode is not None for process in made] == [True, True]


async def test_stop_kills_a_child_that_ignores_sigterm() -> None:
    out = io.StringIO()
    supervisor = Supervisor(out=out)
    script = (
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('up', flush=True); time.sleep(60)"
    )
    await supervisor.start(ChildSpec(name="stubborn", argv=[sys.executable, "-c", script], stop_timeout=0.5))
    for _ in range(100):
        if "up" in out.getvalue():
            break
        await asyncio.sleep(0.05)
    await supervisor.stop()
    assert "did not stop in 0.5s; killing" in out.getvalue()
    assert supervisor.pids == []


def test_the_local_model_runs_only_without_llm_base_url(tmp_path: Path) -> None:
    local = DevOptions(app="a:b", home=tmp_path, model_port=5200, grpc_port=5300)
    if not local.local_model:
        return  # llama-cpp-python or the SmolLM2 wheel is not installed here
    specs = {s.name: s for s in child_specs(local)}
    assert "model" in specs
    assert specs["dispatch"].env["LLM_BASE_URL"] == "http://127.0.0.1:5200/v1"
    assert specs["dispatch"].env["ATMOSPHERE_DISPATCH__GRPC_PORT"] == "5300"
    remote = DevOptions(app="a:b", home=tmp_path, llm_base_url="https://api.example.com/v1")
    specs = {s.name: s for s in child_specs(remote)}
    assert "model" not in specs
    assert "LLM_BASE_URL" not in specs["dispatch"].env  # inherited from the environment as is
    assert "https://api.example.com/v1 (LLM_BASE_URL)" in banner(remote)


async def test_wait_for_ready_waits_for_every_readyz_and_names_the_late_ones() -> None:
    asked: dict[str, int] = {"slow": 0}

    def readyz(name: str, ready_after: int) -> Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]:
        async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await reader.readuntil(b"\r\n\r\n")
            asked[name] = asked.get(name, 0) + 1
            status = b"200 OK" if asked[name] > ready_after else b"503 Service Unavailable"
            writer.write(b"HTTP/1.1 " + status + b"\r\nContent-Length: 0\r\n\r\n")
            await writer.drain()
            writer.close()

        return answer

    fast = await asyncio.start_server(readyz("fast", 0), "127.0.0.1", 0)
    slow = await asyncio.start_server(readyz("slow", 2), "127.0.0.1", 0)
    never = await asyncio.start_server(readyz("never", 10**6), "127.0.0.1", 0)
    ports = {name: server.sockets[0].getsockname()[1] for name, server in [("fast", fast), ("slow", slow)]}
    async with fast, slow, never:
        assert await wait_for_ready("127.0.0.1", ports, 30) == []
        assert asked["slow"] == 3  # polled until it answered 200
        never_port = never.sockets[0].getsockname()[1]
        assert await wait_for_ready("127.0.0.1", {**ports, "never": never_port}, 0.3) == ["never"]


async def test_a_child_exiting_with_a_fatal_code_stays_down_and_is_reported() -> None:
    out = io.StringIO()
    events: list[str] = []
    fatal: list[tuple[str, int]] = []
    supervisor = Supervisor(out=out, on_event=events.append, on_fatal=lambda name, code: fatal.append((name, code)))
    spec = ChildSpec(name="noapp", argv=[sys.executable, "-c", "raise SystemExit(4)"], fatal_exit_codes=frozenset({4}))
    await supervisor.start(spec)
    for _ in range(200):
        if fatal:
            break
        await asyncio.sleep(0.05)
    await supervisor.stop()
    assert fatal == [("noapp", 4)]
    assert sum(e.startswith("started noapp") for e in events) == 1  # never restarted
    assert "exited with 4: it cannot start as configured; not restarting" in out.getvalue()


def test_the_app_dir_reaches_every_service_and_only_app_loaders_are_fatal_on_exit_4(tmp_path: Path) -> None:
    from atmosphere.service import EXIT_APP_UNLOADABLE

    assert EXIT_APP_UNLOADABLE == dev.EXIT_APP_UNLOADABLE
    options = DevOptions(app="mypkg.agents:app", home=tmp_path / "home", app_dir=tmp_path, no_model=True)
    specs = {s.name: s for s in child_specs(options)}
    assert {s.env["ATMOSPHERE_APP_DIR"] for s in list(specs.values())[1:]} == {str(tmp_path.resolve())}
    fatal_on_4 = {n for n, s in specs.items() if EXIT_APP_UNLOADABLE in s.fatal_exit_codes}
    assert fatal_on_4 == {"dispatch", "governance", "sandbox"}
    assert specs["dispatch"].fatal_exit_codes == frozenset({EXIT_APP_UNLOADABLE, dev.EXIT_INVALID_SETTINGS})


def test_the_app_dir_defaults_to_atmosphere_app_dir_then_the_current_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[DevOptions] = []

    async def fake_run_dev(options: DevOptions) -> int:
        seen.append(options)
        return 0

    monkeypatch.setattr(cli_main, "run_dev", fake_run_dev)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "elsewhere").mkdir()  # an app dir must exist (else a usage error)
    (tmp_path / "sub").mkdir()
    monkeypatch.setenv("ATMOSPHERE_APP_DIR", str(tmp_path / "elsewhere"))
    assert cli_main.main(["dev", "--app", "a:b"]) == 0
    monkeypatch.delenv("ATMOSPHERE_APP_DIR")
    assert cli_main.main(["dev", "--app", "a:b"]) == 0
    assert cli_main.main(["dev", "--app", "a:b", "--app-dir", "sub"]) == 0
    assert [o.app_dir for o in seen] == [tmp_path / "elsewhere", tmp_path, tmp_path / "sub"]


async def test_preflight_names_the_distribution_of_a_missing_service(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_find_spec = importlib.util.find_spec

    def without_memory(name: str, package: str | None = None) -> object:
        return None if name == "atmosphere.memory" else real_find_spec(name, package)

    monkeypatch.setattr(importlib.util, "find_spec", without_memory)
    problem = await dev.preflight(DevOptions(app="a:b", home=tmp_path))
    assert problem is not None
    assert "atmosphere-ai-memory not installed" in problem
    assert "pip install atmosphere-ai-memory" in problem


async def test_the_app_check_passes_a_loadable_app_and_shows_the_users_error(tmp_path: Path) -> None:
    (tmp_path / "p_good_agents.py").write_text(
        "from atmosphere.sdk import App, agent\n\n@agent(name='hello')\nclass Hello:\n    pass\n\napp = App([Hello])\n"
    )
    (tmp_path / "p_bad_agents.py").write_text("import os\nraise RuntimeError('no API key for the weather service')\n")
    assert await dev.check_app(DevOptions(app="p_good_agents:app", home=tmp_path, app_dir=tmp_path)) is None
    problem = await dev.check_app(DevOptions(app="p_bad_agents:app", home=tmp_path, app_dir=tmp_path))
    assert problem is not None
    assert 'p_bad_agents.py", line 2' in problem  # the user's own line, from the traceback
    assert problem.endswith(
        f"Error: cannot load ATMOSPHERE_APP='p_bad_agents:app' from ATMOSPHERE_APP_DIR={str(tmp_path)!r}: "
        "RuntimeError: no API key for the weather service"
    )


async def test_the_app_check_finds_the_runtime_pools_to_start(tmp_path: Path) -> None:
    (tmp_path / "p_pooled_agents.py").write_text(
        "from atmosphere.sdk import App, agent\n\n"
        "@agent(name='a', runtime='pydantic-ai')\nclass A: ...\n\n"
        "@agent(name='b')\nclass B: ...\n\n"
        "app = App([A, B])\n"
    )
    (tmp_path / "p_plain_agents.py").write_text(
        "from atmosphere.sdk import App, agent\n\n@agent(name='b')\nclass B: ...\n\napp = App([B])\n"
    )
    pooled = DevOptions(app="p_pooled_agents:app", home=tmp_path, app_dir=tmp_path)
    assert await dev.inspect_app(pooled) == (None, ("pydantic-ai",))
    plain = DevOptions(app="p_plain_agents:app", home=tmp_path, app_dir=tmp_path)
    assert await dev.inspect_app(plain) == (None, ())


async def test_the_app_check_says_what_the_attribute_is_instead_of_an_app(tmp_path: Path) -> None:
    (tmp_path / "p_unset_agents.py").write_text("from atmosphere.sdk import App\n\napp = None\nreal = App()\n")
    problem = await dev.check_app(DevOptions(app="p_unset_agents:app", home=tmp_path, app_dir=tmp_path))
    assert problem is not None
    assert problem.endswith("p_unset_agents:app is None, not an atmosphere.sdk.App — did you forget `app = App(...)`?")
    assert "Traceback" not in problem  # a plain mistake, not the user's code failing
    typo = await dev.check_app(DevOptions(app="p_unset_agents:apq", home=tmp_path, app_dir=tmp_path))
    assert typo is not None
    assert typo.endswith("p_unset_agents has no attribute 'apq' (its App is 'real')")
