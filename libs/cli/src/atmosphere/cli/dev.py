"""`atmosphere dev`: nats-server and the six services on one machine, for development.

`--cluster 3` runs a 3-node JetStream cluster and two replicas of every service instead (see
`atmosphere.cli.dev_layout`), to watch the system lose a node or a replica and keep serving.
"""

from __future__ import annotations

import asyncio
import dataclasses
import importlib.util
import json
import signal
import socket
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from atmosphere.cli.app_check import POOLS_LINE
from atmosphere.cli.credentials import DEV_CREDENTIALS_DIR, DevCredentials, dev_credentials
from atmosphere.cli.dev_layout import SERVICES, DevLayout, Listener, NatsNode, ServiceProcess, dev_layout, taken_ports
from atmosphere.cli.model_server import LOCAL_MODEL_INSTALL, llama_available, smollm2_path
from atmosphere.cli.nats_server import NatsServerNotFoundError, cluster_node_args, find_binary, server_args
from atmosphere.cli.supervisor import ChildSpec, Supervisor

__all__ = [
    "APP_CHECK_TIMEOUT",
    "APP_LOADERS",
    "CRASH_LOOP_EXITS",
    "EXIT_APP_UNLOADABLE",
    "EXIT_INVALID_SETTINGS",
    "LOCAL_MODEL_ALIAS",
    "NATS_READY_TIMEOUT",
    "READY_TIMEOUT",
    "SERVICES",
    "DevOptions",
    "banner",
    "check_app",
    "child_specs",
    "missing_services",
    "preflight",
    "run_dev",
    "wait_for_ready",
]

LOCAL_MODEL_ALIAS = "smollm2"
APP_LOADERS = frozenset({"dispatch", "governance", "sandbox"})
"""The services that import the app (governance for its Python policies): when one cannot, the
whole stack stops. Restarting it would only fail again, and while the first of them to fail is
not yet known to the stack, another's exit must not count as a crash to retry."""
EXIT_APP_UNLOADABLE = 4
"""`atmosphere.service.EXIT_APP_UNLOADABLE`, repeated: the CLI must run before that import is known to work."""
EXIT_INVALID_SETTINGS = 78
"""`atmosphere.service.EXIT_INVALID_SETTINGS`, repeated likewise: every service stops the stack with it."""
FATAL_EXITS = {EXIT_APP_UNLOADABLE: "its app cannot be imported", EXIT_INVALID_SETTINGS: "its settings are invalid"}
"""The exit codes a restart cannot cure, and what each means."""
CRASH_LOOP_EXITS = 3
"""Exits of one child while the stack starts after which it counts as crash-looping: the stack stops
(a service that cannot start would otherwise be restarted until the readiness wait runs out)."""
APP_CHECK_TIMEOUT = 60.0
"""Seconds the app's module may take to import in the check before anything starts."""
READY_TIMEOUT = 60.0
"""Seconds the services of one process each may take to become ready (a cluster's twelve get three times this)."""
NATS_READY_TIMEOUT = 30.0
"""Seconds the broker may take to accept clients (a cluster: to elect its JetStream meta leader)."""
PROVISION_TIMEOUT = 120.0
"""Seconds provisioning the JetStream layout may take (it waits up to a minute for a cluster's leaders)."""


