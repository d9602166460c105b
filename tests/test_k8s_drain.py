"""Every pod's `terminationGracePeriodSeconds` is its service's drain plus a margin.

Kubernetes sends SIGTERM, waits the grace, then kills. A grace shorter than the drain cuts work a
service was finishing (a tool call, a batch of events, a run handed back); a far longer one only
slows rollouts. So the drain of each service is derived here from what bounds its stop, read
from its settings (as its container would read them) and from the defaults of the code that
stops it, and each overlay's grace must equal it rounded up plus `MARGIN`; a runtime pool
(`atmosphere-dispatch-<runtime>`) drains as dispatch, from its own settings. docker-compose.yml's
`stop_grace_period`s are held to the same numbers in tests/test_deploy.py.
"""

from __future__ import annotations

import importlib
import inspect
import math
import os
import re
from collections.abc import Callable, Mapping
from typing import Any
from unittest import mock

import pytest
from pydantic_settings import BaseSettings

from atmosphere.bus import connect
from atmosphere.bus._nats import NatsBus
from atmosphere.bus.runs import MAX_NESTING
from atmosphere.dispatch.grpc_api import serve_grpc
from atmosphere.governance.policies.moderation import DEFAULT_TIMEOUT_SECONDS as MODERATION_TIMEOUT
from atmosphere.governance.screens.llm import DEFAULT_TIMEOUT_S as LLM_SCREEN_TIMEOUT
from atmosphere.service import load_service_app
from scripts.k8s_pods import named, pod_spec, workloads
from scripts.k8s_render import BASE, OVERLAYS, POOLS, SERVICES
from scripts.validate_k8s import rendered

MARGIN = 10
"""Seconds past the drain: the signal reaching the process, the last log lines, the exit."""
PRE_STOP_DELAY = 5
"""Seconds the endpoints of a stopping pod take to reach every proxy, at the least (kube-proxy,
ingress controllers): what ingress's pre-stop delay must cover in the manifests."""
FETCH_EXPIRY = 1.0
"""A batch consumer's fetch in progress ends within this (`NatsBus.consume_batches` waits for it)."""


def default(function: Callable[..., Any], parameter: str) -> float:
    """The default of `function`'s `parameter`: the drain a caller gets without choosing one."""
    return float(inspect.signature(function).parameters[parameter].default)


def settings_class(service: str) -> type[BaseSettings]:
    """`atmosphere.<service>.settings.<Service>Settings`."""
    module = importlib.import_module(f"atmosphere.{service}.settings")
    return getattr(module, f"{service.capitalize()}Settings")  # type: ignore[no-any-return]


def settings_of(service: str, environment: Mapping[str, str]) -> Any:
    """The settings `service` reads in a container whose whole environment is `environment`."""
    with mock.patch.dict(os.environ, environment, clear=True):
        return settings_class(service)()


def longest_tool_call(settings: Any) -> float:
    """The longest a sandbox tool call may run: the app's tools, and code_exec / eval when on."""
    tools = load_service_app(settings.app, settings.app_dir).tools
    timeouts = [tool.timeout for tool in tools.values()]
    timeouts += [settings.code.exec_timeout_seconds] if settings.code.enabled else []
    timeouts += [settings.eval.timeout_seconds] if settings.eval.enabled else []
    return max(timeouts)


def drain_seconds(service: str, settings: Any) -> float:
    """How long `service` may take from SIGTERM to exit, when everything in flight takes its longest."""
    closing = default(connect, "drain_timeout")  # the NATS connection's drain, last of all
    if service == "ingress":
        # It first goes on serving for the pre-stop delay (while the endpoints forget the pod);
        # then the drain grace bounds the rest of its stop, closing the bus included.
        return float(settings.ingress.pre_stop_delay + settings.ingress.drain_grace)
    if service == "dispatch":
        # gRPC calls first; then each nesting level's queue lets its runs in hand finish, one
        # queue after the other (the rest are handed back to ATMO_RUNS).
        queues = (MAX_NESTING + 1) * default(NatsBus.consume, "drain_timeout")
        return default(serve_grpc, "stop_grace") + queues + closing
    if service == "tape":
        return default(NatsBus.consume_batches, "drain_timeout") + FETCH_EXPIRY + closing
    if service == "sandbox":
        # The calls in flight finish; a wedged tool worker is killed past its grace.
        return longest_tool_call(settings) + float(settings.sandbox.tool_worker_grace_seconds) + closing
    if service == "governance":
        # Its slowest request waits on a model: the LLM screen, or an LLM moderation policy.
        return max(LLM_SCREEN_TIMEOUT, MODERATION_TIMEOUT) + closing
    if service == "memory":
        # Storing a fact waits for governance's screen.
        return float(settings.memory.screen_timeout) + closing
    raise AssertionError(service)


