import asyncio
import io
import sys
from pathlib import Path

from atmosphere.cli.dev import SERVICES, DevOptions, banner, child_specs, wait_for_ready
from atmosphere.cli.supervisor import ChildSpec, Supervisor, restart_delay


def test_child_specs_start_the_broker_first_and_ingress_last(tmp_path: Path) -> None:
    options = DevOptions(
        app="examples.echo:app", home=tmp_path, nats_port=5000, http_port=5001, probe_base_port=5100, no_model=True
    )
    specs = child_specs(options)
    assert [s.name for s in specs] == ["nats", *SERVICES]
    assert specs[-1].name == "ingress"
    assert specs[-1].env["ATMOSPHERE_INGRESS__PORT"] == "5001"
    probes = {s.name: s.env.get("ATMOSPHERE_PROBE_PORT") for s in specs[1:-1]}
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
    assert "Authorization: Bearer s3cret-token" in banner(options)
    assert "/atmosphere/v1" not in banner(options)


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

    def readyz(name: str, ready_after: int) -> object:
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