@dataclass(frozen=True, slots=True)
class DevOptions:
    """What `atmosphere dev` was asked for."""

    app: str
    home: Path
    app_dir: Path = Path()
    """Put first on `sys.path` before the app is imported (`ATMOSPHERE_APP_DIR`, else the current directory)."""
    nats_port: int = 4222
    """The client port (of the first node; node i listens on `nats_port + i`)."""
    http_port: int = 8080
    probe_base_port: int = 8181
    grpc_port: int = 50051
    model_port: int = 8090
    host: str = "127.0.0.1"
    llm_base_url: str = ""
    """`LLM_BASE_URL` from the environment; empty starts the local model (unless `no_model`)."""
    no_model: bool = False
    openai_enabled: bool = True
    """Serve the OpenAI-compatible API (`ATMOSPHERE_AI_OPENAI_ENABLED`, on unless set false)."""
    admin_token: str = ""
    """The token of `/api/admin/*`: `ATMOSPHERE_ADMIN_TOKEN`, else one made for this run."""
    admin_token_given: bool = False
    """Whether `admin_token` is the operator's (`ATMOSPHERE_ADMIN_TOKEN`): never printed then."""
    cluster: int = 1
    """nats-server nodes: 1 runs one process per service; more (3) a JetStream cluster and two
    replicas of every service, ingress on `http_port` and the next, dispatch's gRPC likewise."""
    nats_cluster_port: int = 6222
    """The route port of the first node of a cluster (node i: `nats_cluster_port + i`)."""
    nats_monitor_port: int = 8222
    """The monitoring port of the first node of a cluster (node i: `nats_monitor_port + i`)."""
    auth: bool = False
    """Log every service in as its own NATS user with its subject permissions (`--auth`): fresh
    credentials under `<home>/nats-credentials/` each start, `observer.env` for outside readers."""
    pools: tuple[str, ...] = ()
    """The runtime pools the app pins agents to (found by the app check): each gets a dispatch
    process of its own (`dispatch-<runtime>`), beside the default pool's `dispatch`."""
    pool_python: tuple[tuple[str, str], ...] = ()
    """`(runtime, interpreter)` pairs (`--pool-python`): the pools that run on an interpreter of
    their own, one whose environment has their adapter (the pinned adapters' `.venvs/pinned`)."""
    default_runtime: str = "built-in"
    """`ATMOSPHERE_DISPATCH__RUNTIME` of the default pool (the environment's, else `built-in`:
    the stack runs the same runtime whichever framework adapters happen to be installed)."""

    @property
    def local_model(self) -> bool:
        """Whether the stack runs its own model child."""
        return not self.llm_base_url and not self.no_model and llama_available() and smollm2_path() is not None


def _admin_token_shown(options: DevOptions) -> str:
    """The admin token as the banner shows it: one made for this run, never one the operator set.

    A token from `ATMOSPHERE_ADMIN_TOKEN` is the operator's secret, and the banner is output a
    log collector may keep: it names the variable instead.
    """
    if not options.admin_token:
        return "<unset>"
    if options.admin_token_given:
        return "$ATMOSPHERE_ADMIN_TOKEN"
    return options.admin_token


def _probe_ports(options: DevOptions) -> dict[str, int]:
    return {p.name: p.probe_port for p in sorted(dev_layout(options).processes, key=lambda p: p.name) if p.probe_port}


def _nats_spec(options: DevOptions, layout: DevLayout, node: NatsNode, credentials: DevCredentials | None) -> ChildSpec:
    node.store_dir.mkdir(parents=True, exist_ok=True)
    if not layout.clustered:
        args = server_args(port=node.port, store_dir=node.store_dir, host=options.host)
    else:
        # Every node gets every route (its own is ignored): any one may restart alone and rejoin.
        args = cluster_node_args(
            name=node.name,
            port=node.port,
            cluster_port=node.cluster_port,
            monitor_port=node.monitor_port,
            routes=[n.route(options.host) for n in layout.nodes],
            store_dir=node.store_dir,
            host=options.host,
        )
    if credentials is not None:
        args += ["-c", str(credentials.server_config)]  # every role's user and permissions
    return ChildSpec(name=node.name, argv=[str(find_binary()), *args])


def _model_spec(options: DevOptions) -> ChildSpec:
    """The local model server (llama.cpp) as a child."""
    argv = [sys.executable, "-m", "atmosphere.cli.model_server", "--host", options.host]
    return ChildSpec(name="model", argv=[*argv, "--port", str(options.model_port), "--alias", LOCAL_MODEL_ALIAS])


