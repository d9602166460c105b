"""The image, docker-compose.yml and the Kubernetes base match the code, and compose the manifests.

The Kubernetes base is built with the real kustomize (`kubectl kustomize`, pinned and installed by
scripts/install_kubectl.py); the overlays are checked in tests/test_k8s_*.py. docker-compose.yml
is validated against the Compose schema (scripts/validate_compose.py: `docker compose config`
needs the Compose plugin, which the dev machines lack) and held to the production overlay: the
same services and runtime pools, variables, probes, grace periods, credentials and NATS
configuration. Every YAML file is read with a loader that rejects duplicate keys
(scripts/strict_yaml.py).
"""

from __future__ import annotations

import copy
import importlib.metadata
import re
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from atmosphere.config import env_names
from scripts.k8s_pods import pod_spec, workloads
from scripts.k8s_pools import configured_pools, deployed_pools
from scripts.k8s_render import BASE, POOLS, ROOT, SERVICES, build, kustomize
from scripts.strict_yaml import strict_load, strict_load_all
from scripts.validate_compose import InterpolationError, interpolate, load, schema_errors
from scripts.validate_k8s import rendered
from tests.test_k8s_drain import container_environment, settings_class
from tests.test_k8s_overlays import PROVIDERS, workspace_version
from tests.test_runtime_adapters import PINNED_RUNTIMES

Document = dict[str, Any]
NODES = ("nats-0", "nats-1", "nats-2")
STATEFUL = ("governance", "memory", "tape")
NATS_CONFIG = "./deploy/k8s/base/nats/nats.conf"
CREDENTIALS = "deploy/compose/credentials"
OPTIONAL_SECRETS = {
    "atmosphere-llm": ".env",
    "atmosphere-ingress": "deploy/compose/ingress.env",
    "atmosphere-anthropic": "deploy/compose/anthropic.env",
    "atmosphere-cohere": "deploy/compose/cohere.env",
    "atmosphere-gemini": "deploy/compose/gemini.env",
}
"""The cluster's optional Secrets and the compose files that play their part."""
CREDENTIAL = {"anthropic": "ANTHROPIC_API_KEY", "cohere": "CO_API_KEY", "adk": "GOOGLE_API_KEY"}
"""The API key each native-SDK pool (`PROVIDERS`: a Secret of its own, not `atmosphere-llm`) reads."""
POOL_SERVICES = {f"dispatch-{pool}": pool for pool in POOLS}
"""The runtime pools as compose names them (the manifests: `atmosphere-dispatch-<runtime>`)."""
ROLES = {**{s: s for s in SERVICES}, **dict.fromkeys(POOL_SERVICES, "dispatch")}
"""Whose settings and NATS login each compose service has: a pool is a dispatch."""
OBSERVABILITY = ("prometheus", "grafana", "otel-collector", "jaeger")
"""The services of the `observability` profile (tests/test_observability.py); the others run always."""
TRACING = {"OTEL_EXPORTER_OTLP_ENDPOINT": ""}
"""What every service of compose sets for traces by default (x-config): none are made."""


def untraced(environment: Document) -> Document:
    """`environment` without its tracing variables, which must be their defaults (tracing off)."""
    tracing = {k: environment.pop(k) for k in list(environment) if k.startswith("OTEL_")}
    assert tracing == TRACING
    return environment


def known(service: str) -> set[str]:
    return set(env_names(settings_class(service)))


def runtime_environment(runtime: str) -> set[str]:
    """The variables a runtime adapter reads besides dispatch's (its `environment`)."""
    [entry] = importlib.metadata.entry_points(group="atmosphere.runtimes", name=runtime)
    return set(entry.load().environment)


def seconds(duration: str) -> int:
    match = re.fullmatch(r"(\d+)s", duration)
    assert match is not None, f"write durations in whole seconds: {duration!r}"
    return int(match.group(1))


def probed(healthcheck: Document) -> tuple[int, str]:
    """(port, path) a compose healthcheck requests on the container's loopback."""
    match = re.search(r"http://127\.0\.0\.1:(\d+)(/[^'\s]*)", " ".join(healthcheck["test"]))
    assert match is not None, healthcheck
    return int(match.group(1)), match.group(2)


def readiness(container: Document) -> tuple[int, str]:
    """(port, path) of a container's readiness probe."""
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    probe = container["readinessProbe"]["httpGet"]
    return ports.get(probe["port"], probe["port"]), probe["path"]


def env_files(service: Document) -> set[tuple[str, bool]]:
    """(path, required) of each env_file of a compose service."""
    entries = [e if isinstance(e, dict) else {"path": e} for e in service.get("env_file", [])]
    return {(e["path"], e.get("required", True)) for e in entries}