def container_environment(documents: list[dict[str, Any]], service: str) -> dict[str, str]:
    """The variables the ConfigMap and the manifest give `service`'s container."""
    # The generated ConfigMap's name carries its content hash.
    config = next(c for n, c in named(documents, "ConfigMap").items() if n.startswith("atmosphere-config-"))
    container = pod_spec(workloads(documents)[f"atmosphere-{service}"])["containers"][0]
    return {**config["data"], **{e["name"]: e["value"] for e in container.get("env", []) if "value" in e}}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_service_pod_waits_for_its_drain_and_a_margin(overlay: str) -> None:
    documents = rendered()[overlay]
    for service in SERVICES:
        settings = settings_of(service, container_environment(documents, service))
        grace = pod_spec(workloads(documents)[f"atmosphere-{service}"])["terminationGracePeriodSeconds"]
        wanted = math.ceil(drain_seconds(service, settings)) + MARGIN
        assert grace == wanted, f"{overlay}: atmosphere-{service} waits {grace} s; its drain needs {wanted} s"
    for pool in POOLS:
        settings = settings_of("dispatch", container_environment(documents, f"dispatch-{pool}"))
        grace = pod_spec(workloads(documents)[f"atmosphere-dispatch-{pool}"])["terminationGracePeriodSeconds"]
        wanted = math.ceil(drain_seconds("dispatch", settings)) + MARGIN
        assert grace == wanted, f"{overlay}: atmosphere-dispatch-{pool} waits {grace} s; its drain needs {wanted} s"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_ingress_goes_on_serving_while_its_endpoints_are_removed(overlay: str) -> None:
    # Kubernetes takes a stopping pod out of its endpoints as it signals it; proxies hear of it
    # seconds later and still send new clients meanwhile, whom a closed listener would refuse.
    settings = settings_of("ingress", container_environment(rendered()[overlay], "ingress"))
    assert settings.ingress.pre_stop_delay >= PRE_STOP_DELAY
    # Its default is none: `atmosphere dev` and the tests stop at once.
    assert settings_of("ingress", {}).ingress.pre_stop_delay == 0


def test_nats_waits_for_its_lame_duck_period_and_a_margin() -> None:
    config = (BASE / "nats" / "nats.conf").read_text()
    seconds = {key: int(value) for key, value in re.findall(r"^(lame_duck_\w+): (\d+)s$", config, re.MULTILINE)}
    assert set(seconds) == {"lame_duck_duration", "lame_duck_grace_period"}
    for documents in rendered().values():
        grace = pod_spec(workloads(documents)["nats"])["terminationGracePeriodSeconds"]
        assert grace == sum(seconds.values()) + MARGIN


def test_the_drain_follows_the_settings_a_manifest_would_change() -> None:
    # The derivation reads the container's settings: a manifest that changes one changes the drain.
    assert drain_seconds("ingress", settings_of("ingress", {"ATMOSPHERE_INGRESS__DRAIN_GRACE": "45"})) == 45
    delayed = {"ATMOSPHERE_INGRESS__DRAIN_GRACE": "45", "ATMOSPHERE_INGRESS__PRE_STOP_DELAY": "5"}
    assert drain_seconds("ingress", settings_of("ingress", delayed)) == 50
    plain = settings_of("sandbox", {"ATMOSPHERE_APP": "examples.assistant:app"})
    graceful = settings_of(
        "sandbox", {"ATMOSPHERE_APP": "examples.assistant:app", "ATMOSPHERE_SANDBOX__TOOL_WORKER_GRACE_SECONDS": "9"}
    )
    assert drain_seconds("sandbox", graceful) - drain_seconds("sandbox", plain) == 8
    memory = settings_of("memory", {"ATMOSPHERE_MEMORY__SCREEN_TIMEOUT": "12"})
    assert drain_seconds("memory", memory) == 12 + default(connect, "drain_timeout")