def child_specs(options: DevOptions) -> list[ChildSpec]:
    """The nats-server children, the provisioning step, and the service children, in start order."""
    layout = dev_layout(options)
    # With `--auth` the broker knows every role's user (its arguments) and each service logs in
    # as its own (its environment): all that says how a child reaches NATS.
    credentials = dev_credentials(options.home) if options.auth else None
    specs = [_nats_spec(options, layout, node, credentials) for node in layout.nodes]
    common = {
        "ATMOSPHERE_NATS__URL": layout.nats_url(options.host),
        # Every pool's queue is provisioned, and every dispatch knows them all.
        "ATMOSPHERE_DISPATCH__POOLS": ",".join(options.pools),
        "ATMOSPHERE_APP": options.app,
        "ATMOSPHERE_APP_DIR": str(options.app_dir.resolve()),
        "ATMOSPHERE_PROBE_HOST": options.host,
    }
    if layout.clustered:
        common["ATMOSPHERE_JETSTREAM__REPLICAS"] = str(layout.stream_replicas)
    # The layout first, by the provisioner (with `--auth`, its own login: no service's may make
    # it). The services then find it; dispatch's settings shape the run queue, and the step
    # reads them from the same environment dispatch does.
    specs.append(
        ChildSpec(
            name="provision",
            argv=[sys.executable, "-m", "atmosphere.dispatch.provision"],
            env={**common, **(credentials.env["provisioner"] if credentials is not None else {})},
            once=True,
        )
    )
    if options.local_model:
        specs.append(_model_spec(options))
    for process in layout.processes:
        name = process.service
        env = {
            **common,
            "ATMOSPHERE_DATA_DIR": str(process.data_dir),
            "ATMOSPHERE_WORKSPACE_ROOT": str(process.workspace_root),
            **(credentials.env[name] if credentials is not None else {}),
        }
        env.update(_own_env(options, process))
        fatal = frozenset({EXIT_INVALID_SETTINGS, *([EXIT_APP_UNLOADABLE] if name in APP_LOADERS else [])})
        python = dict(options.pool_python).get(process.pool, sys.executable) if process.pool else sys.executable
        specs.append(
            ChildSpec(name=process.name, argv=[python, "-m", f"atmosphere.{name}"], env=env, fatal_exit_codes=fatal)
        )
    return specs


def _own_env(options: DevOptions, process: ServiceProcess) -> dict[str, str]:
    """What one service process is told beside the stack's common settings: where it listens, and more."""
    if process.service == "ingress":
        env = {"ATMOSPHERE_INGRESS__HOST": options.host, "ATMOSPHERE_INGRESS__PORT": str(process.http_port)}
        # On a developer's machine every surface is on: each agent is an OpenAI model of its
        # own name, and the admin reads answer to the token in the banner.
        env["ATMOSPHERE_AI_OPENAI_ENABLED"] = "true" if options.openai_enabled else "false"
        if options.admin_token:
            env["ATMOSPHERE_ADMIN_TOKEN"] = options.admin_token
        return env
    env = {"ATMOSPHERE_PROBE_PORT": str(process.probe_port)}
    if process.service == "dispatch":
        env["ATMOSPHERE_DISPATCH__GRPC_HOST"] = options.host
        env["ATMOSPHERE_DISPATCH__GRPC_PORT"] = str(process.grpc_port)
        env["ATMOSPHERE_DISPATCH__POOL"] = process.pool
        env["ATMOSPHERE_DISPATCH__RUNTIME"] = options.default_runtime
        if options.local_model:
            env["LLM_BASE_URL"] = f"http://{options.host}:{options.model_port}/v1"
            env["LLM_MODEL"] = LOCAL_MODEL_ALIAS
    return env


def missing_services() -> list[str]:
    """The distributions of services whose module this interpreter cannot import."""
    return [f"atmosphere-ai-{name}" for name in SERVICES if importlib.util.find_spec(f"atmosphere.{name}") is None]


async def check_app(options: DevOptions) -> str | None:
    """Import the app in a throw-away process as the services will; the error text, or None when it loads."""
    problem, _ = await inspect_app(options)
    return problem


async def inspect_app(options: DevOptions) -> tuple[str | None, tuple[str, ...]]:
    """`check_app`'s answer, and the runtime pools the app pins agents to (when it loads)."""
    app_dir = str(options.app_dir.resolve())
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "atmosphere.cli.app_check",
        options.app,
        app_dir,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    try:
        output, _ = await asyncio.wait_for(process.communicate(), APP_CHECK_TIMEOUT)
    except TimeoutError:
        process.kill()
        await process.wait()
        return f"Error: importing ATMOSPHERE_APP={options.app!r} took more than {APP_CHECK_TIMEOUT:g} s", ()
    text = output.decode(errors="replace")
    if process.returncode == 0:
        listed = [line.removeprefix(POOLS_LINE) for line in text.splitlines() if line.startswith(POOLS_LINE)]
        return None, tuple(p for p in (listed[-1] if listed else "").split(",") if p)
    return text.rstrip() or f"Error: the app check exited with {process.returncode}", ()


async def preflight(options: DevOptions) -> str | None:
    """Why the stack cannot start (a missing service, broker or app), or None when it can."""
    return missing_tools() or await check_app(options)