@pytest.fixture(scope="module")
def compose() -> Document:
    """docker-compose.yml as Compose reads it, with no variable set (the defaults)."""
    return load()


@pytest.fixture(scope="module")
def production() -> list[Document]:
    return rendered()["production"]


def test_the_strict_loader_rejects_duplicate_keys_at_any_depth() -> None:
    assert strict_load("a: 1\nb: {c: 2}\n") == {"a": 1, "b": {"c": 2}}
    assert strict_load("x: &x {a: 1, b: 2}\ny:\n  <<: *x\n  b: 3\n")["y"] == {"a": 1, "b": 3}
    for text in ("a: 1\na: 2\n", "spec:\n  volumes: []\n  volumes: []\n"):
        with pytest.raises(yaml.constructor.ConstructorError, match="duplicate key"):
            strict_load(text)


def test_every_deploy_file_has_unique_keys() -> None:
    for path in (*sorted((ROOT / "deploy").rglob("*.yaml")), ROOT / "docker-compose.yml"):
        assert strict_load_all(path.read_text()), path


def test_the_base_kustomization_uses_every_file_of_the_base() -> None:
    kustomization = strict_load((BASE / "kustomization.yaml").read_text())
    used = {
        *kustomization["resources"],
        *(p["path"] for p in kustomization["patches"]),
        *(f for g in kustomization["configMapGenerator"] for f in g.get("files", [])),
    }
    present = {str(p.relative_to(BASE)) for p in BASE.rglob("*") if p.is_file() and p.name != "kustomization.yaml"}
    assert used == present


def test_the_builder_refuses_an_object_defined_twice(tmp_path: Path) -> None:
    # The defect the old tests missed: the same claim in two documents must fail the build.
    claim = "apiVersion: v1\nkind: PersistentVolumeClaim\nmetadata:\n  name: twice\nspec: {}\n"
    (tmp_path / "claims.yaml").write_text(f"{claim}---\n{claim}")
    (tmp_path / "kustomization.yaml").write_text("resources:\n  - claims.yaml\n")
    result = kustomize(tmp_path)
    assert result.returncode != 0
    assert "already registered id" in result.stderr


def test_the_base_builds_and_labels_every_object_and_pod() -> None:
    documents = build(BASE)
    # The kustomization's labels reached every object and pod, so the build really applied it.
    assert all(d["metadata"]["labels"]["app.kubernetes.io/part-of"] == "atmosphere" for d in documents)
    assert all(
        w["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/part-of"] == "atmosphere"
        for w in workloads(documents).values()
    )
    assert set(workloads(documents)) == {"nats", "atmosphere-provision", *(f"atmosphere-{s}" for s in SERVICES)}


def test_dockerfile_builds_any_service_with_the_pinned_uv() -> None:
    dockerfile = (ROOT / "deploy/docker/service.Dockerfile").read_text()
    makefile = (ROOT / "Makefile").read_text()
    uv_version = re.search(r"^UV_VERSION := (\S+)$", makefile, re.M)
    assert uv_version is not None
    assert f"ghcr.io/astral-sh/uv:{uv_version.group(1)}" in dockerfile
    assert "--package atmosphere-ai-${SERVICE}" in dockerfile
    assert "exec python -m atmosphere.$SERVICE" in dockerfile
    # A runtime pool's image: dispatch and one adapter, RUNTIME (none unless given), in both syncs.
    assert re.search(r'^ARG RUNTIME=""$', dockerfile, re.M)
    syncs = re.findall(r"uv sync (?:[^\n;]*\\\n)*[^\n;]*", dockerfile)
    assert len(syncs) == 4, syncs
    workspace = [s for s in syncs if "--project" not in s]
    assert len(workspace) == 2, syncs
    for sync in workspace:
        assert "--package atmosphere-ai-${SERVICE}" in sync
        assert "${RUNTIME:+--package atmosphere-ai-runtime-${RUNTIME}}" in sync
        # Ingress's protocol doors and dispatch's A2A client (remote delegation) are extras.
        assert '$(case "$SERVICE" in (ingress|sandbox|dispatch) echo --all-extras' in sync
    # A pinned adapter's pool: its group of the pinned environment (dispatch and the adapter).
    pinned_runtimes = re.search(r'^ARG PINNED_RUNTIMES="([^"]*)"$', dockerfile, re.M)
    assert pinned_runtimes is not None
    assert set(pinned_runtimes.group(1).split()) == set(PINNED_RUNTIMES)
    groups = tomllib.loads((ROOT / "envs/pinned/pyproject.toml").read_text())["dependency-groups"]
    for runtime in PINNED_RUNTIMES:
        assert set(groups[runtime]) == {"atmosphere-ai-dispatch", f"atmosphere-ai-runtime-{runtime}"}
    for sync in set(syncs) - set(workspace):
        assert "--project envs/pinned --no-default-groups --group ${RUNTIME}" in sync
    # Refused for any other service: only dispatch runs a runtime.
    assert '[ -n "$RUNTIME" ] && [ "$SERVICE" != "dispatch" ]' in dockerfile
    # The uid and gid the pods' securityContext and compose's `user:` name.
    assert "USER 10001:10001" in dockerfile
    assert "--uid 10001 --gid 10001" in dockerfile