def missing_tools() -> str | None:
    """Why the stack cannot start for want of a service or the broker, or None."""
    if missing := missing_services():
        return (
            f"Error: {', '.join(missing)} not installed in {sys.prefix}; "
            f"install them (`pip install {' '.join(missing)}`, or `atmosphere-ai-cli`, which pulls in every service)"
        )
    try:
        find_binary()
    except NatsServerNotFoundError as exc:
        return f"Error: {exc}"
    return None


def _login(options: DevOptions) -> str:
    """How an outside client logs in, when it must."""
    if not options.auth:
        return ""
    return f"   (login: {options.home / DEV_CREDENTIALS_DIR / 'observer.env'} reads runs)"


def banner(options: DevOptions) -> str:
    """The addresses a developer needs, printed once everything started."""
    http = f"http://{options.host}:{options.http_port}"
    if options.local_model:
        model = f"http://{options.host}:{options.model_port}/v1 (local {LOCAL_MODEL_ALIAS}, llama.cpp)"
    elif options.llm_base_url:
        model = f"{options.llm_base_url} (LLM_BASE_URL)"
    elif options.no_model:
        model = "none (--no-model): set LLM_BASE_URL to an OpenAI-compatible server"
    else:
        model = f"none: set LLM_BASE_URL, or {LOCAL_MODEL_INSTALL}"
    layout = dev_layout(options)
    if layout.clustered:
        return _cluster_banner(options, layout, model)
    lines = [
        "",
        "Atmosphere dev stack",
        f"  app        {options.app}",
        f"  http       {http}   (GET /readyz)",
        f"  websocket  ws://{options.host}:{options.http_port}/atmosphere/agent/<agent>",
        f"  sse        POST {http}/atmosphere/agent/<agent>   (text/event-stream)",
        *([f"  openai     {http}/atmosphere/v1   (model = agent name)"] if options.openai_enabled else []),
        *([f"  responses  {http}/atmosphere/v1/responses   (the Responses API)"] if options.openai_enabled else []),
        f"  console    {http}/atmosphere/console/   (chat, workspace, tape, governance)",
        f"  info       {http}/api/console/info   (what is served: runtimes, doors)",
        f"  admin      {http}/api/admin/...   (Authorization: Bearer {_admin_token_shown(options)})",
        f"  openapi    {http}/docs",
        f"  grpc       {options.host}:{options.grpc_port}   (atmosphere.contracts.dispatch.v1.DispatchService)",
        f"  model      {model}",
        f"  nats       nats://{options.host}:{options.nats_port}{_login(options)}",
        f"  data       {options.home}",
        "  probes     " + ", ".join(f"{n} :{p}" for n, p in _probe_ports(options).items()),
        "Ctrl-C stops everything.",
        "",
    ]
    return "\n".join(lines)


def _cluster_banner(options: DevOptions, layout: DevLayout, model: str) -> str:
    """The banner of `--cluster`: every replica's address, the first ingress's in the examples."""
    host = options.host
    ingresses = [f"http://{host}:{p.http_port}" for p in layout.of("ingress")]
    http = ingresses[0]
    grpc = ", ".join(f"{host}:{p.grpc_port}" for p in layout.of("dispatch"))
    lines = [
        "",
        f"Atmosphere dev stack: {len(layout.nodes)}-node NATS cluster, "
        f"{len(layout.of('ingress'))} replicas of every service",
        f"  app        {options.app}",
        f"  http       {', '.join(ingresses)}   (one ingress each; GET /readyz)",
        f"  websocket  ws://{host}:{options.http_port}/atmosphere/agent/<agent>",
        f"  sse        POST {http}/atmosphere/agent/<agent>   (text/event-stream)",
        *([f"  openai     {http}/atmosphere/v1   (model = agent name)"] if options.openai_enabled else []),
        *([f"  responses  {http}/atmosphere/v1/responses   (the Responses API)"] if options.openai_enabled else []),
        f"  console    {http}/atmosphere/console/   (chat, workspace, tape, governance)",
        f"  info       {http}/api/console/info   (what is served: runtimes, doors)",
        f"  admin      {http}/api/admin/...   (Authorization: Bearer {_admin_token_shown(options)})",
        f"  openapi    {http}/docs",
        f"  grpc       {grpc}   (atmosphere.contracts.dispatch.v1.DispatchService)",
        f"  model      {model}",
        f"  nats       {layout.nats_url(host)}   (JetStream, {layout.stream_replicas} replicas of every stream)"
        f"{_login(options)}",
        "  nats nodes "
        + ", ".join(f"{n.name} :{n.port} routes :{n.cluster_port} /healthz :{n.monitor_port}" for n in layout.nodes),
        f"  data       {options.home}   (nats-<i>/, data-<service>-<n>/)",
        "  probes     " + ", ".join(f"{n} :{p}" for n, p in _probe_ports(options).items()),
        "Ctrl-C stops everything.",
        "",
    ]
    return "\n".join(lines)