def test_compose_validates_against_the_compose_schema(compose: Document) -> None:
    assert schema_errors(compose) == []
    broken = copy.deepcopy(compose)
    broken["services"]["sandbox"]["read_onyl"] = True
    broken["services"]["ingress"]["ports"] = 8080
    assert schema_errors(broken) == [
        "services.ingress.ports: 8080 is not of type 'array'",
        "services.sandbox: 'read_onyl' does not match any of the regexes: '^x-'",
    ]


def test_interpolation_reads_variables_as_compose_does() -> None:
    environment = {"SET": "v", "EMPTY": ""}
    assert interpolate({"a": ["${SET}", "${UNSET:-d}", "${EMPTY:-d}", "${EMPTY-d}", "$$x"]}, environment) == {
        "a": ["v", "d", "d", "", "$x"]
    }
    for unsupported in ("${UNSET}", "${SET:?message}"):
        with pytest.raises(InterpolationError):
            interpolate(unsupported, environment)


def test_one_variable_runs_every_atmosphere_container_in_an_app_image() -> None:
    # An app's own image (`atmosphere new`) holds every service: ATMOSPHERE_IMAGE names it for all.
    image = "registry.example.com/team/my-agents:1.2.3"
    compose = load({"ATMOSPHERE_IMAGE": image, "ATMOSPHERE_APP": "my_agents.agents:app"})
    assert schema_errors(compose) == []
    atmosphere = {"provision", *SERVICES, *POOL_SERVICES}
    assert {n: s.get("image") for n, s in compose["services"].items() if n in atmosphere} == dict.fromkeys(
        atmosphere, image
    )
    assert {n for n, s in compose["services"].items() if s.get("image") == image} == atmosphere
    apps = {n: s["environment"]["ATMOSPHERE_APP"] for n, s in compose["services"].items() if n in atmosphere}
    assert apps == dict.fromkeys(atmosphere, "my_agents.agents:app")


def test_compose_runs_every_service_from_the_one_dockerfile(compose: Document) -> None:
    services: dict[str, Any] = {n: s for n, s in compose["services"].items() if "profiles" not in s}
    version = workspace_version()
    assert set(services) == {"nats-volumes", *NODES, "provision", *SERVICES, *POOL_SERVICES}
    assert set(compose["services"]) - set(services) == set(OBSERVABILITY)
    brokers = {node: {"condition": "service_healthy"} for node in NODES}
    for name in (*SERVICES, *POOL_SERVICES):
        build = services[name]["build"]
        assert build["dockerfile"] == "deploy/docker/service.Dockerfile"
        # A pool's image is dispatch's with its runtime (RUNTIME); a service's has none.
        wanted = {"SERVICE": "dispatch", "RUNTIME": POOL_SERVICES[name]} if name in POOL_SERVICES else {"SERVICE": name}
        assert build["args"] == wanted, name
        # Named as the manifests name it (its `build:` tags it so), each running its service by its
        # command: any image holding the services runs it, an app's own too (ATMOSPHERE_IMAGE).
        image = f"atmosphere-{name}:{version}"
        assert services[name]["image"] == image, name
        assert services[name]["command"] == ["python", "-m", f"atmosphere.{ROLES[name]}"], name
        # Every service starts once the layout is provisioned (no service's login may make it).
        assert services[name]["depends_on"] == {**brokers, "provision": {"condition": "service_completed_successfully"}}
    assert services["provision"]["depends_on"] == brokers
    assert services["provision"]["build"]["args"] == {"SERVICE": "dispatch"}
    assert services["provision"]["image"] == f"atmosphere-dispatch:{version}"