def _port_open(host: str, port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.2)
        return sock.connect_ex((host, port)) == 0


_MAX_PROBE_RESPONSE = 64 * 1024


async def _read_to_end(reader: asyncio.StreamReader) -> bytes:
    data = b""
    while len(data) < _MAX_PROBE_RESPONSE and (chunk := await reader.read(_MAX_PROBE_RESPONSE - len(data))):
        data += chunk
    return data


async def _ready(host: str, port: int, path: str = "/readyz", instance: str | None = None) -> bool:
    """Whether `GET <path>` on host:port answers 200, from `instance` when given (stdlib only: no HTTP client)."""
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), 1)
    except (OSError, TimeoutError):
        return False
    try:
        writer.write(f"GET {path} HTTP/1.0\r\nHost: {host}\r\n\r\n".encode())
        response = await asyncio.wait_for(_read_to_end(reader), 1)
    except (OSError, TimeoutError):
        return False
    finally:
        writer.close()
    head, _, body = response.partition(b"\r\n\r\n")
    if head.split(b" ")[1:2] != [b"200"]:
        return False
    if instance is None:
        return True
    try:
        answer = json.loads(body)
    except ValueError:
        return False
    return isinstance(answer, dict) and answer.get("instance") == instance


async def wait_for_ready(
    host: str,
    ports: dict[str, int],
    timeout: float,
    *,
    path: str = "/readyz",
    instance_of: Callable[[str], str | None] | None = None,
    give_up: Callable[[], bool] | None = None,
) -> list[str]:
    """Wait until every service's `/readyz` (or `path`) answers 200; return those still not ready.

    A listening port is not enough: dispatch is ready only once its agents are in `ATMO_AGENTS`,
    and a banner printed before that sends the developer's first request to "Unknown agent".
    Nor is any 200: with `instance_of`, only an answer whose `instance` is the one expected of
    that name counts (another stack may hold the port while the child crash-loops on it). The
    wait ends early, with whatever is still waiting, once `give_up()` is true.
    """

    async def answered(name: str, port: int) -> bool:
        if instance_of is None:
            return await _ready(host, port, path)
        instance = instance_of(name)  # None: the child is not running now (between restarts)
        return instance is not None and await _ready(host, port, path, instance)

    deadline = time.monotonic() + timeout
    waiting = dict(ports)
    while waiting:
        answers = await asyncio.gather(*(answered(name, port) for name, port in waiting.items()))
        waiting = {name: port for (name, port), ok in zip(waiting.items(), answers, strict=True) if not ok}
        if not waiting or time.monotonic() >= deadline or (give_up is not None and give_up()):
            break
        await asyncio.sleep(0.1)
    return sorted(waiting)