def test_compose_provisions_as_the_production_overlays_job(compose: Document, production: list[Document]) -> None:
    service = compose["services"]["provision"]
    job = workloads(production)["atmosphere-provision"]
    [container] = pod_spec(job)["containers"]
    assert service["build"]["args"]["SERVICE"] == "dispatch"
    assert container["image"].startswith("atmosphere-dispatch:")
    assert service["command"] == container["command"] == ["python", "-m", "atmosphere.dispatch.provision"]
    assert env_files(service) == {(f"{CREDENTIALS}/provisioner.env", True)}
    # The shared settings only (dispatch's own included), as the Job's envFrom gives it.
    pod_env = container_environment(production, "provision")
    compose_env = untraced(dict(service["environment"]))
    assert compose_env.pop("ATMOSPHERE_NATS__URL") == ",".join(f"nats://{node}:4222" for node in NODES)
    assert compose_env == {k: v for k, v in pod_env.items() if k != "ATMOSPHERE_NATS__URL"}
    # It runs to its end: restarted only on failure, as the Job's pod.
    assert service["restart"] == "on-failure"
    assert pod_spec(job)["restartPolicy"] == "OnFailure"
    assert "healthcheck" not in service


def test_compose_gives_each_service_what_the_production_overlay_gives_its_pod(
    compose: Document, production: list[Document]
) -> None:
    # The runtime pools too: `dispatch-<runtime>` is the pod of `atmosphere-dispatch-<runtime>`.
    for name, role in ROLES.items():
        service = compose["services"][name]
        workload = workloads(production)[f"atmosphere-{name}"]
        [container] = pod_spec(workload)["containers"]
        pod_env, compose_env = container_environment(production, name), untraced(dict(service["environment"]))
        # The same variables with the same values, but the address of NATS.
        assert compose_env.pop("ATMOSPHERE_NATS__URL") == ",".join(f"nats://{node}:4222" for node in NODES)
        assert compose_env == {k: v for k, v in pod_env.items() if k != "ATMOSPHERE_NATS__URL"}, name
        assert set(compose_env) <= set().union(*(known(s) for s in SERVICES))
        # What it sets of its own is its role's.
        assert set(compose_env) - set(dict(compose["x-config"])) <= known(role), name
        # Its role's NATS login, and the optional Secrets, as env files.
        refs = [s["secretRef"] for s in container["envFrom"] if "secretRef" in s]
        wanted = {(f"{CREDENTIALS}/{role}.env", True)}
        wanted |= {(OPTIONAL_SECRETS[r["name"]], False) for r in refs if r.get("optional")}
        assert env_files(service) == wanted, name
        assert probed(service["healthcheck"]) == readiness(container)
        assert seconds(service["stop_grace_period"]) == pod_spec(workload)["terminationGracePeriodSeconds"]
        # The same image and command.
        assert (service["image"], service["command"]) == (container["image"], container["command"]), name
        assert any(t.startswith("/tmp:") for t in service["tmpfs"])
        assert any(v.endswith(":/data") for v in service.get("volumes", [])) == (name in STATEFUL)


def test_compose_hardens_every_container(compose: Document) -> None:
    for name, service in compose["services"].items():
        assert service["read_only"] is True, name
        assert service["cap_drop"] == ["ALL"], name
        assert "no-new-privileges:true" in service["security_opt"], name
        if name == "nats-volumes":
            # The one-shot that hands the new volumes to uid 10001: root, with only CAP_CHOWN.
            assert (service["user"], service["cap_add"], service["network_mode"]) == ("0:0", ["CHOWN"], "none")
        else:
            assert service["user"] == "10001:10001", name
            assert "cap_add" not in service, name


def test_compose_nats_nodes_run_the_manifests_configuration(compose: Document, production: list[Document]) -> None:
    statefulset = workloads(production)["nats"]
    [container] = pod_spec(statefulset)["containers"]
    routes = set(re.findall(r"nats://([\w.-]+):6222", (BASE / "nats" / "nats.conf").read_text()))
    aliases = set()
    assert len(NODES) == statefulset["spec"]["replicas"]
    for node in NODES:
        service = compose["services"][node]
        assert service["image"] == container["image"]
        assert service["command"] == container["command"]
        assert service["environment"] == {"SERVER_NAME": node}
        assert f"{NATS_CONFIG}:/etc/nats/nats.conf:ro" in service["volumes"]
        assert f"./{CREDENTIALS}/nats-auth.conf:/etc/nats/nats-auth.conf:ro" in service["volumes"]
        aliases |= set(service["networks"]["bus"]["aliases"])
        assert probed(service["healthcheck"]) == readiness(container)
        # SIGUSR2 is lame duck mode, what the pods' preStop hook asks for.
        assert service["stop_signal"] == "SIGUSR2"
        assert seconds(service["stop_grace_period"]) == pod_spec(statefulset)["terminationGracePeriodSeconds"]
    assert aliases == routes


def test_compose_keeps_the_sandbox_off_the_network_and_publishes_only_ingress(compose: Document) -> None:
    # The observability profile's own reach is held in tests/test_observability.py.
    networks = compose["networks"]
    services = {n: s for n, s in compose["services"].items() if n not in OBSERVABILITY}
    assert networks["bus"] == {"internal": True}
    assert services["sandbox"]["networks"] == ["bus"]
    outside = {n for n, s in services.items() if set(s.get("networks", [])) - {"bus"}}
    # The way out is to the model provider: dispatch, its runtime pools, and ingress.
    assert outside == {"dispatch", "ingress", *POOL_SERVICES}
    assert {n for n, s in services.items() if "ports" in s} == {"ingress"}
    # On loopback unless the operator says otherwise: a copied example opens nothing to the network.
    assert services["ingress"]["ports"] == ["127.0.0.1:8080:8080"]


def test_the_ingress_env_example_opens_no_keyless_openai_endpoint() -> None:
    values = dict(
        line.split("=", 1)
        for line in (ROOT / "deploy/compose/ingress.env.example").read_text().splitlines()
        if line and not line.startswith("#")
    )
    keyless = not values.get("ATMOSPHERE_AI_OPENAI_API_KEY") and not values.get("ATMOSPHERE_INGRESS__AUTH_TOKENS")
    assert not (values.get("ATMOSPHERE_AI_OPENAI_ENABLED") == "true" and keyless)


def test_the_env_examples_only_set_real_variables() -> None:
    def keys(path: Path) -> set[str]:
        return {line.split("=", 1)[0] for line in path.read_text().splitlines() if line and not line.startswith("#")}

    # `.env` is dispatch's (and the source of the app and log level that compose interpolates).
    assert keys(ROOT / ".env.example") <= known("dispatch"), keys(ROOT / ".env.example") - known("dispatch")
    ingress = keys(ROOT / "deploy/compose/ingress.env.example")
    assert ingress <= known("ingress"), ingress - known("ingress")
    # A native-SDK pool's provider (anthropic, cohere, adk): what its adapter reads, nothing of dispatch's.
    assert set(CREDENTIAL) == set(PROVIDERS)
    for pool, secret in PROVIDERS.items():
        provider = keys(ROOT / f"{OPTIONAL_SECRETS[secret]}.example")
        assert provider <= runtime_environment(pool), (pool, provider - runtime_environment(pool))
        assert CREDENTIAL[pool] in provider, pool
        assert CREDENTIAL[pool] in runtime_environment(pool), pool


def test_the_optional_env_files_have_an_example_and_are_never_committed() -> None:
    ignored = (ROOT / "deploy/compose/.gitignore").read_text().splitlines()
    for path in OPTIONAL_SECRETS.values():
        assert (ROOT / f"{path}.example").is_file(), path
        assert path.removeprefix("deploy/compose/") in ignored or path == ".env", path
    assert ".env" in (ROOT / ".gitignore").read_text().splitlines()


def test_compose_runs_the_pools_the_production_overlay_deploys_and_names_them_all(
    compose: Document, production: list[Document]
) -> None:
    services: dict[str, Any] = compose["services"]
    pools = {
        n: s["environment"]["ATMOSPHERE_DISPATCH__POOL"]
        for n, s in services.items()
        if "ATMOSPHERE_DISPATCH__POOL" in s.get("environment", {})
    }
    assert pools == POOL_SERVICES
    assert {f"atmosphere-{n}": p for n, p in pools.items()} == deployed_pools(production)
    # One list of every pool, shared by the provisioner (it makes their queues) and every dispatch.
    for name in ("provision", "dispatch", *POOL_SERVICES):
        listed = services[name]["environment"]["ATMOSPHERE_DISPATCH__POOLS"].split(",")
        assert sorted(listed) == sorted(POOLS) == sorted(configured_pools(production)), name
    for name, pool in POOL_SERVICES.items():
        # Unreachable but through NATS: nothing published, gRPC on its own loopback.
        assert "ports" not in services[name]
        assert services[name]["environment"]["ATMOSPHERE_DISPATCH__GRPC_HOST"] == "127.0.0.1"
        # Its provider's file: `.env` (LLM_*) for an OpenAI-compatible runtime, its own for a native
        # SDK's (anthropic.env, cohere.env, gemini.env), and no other.
        provider = OPTIONAL_SECRETS[PROVIDERS.get(pool, "atmosphere-llm")]
        assert (provider, False) in env_files(services[name]), name
        assert {p for p, required in env_files(services[name]) if not required} == {provider}, name