async def _wait_for_port(host: str, port: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if _port_open(host, port):
            return True
        await asyncio.sleep(0.05)
    return False


async def _broker_ready(host: str, layout: DevLayout) -> bool:
    """Whether the broker came up: one node accepts clients, or every node of a cluster is healthy.

    On a cluster a listening port is not enough: until a JetStream meta leader is elected every
    service's provisioning fails, so `/healthz` (200 once the node knows its leader) is awaited.
    """
    if not layout.clustered:
        return await _wait_for_port(host, layout.nodes[0].port, 10)
    monitors = {node.name: node.monitor_port for node in layout.nodes}
    return not await wait_for_ready(host, monitors, NATS_READY_TIMEOUT, path="/healthz")


def _taken_message(host: str, taken: list[tuple[Listener, str]]) -> str:
    """Which ports are taken, what each is for, and the flags that move them."""
    flags = " or ".join(dict.fromkeys(listener.flag for listener, _ in taken))
    if len(taken) == 1:
        listener, reason = taken[0]
        return (
            f"Error: port {host}:{listener.port} ({listener.purpose}) {reason}; is another stack running? "
            f"Stop it, or move the port with {flags}"
        )
    lines = [f"  port {host}:{listener.port} ({listener.purpose}) {reason}" for listener, reason in taken]
    first = f"Error: {len(taken)} ports of the stack are taken; is another stack running? Stop it, or move them with"
    return "\n".join([f"{first} {flags}:", *lines])


def _instances(supervisor: Supervisor) -> Callable[[str], str | None]:
    """The `/readyz` instance (host:pid, as `atmosphere.service.Health` reports it) each child must report."""
    host = socket.gethostname()

    def instance(name: str) -> str | None:
        pid = supervisor.pid(name)
        return f"{host}:{pid}" if pid is not None else None

    return instance


def _crash_looping(supervisor: Supervisor) -> list[str]:
    return [
        f"{name} (exit {supervisor.last_exit_code(name)})"
        for name in supervisor.names
        if supervisor.exits(name) >= CRASH_LOOP_EXITS
    ]


async def _start_stack(
    options: DevOptions, layout: DevLayout, supervisor: Supervisor, stop: asyncio.Event
) -> str | None:
    """Start the broker, then every other child, and wait until each service is ready.

    Returns why the stack is not serving (None: every service is ready, or `stop` was set
    meanwhile: Ctrl-C, or a child's fatal exit, which `run_dev` reports).
    """
    specs = child_specs(options)
    brokers = len(layout.nodes)
    for spec in specs[:brokers]:
        await supervisor.start(spec)
    if not await _broker_ready(options.host, layout):
        return "Error: nats-server did not start; see its log lines above"
    for spec in specs[brokers:]:
        if not spec.once:
            await supervisor.start(spec)
            continue
        code = await supervisor.run_once(spec, timeout=PROVISION_TIMEOUT)
        if stop.is_set():
            return None
        if code != 0:
            how = "timed out" if code is None else f"exit {code}"
            why = f": {FATAL_EXITS[code]}" if code in FATAL_EXITS else ""
            return f"Error: {spec.name} failed ({how}){why}; see its log lines above"
    readiness = {p.name: p.ready_port for p in layout.processes}
    timeout = READY_TIMEOUT * (3 if layout.clustered else 1)
    late = await wait_for_ready(
        options.host,
        readiness,
        timeout,
        instance_of=_instances(supervisor),
        # Ctrl-C or a fatal exit stops the wait at once, and so does a child that keeps crashing.
        give_up=lambda: stop.is_set() or bool(_crash_looping(supervisor)),
    )
    if stop.is_set() or not late:
        return None
    if looping := _crash_looping(supervisor):
        return f"Error: crash-looping while the stack started: {', '.join(looping)}; see their log lines above"
    return f"Error: not ready after {timeout:g} s: {', '.join(late)}; see their log lines above"


async def run_dev(options: DevOptions) -> int:
    """Run the stack until SIGINT or SIGTERM; return the exit code.

    Nothing starts while a port of the stack is taken; the banner is printed only once every
    service answers `/readyz` as the very process started for it; a child that exits with a
    code a restart cannot cure (`FATAL_EXITS`), one that keeps crashing while the stack starts,
    or a service not ready in time stops the whole stack with exit 1.
    """
    if taken := taken_ports(options):
        print(_taken_message(options.host, taken), file=sys.stderr)
        return 1
    pools: tuple[str, ...] = ()
    problem = missing_tools()
    if problem is None:
        problem, pools = await inspect_app(options)
    if problem:
        print(problem, file=sys.stderr)
        return 1
    options = dataclasses.replace(options, pools=pools)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    fatal: list[str] = []

    def on_fatal(name: str, code: int) -> None:
        fatal.append(f"{name} exited with {code}: {FATAL_EXITS.get(code, 'it cannot start as configured')}")
        stop.set()

    supervisor = Supervisor(on_fatal=on_fatal)
    try:
        failure = await _start_stack(options, dev_layout(options), supervisor, stop)
        if failure is not None:
            print(f"{failure}; stopping", file=sys.stderr, flush=True)
        elif not stop.is_set():
            print(banner(options), flush=True)
            await stop.wait()
        if failure is None:
            print("\nstopping...", flush=True)
    finally:
        await supervisor.stop()
    if fatal:
        print(
            f"Error: {'; '.join(fatal)}; the stack cannot run as configured: see the log lines above", file=sys.stderr
        )
        return 1
    return 1 if failure is not None else 0
