"""Both Kubernetes overlays build with the real kustomize and pass every check, offline.

`scripts/validate_k8s.py` builds them (throwaway credentials in a copy), validates every object
against the Kubernetes schemas and walks the output; here it must find nothing, and each check
must name the defect it exists for when a copy of the output is broken on purpose. The runtime
pools (deploy/k8s/components/pool-<runtime>, one per adapter of the workspace) are held to the
services' standard and to the default pool's pod.
"""

from __future__ import annotations

import copy
import re
import tomllib
from typing import Any

import pytest

from atmosphere.config import env_names
from scripts.k8s_network import allowances, reachable_from_outside, selects
from scripts.k8s_pods import named, pod_labels, pod_spec, workloads
from scripts.k8s_pools import configured_pools, deployed_pools
from scripts.k8s_render import COMPONENTS, OVERLAYS, POOLS, ROLES, ROOT, SERVICES, build, staged_copy
from scripts.strict_yaml import strict_load
from scripts.validate_k8s import problems, rendered
from tests.test_k8s_drain import container_environment, settings_class, settings_of

Document = dict[str, Any]
STATEFUL = ("governance", "memory", "tape")
UNITS = {"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30}
PROVIDERS = {"anthropic": "atmosphere-anthropic", "cohere": "atmosphere-cohere", "adk": "atmosphere-gemini"}
"""Each native-SDK pool's optional provider Secret; the others speak the OpenAI wire, as the default pool."""
LLM = "atmosphere-llm"


def broken(overlay: str) -> list[Document]:
    """A copy of the overlay's output to break."""
    return copy.deepcopy(rendered()[overlay])


def container(documents: list[Document], service: str) -> Document:
    return pod_spec(workloads(documents)[f"atmosphere-{service}"])["containers"][0]  # type: ignore[no-any-return]


def pool_services() -> list[str]:
    """The pools as `container` and `container_environment` name them: `dispatch-<runtime>`."""
    return [f"dispatch-{pool}" for pool in POOLS]


def workspace_adapters() -> dict[str, str]:
    """Each runtime adapter of the workspace (`libs/runtime-*`): its entry point's name, its distribution."""
    adapters = {}
    for path in ROOT.glob("libs/runtime-*/pyproject.toml"):
        project = tomllib.loads(path.read_text())["project"]
        for name in project["entry-points"]["atmosphere.runtimes"]:
            adapters[name] = project["name"]
    return adapters


def workspace_version() -> str:
    versions = {
        tomllib.loads(p.read_text())["project"]["version"]
        for p in [*ROOT.glob("libs/*/pyproject.toml"), *ROOT.glob("services/*/pyproject.toml")]
    }
    assert len(versions) == 1, f"the workspace's members disagree on the version: {versions}"
    return str(versions.pop())


def bytes_of(quantity: str) -> int:
    number, unit = re.fullmatch(r"(\d+)(Ki|Mi|Gi)?", quantity).groups()  # type: ignore[union-attr]
    return int(number) * UNITS.get(unit or "", 1)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_each_overlay_validates_against_the_schemas_and_passes_every_check(overlay: str) -> None:
    assert problems(overlay, rendered()[overlay]) == []


def test_the_schemas_refuse_an_unknown_field_and_a_wrong_type() -> None:
    documents = broken("dev")
    workloads(documents)["atmosphere-tape"]["spec"]["replica"] = 2
    named(documents, "PodDisruptionBudget")["nats"]["spec"]["maxUnavailable"] = [1]
    found = problems("dev", documents)
    assert any(
        p.startswith("StatefulSet atmosphere-tape is invalid for Kubernetes 1.37") and "replica" in p for p in found
    )
    assert any(p.startswith("PodDisruptionBudget nats is invalid for Kubernetes 1.30") for p in found)


def test_the_checks_name_a_pod_without_probes_resources_or_the_restricted_profile() -> None:
    documents = broken("production")
    del container(documents, "dispatch")["readinessProbe"]
    del container(documents, "memory")["resources"]["limits"]["cpu"]
    container(documents, "tape")["securityContext"]["readOnlyRootFilesystem"] = False
    container(documents, "sandbox")["securityContext"]["capabilities"] = {"drop": ["ALL"], "add": ["SYS_ADMIN"]}
    pod_spec(workloads(documents)["atmosphere-ingress"])["securityContext"]["runAsUser"] = 0
    pod_spec(workloads(documents)["atmosphere-governance"])["volumes"] = []
    found = problems("production", documents)
    for expected in (
        "Deployment atmosphere-dispatch: container dispatch: no readinessProbe",
        "StatefulSet atmosphere-memory: container memory: no cpu limits",
        "StatefulSet atmosphere-tape: container tape: securityContext.readOnlyRootFilesystem is False, not True",
        "Deployment atmosphere-sandbox: container sandbox: asks for privileges (capabilities.add or privileged)",
        "Deployment atmosphere-ingress: pod securityContext.runAsUser is 0, not 10001",
        "StatefulSet atmosphere-governance: container governance: /tmp is no emptyDir"
        " (the root filesystem is read-only)",
    ):
        assert expected in found


def test_the_checks_name_a_service_without_its_budget_or_autoscaler() -> None:
    documents = [
        d
        for d in broken("production")
        if d["metadata"]["name"] != "atmosphere-memory" or d["kind"] != "PodDisruptionBudget"
    ]
    named(documents, "HorizontalPodAutoscaler")["atmosphere-dispatch"]["spec"]["minReplicas"] = 1
    named(documents, "HorizontalPodAutoscaler")["atmosphere-tape"]["spec"]["metrics"][0]["resource"]["name"] = "memory"
    found = problems("production", documents)
    assert "atmosphere-memory: 0 PodDisruptionBudgets, not one" in found
    assert "atmosphere-dispatch: its autoscaler's range 1..8 starts below 2" in found
    assert "atmosphere-tape: its autoscaler does not scale on CPU" in found


def test_the_checks_name_a_dangling_reference() -> None:
    documents = [d for d in broken("dev") if not d["metadata"]["name"].startswith("atmosphere-nats-tape-")]
    container(documents, "ingress")["ports"][0]["name"] = "web"
    found = problems("dev", documents)
    assert any(
        re.fullmatch(r"StatefulSet atmosphere-tape: container tape: Secret atmosphere-nats-tape-\w+ does not exist", p)
        for p in found
    )
    assert "Deployment atmosphere-ingress: container ingress: readinessProbe uses unknown port http" in found
    assert "Service atmosphere-ingress: port http targets http, which no container opens" in found


def test_the_sandbox_may_reach_nothing_but_nats_and_dns() -> None:
    for peer, port in (({"ipBlock": {"cidr": "0.0.0.0/0"}}, 443), ({"podSelector": {}}, 4222)):
        documents = broken("dev")
        policy = copy.deepcopy(named(documents, "NetworkPolicy")["bus-clients"])
        policy["metadata"]["name"] = "leak"
        policy["spec"]["egress"] = [{"to": [peer], "ports": [{"protocol": "TCP", "port": port}]}]
        found = problems("dev", [*documents, policy])
        assert [p for p in found if p.startswith("atmosphere-sandbox: NetworkPolicy leak allows egress")], found
    documents = broken("dev")
    named(documents, "NetworkPolicy")["bus-clients"]["spec"]["egress"][0].pop("ports")
    found = problems("dev", documents)
    assert "atmosphere-sandbox: NetworkPolicy bus-clients allows egress to ['nats'] on every port" in found


def test_nothing_but_ingress_is_reachable_from_outside_and_all_else_is_denied() -> None:
    documents = [d for d in broken("production") if d["metadata"]["name"] != "default-deny"]
    opened = copy.deepcopy(named(documents, "NetworkPolicy")["ingress-http"])
    opened["metadata"]["name"] = "open-governance"
    opened["spec"]["podSelector"] = {"matchLabels": {"app.kubernetes.io/name": "atmosphere-governance"}}
    named(documents, "NetworkPolicy")["bus-clients"]["spec"]["podSelector"] = {
        "matchLabels": {"app.kubernetes.io/name": "x"}
    }
    found = problems("production", [*documents, opened])
    assert "no NetworkPolicy denies all traffic by default" in found
    assert "atmosphere-governance: reachable from outside is True, should be False" in found
    assert "atmosphere-memory: a bus client that may not reach NATS" in found


def test_the_namespace_enforces_the_restricted_profile() -> None:
    for overlay, name in (("dev", "atmosphere-dev"), ("production", "atmosphere")):
        namespace = named(rendered()[overlay], "Namespace")[name]
        assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    documents = broken("dev")
    named(documents, "Namespace")["atmosphere-dev"]["metadata"]["labels"].pop("pod-security.kubernetes.io/enforce")
    assert "Namespace atmosphere-dev does not enforce the restricted profile" in problems("dev", documents)


def test_state_lives_in_statefulsets_with_a_volume_per_replica() -> None:
    for documents in rendered().values():
        statefulsets = named(documents, "StatefulSet")
        assert set(statefulsets) == {"nats", *(f"atmosphere-{s}" for s in STATEFUL)}
        for service in STATEFUL:
            [claim] = statefulsets[f"atmosphere-{service}"]["spec"]["volumeClaimTemplates"]
            assert claim["spec"]["accessModes"] == ["ReadWriteOnce"]
            assert {"name": claim["metadata"]["name"], "mountPath": "/data"} in container(documents, service)[
                "volumeMounts"
            ]
        assert set(named(documents, "Deployment")) == {
            *(f"atmosphere-{s}" for s in SERVICES if s not in STATEFUL),
            *(f"atmosphere-{s}" for s in pool_services()),
        }
        assert not named(documents, "PersistentVolumeClaim")


def test_production_runs_two_replicas_of_everything_on_replicated_streams() -> None:
    replicas = {}
    for overlay, documents in rendered().items():
        config = container_environment(documents, "dispatch")
        replicas[overlay] = config.get("ATMOSPHERE_JETSTREAM__REPLICAS")
        for service in (*SERVICES, *pool_services()):
            wanted = 2 if overlay == "production" else 1
            assert workloads(documents)[f"atmosphere-{service}"]["spec"]["replicas"] == wanted
            assert named(documents, "HorizontalPodAutoscaler")[f"atmosphere-{service}"]["spec"]["minReplicas"] == wanted
        assert workloads(documents)["nats"]["spec"]["replicas"] == 3
    assert replicas == {"dev": None, "production": "3"}


def test_every_image_carries_the_workspace_version() -> None:
    version = workspace_version()
    for documents in rendered().values():
        for service in (*SERVICES, *pool_services()):
            assert container(documents, service)["image"] == f"atmosphere-{service}:{version}"


def test_each_service_sets_only_real_variables_and_reads_its_own_credentials() -> None:
    for documents in rendered().values():
        secrets = named(documents, "Secret")
        config = next(c["data"] for n, c in named(documents, "ConfigMap").items() if n.startswith("atmosphere-config-"))
        # The shared ConfigMap may hold a variable only some services read, but no typo.
        assert set(config) <= set().union(*(env_names(settings_class(s)) for s in SERVICES))
        # A pool is a dispatch: dispatch's variables, and the `dispatch` role's login.
        for service, role in [*((s, s) for s in SERVICES), *((p, "dispatch") for p in pool_services())]:
            own = {e["name"] for e in container(documents, service).get("env", [])}
            unknown = own - set(env_names(settings_class(role)))
            assert not unknown, f"atmosphere-{service} sets unknown variables {unknown}"
            refs = [s["secretRef"]["name"] for s in container(documents, service)["envFrom"] if "secretRef" in s]
            [own] = [r for r in refs if r.startswith(f"atmosphere-nats-{role}-")]
            assert {"ATMOSPHERE_NATS__USER", "ATMOSPHERE_NATS__PASSWORD"} <= set(secrets[own]["data"])
            assert not [r for r in refs if r.startswith("atmosphere-nats-") and r != own]


def test_the_sandbox_memory_limit_holds_its_tool_workers() -> None:
    for documents in rendered().values():
        settings = settings_of("sandbox", container_environment(documents, "sandbox"))
        limit = bytes_of(container(documents, "sandbox")["resources"]["limits"]["memory"])
        workers = settings.sandbox.tool_workers * settings.sandbox.tool_worker_memory_bytes
        # A worker over its bound is killed by the sandbox, before the pod is by the kernel.
        assert limit >= workers + (512 << 20)


def test_the_overlays_read_credentials_only_from_the_ignored_directory() -> None:
    assert "overlays/*/credentials/" in (ROOT / "deploy/k8s/.gitignore").read_text().splitlines()
    for overlay in OVERLAYS:
        kustomization = strict_load((ROOT / "deploy/k8s/overlays" / overlay / "kustomization.yaml").read_text())
        sources = [s for g in kustomization["secretGenerator"] for s in [*g.get("files", []), *g.get("envs", [])]]
        assert len(sources) == 1 + len(ROLES)
        assert all(s.startswith("credentials/") for s in sources), sources


def test_a_job_provisions_the_layout_with_the_provisioners_login_and_no_service_holds_it() -> None:
    for overlay, documents in rendered().items():
        job = workloads(documents)["atmosphere-provision"]
        [provisioner] = pod_spec(job)["containers"]
        assert provisioner["command"] == ["python", "-m", "atmosphere.dispatch.provision"]
        refs = [s["secretRef"]["name"] for s in provisioner["envFrom"] if "secretRef" in s]
        [login] = refs
        assert login.startswith("atmosphere-nats-provisioner-"), overlay
        assert {"ATMOSPHERE_NATS__USER", "ATMOSPHERE_NATS__PASSWORD"} <= set(named(documents, "Secret")[login]["data"])
        # What it reads is dispatch's settings: the run queue's consumers take them.
        assert set(container_environment(documents, "provision")) <= set(env_names(settings_class("dispatch")))
        # The Job is restricted like every pod, and may reach NATS.
        assert not [p for p in problems(overlay, documents) if "atmosphere-provision" in p]
    documents = broken("production")
    container(documents, "dispatch")["envFrom"].append(
        {
            "secretRef": {
                "name": next(n for n in named(documents, "Secret") if n.startswith("atmosphere-nats-provisioner-"))
            }
        }
    )
    assert "Deployment atmosphere-dispatch reads the provisioner's credentials" in problems("production", documents)
    without = [d for d in broken("dev") if d["kind"] != "Job"]
    assert "no Job atmosphere-provision: nothing provisions the JetStream layout, and no service may" in problems(
        "dev", without
    )
    documents = broken("dev")
    del pod_spec(workloads(documents)["atmosphere-provision"])["containers"][0]["securityContext"]
    assert (
        "Job atmosphere-provision: container provision: securityContext.readOnlyRootFilesystem is None, not True"
        in (problems("dev", documents))
    )


def test_every_runtime_adapter_has_a_pool_component_that_both_overlays_include() -> None:
    # The image is built with `--package atmosphere-ai-runtime-${RUNTIME}`: the distribution is named so.
    adapters = workspace_adapters()
    assert adapters == {pool: f"atmosphere-ai-runtime-{pool}" for pool in POOLS}
    assert {p.name for p in COMPONENTS.glob("pool-*")} == {f"pool-{pool}" for pool in POOLS}
    for pool in POOLS:
        component = strict_load((COMPONENTS / f"pool-{pool}" / "kustomization.yaml").read_text())
        assert (component["apiVersion"], component["kind"]) == ("kustomize.config.k8s.io/v1alpha1", "Component")
        assert component["images"] == [{"name": f"atmosphere-dispatch-{pool}", "newTag": workspace_version()}]
    for overlay in OVERLAYS:
        kustomization = strict_load((ROOT / "deploy/k8s/overlays" / overlay / "kustomization.yaml").read_text())
        assert kustomization["components"] == [f"../../components/pool-{pool}" for pool in POOLS], overlay


def test_the_app_image_component_renames_every_image_the_base_and_the_pools_name() -> None:
    # An app's own image (`atmosphere new`) holds every service: one name, `atmosphere-app`, for all.
    component = strict_load((COMPONENTS / "app-image" / "kustomization.yaml").read_text())
    assert (component["apiVersion"], component["kind"]) == ("kustomize.config.k8s.io/v1alpha1", "Component")
    names = [*(f"atmosphere-{s}" for s in SERVICES), *(f"atmosphere-dispatch-{pool}" for pool in POOLS)]
    assert component["images"] == [{"name": name, "newName": "atmosphere-app"} for name in names]
    assert {p.name for p in COMPONENTS.iterdir()} == {"app-image", *(f"pool-{pool}" for pool in POOLS)}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_atmosphere_container_names_its_service_in_its_command(overlay: str) -> None:
    # So that one image holding every service (an app's own) runs each of them.
    documents = rendered()[overlay]
    for service in (*SERVICES, *pool_services()):
        module = "dispatch" if service.startswith("dispatch") else service
        assert container(documents, service)["command"] == ["python", "-m", f"atmosphere.{module}"], service


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_each_pool_runs_its_own_image_with_its_budget_and_autoscaler_and_every_dispatch_knows_them_all(
    overlay: str,
) -> None:
    documents = rendered()[overlay]
    assert deployed_pools(documents) == {f"atmosphere-dispatch-{pool}": pool for pool in POOLS}
    # The shared ConfigMap names exactly the pools deployed: the provisioner makes their queues.
    assert sorted(configured_pools(documents)) == sorted(POOLS)
    for pool in POOLS:
        name = f"atmosphere-dispatch-{pool}"
        workload = named(documents, "Deployment")[name]
        environment = container_environment(documents, f"dispatch-{pool}")
        assert environment["ATMOSPHERE_DISPATCH__POOL"] == pool
        # Every dispatch, the provisioner and each pool, reads the same list (settings split and sort it).
        for reader in ("dispatch", "provision", f"dispatch-{pool}"):
            settings = settings_of("dispatch", container_environment(documents, reader))
            assert settings.dispatch.all_pools() == tuple(sorted(POOLS)), reader
        assert settings_of("dispatch", environment).dispatch.pool == pool
        assert container(documents, f"dispatch-{pool}")["image"].startswith(f"atmosphere-dispatch-{pool}:")
        [budget] = [
            b
            for b in named(documents, "PodDisruptionBudget").values()
            if selects(b["spec"]["selector"], pod_labels(workload))
        ]
        assert budget["metadata"]["name"] == name
        assert budget["spec"]["maxUnavailable"] == 1
        [scaler] = [
            a
            for a in named(documents, "HorizontalPodAutoscaler").values()
            if a["spec"]["scaleTargetRef"]["name"] == name
        ]
        assert scaler["metadata"]["name"] == name
        default = named(documents, "HorizontalPodAutoscaler")["atmosphere-dispatch"]
        assert scaler["spec"] == {
            **default["spec"],
            "scaleTargetRef": {**default["spec"]["scaleTargetRef"], "name": name},
        }
    # The default pool serves the agents pinned to nothing.
    assert "ATMOSPHERE_DISPATCH__POOL" not in container_environment(documents, "dispatch")


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_each_pool_pod_is_the_default_dispatch_pod_but_for_its_pool(overlay: str) -> None:
    documents = rendered()[overlay]
    default = pod_spec(workloads(documents)["atmosphere-dispatch"])
    [dispatch] = default["containers"]
    for pool in POOLS:
        spec = copy.deepcopy(pod_spec(workloads(documents)[f"atmosphere-dispatch-{pool}"]))
        [pooled] = spec.pop("containers")
        # The pod: the grace period, the restricted profile, the volumes, the spread over nodes.
        [spread] = spec.pop("topologySpreadConstraints")
        [default_spread] = default["topologySpreadConstraints"]
        assert spread == {
            **default_spread,
            "labelSelector": {"matchLabels": {"app.kubernetes.io/name": f"atmosphere-dispatch-{pool}"}},
        }
        assert spec == {k: v for k, v in default.items() if k not in ("containers", "topologySpreadConstraints")}
        # The container: probes, resources, mounts, securityContext as dispatch's.
        differ = ("image", "env", "envFrom", "ports")
        assert {k: v for k, v in pooled.items() if k not in differ} == {
            k: v for k, v in dispatch.items() if k not in differ
        }
        # Its pool; gRPC on its loopback and no gRPC port (the default pool's Service serves every agent).
        env = {e["name"]: e["value"] for e in pooled["env"]}
        default_env = {e["name"]: e["value"] for e in dispatch["env"]}
        assert env == {
            **{k: v for k, v in default_env.items() if k != "ATMOSPHERE_DISPATCH__GRPC_PORT"},
            "ATMOSPHERE_DISPATCH__POOL": pool,
            "ATMOSPHERE_DISPATCH__GRPC_HOST": "127.0.0.1",
        }
        assert pooled["ports"] == [p for p in dispatch["ports"] if p["name"] != "grpc"]
        # The shared settings and dispatch's login, then its own provider's Secret alone (optional).
        assert pooled["envFrom"][:2] == dispatch["envFrom"][:2]
        assert pooled["envFrom"][2:] == [{"secretRef": {"name": PROVIDERS.get(pool, LLM), "optional": True}}]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_nothing_reaches_a_pool_and_a_pool_reaches_only_what_the_default_pool_does(overlay: str) -> None:
    documents = rendered()[overlay]
    policies = list(named(documents, "NetworkPolicy").values())
    default = pod_labels(workloads(documents)["atmosphere-dispatch"])

    def egress(labels: dict[str, str]) -> set[tuple[Any, ...]]:
        return {(repr(a.peers), a.ports) for a in allowances(labels, policies, "Egress")}

    for pool in POOLS:
        labels = pod_labels(workloads(documents)[f"atmosphere-dispatch-{pool}"])
        assert not reachable_from_outside(labels, policies)
        assert list(allowances(labels, policies, "Ingress")) == []
        assert not [
            s for s in named(documents, "Service").values() if selects({"matchLabels": s["spec"]["selector"]}, labels)
        ]
        # NATS, DNS and the model provider (443 and 80 anywhere), as the default pool.
        assert egress(labels) == egress(default)


def test_the_checks_name_a_pool_left_out_of_the_config_exposed_or_in_another_image() -> None:
    documents = broken("production")
    config = next(c for n, c in named(documents, "ConfigMap").items() if n.startswith("atmosphere-config-"))
    config["data"]["ATMOSPHERE_DISPATCH__POOLS"] = "langchain,langgraph,pydantic-ai,openai-agents"
    container(documents, "dispatch-langgraph")["image"] = "atmosphere-dispatch:0.1.0"
    container(documents, "dispatch-pydantic-ai")["env"].append({"name": "ATMOSPHERE_DISPATCH__POOLS", "value": "x"})
    opened = copy.deepcopy(named(documents, "NetworkPolicy")["dispatch-grpc"])
    opened["metadata"]["name"] = "open-pool"
    opened["spec"]["podSelector"] = {"matchLabels": {"app.kubernetes.io/name": "atmosphere-dispatch-langchain"}}
    opened["spec"]["ingress"][0]["from"] = [{"ipBlock": {"cidr": "0.0.0.0/0"}}]
    leak = copy.deepcopy(named(documents, "NetworkPolicy")["dispatch-openai-agents-model-provider"])
    leak["metadata"]["name"] = "leak"
    leak["spec"]["egress"][0]["ports"] = [{"protocol": "TCP", "port": 5432}]
    scalers = [
        d
        for d in [*documents, opened, leak]
        if d["metadata"]["name"] != "atmosphere-dispatch-anthropic" or d["kind"] != "HorizontalPodAutoscaler"
    ]
    found = problems("production", scalers)
    for expected in (
        "ATMOSPHERE_DISPATCH__POOLS names ['langchain', 'langgraph', 'openai-agents', 'pydantic-ai'], but the pools"
        f" deployed are {sorted(POOLS)}",
        "atmosphere-dispatch-langgraph runs atmosphere-dispatch:0.1.0, not its own image atmosphere-dispatch-langgraph",
        "Deployment atmosphere-dispatch-pydantic-ai sets ATMOSPHERE_DISPATCH__POOLS of its own: every dispatch reads"
        " the shared one",
        "atmosphere-dispatch-langchain: NetworkPolicies ['open-pool'] let traffic in; a pool's pods take none",
        "atmosphere-dispatch-langchain: reachable from outside is True, should be False",
        "atmosphere-dispatch-openai-agents may reach other peers or ports than atmosphere-dispatch",
        "atmosphere-dispatch-anthropic: 0 HorizontalPodAutoscalers, not one",
    ):
        assert expected in found, found
    # A pool's replicas below production's two, a pool that logs in as another role, and a
    # provisioner that does not read the list of pools.
    documents = broken("production")
    workloads(documents)["atmosphere-dispatch-langchain"]["spec"]["replicas"] = 1
    provisioner = pod_spec(workloads(documents)["atmosphere-provision"])["containers"][0]
    provisioner["envFrom"] = [s for s in provisioner["envFrom"] if "configMapRef" not in s]
    secrets = container(documents, "dispatch-anthropic")["envFrom"]
    secrets[1] = {
        "secretRef": {"name": next(n for n in named(documents, "Secret") if n.startswith("atmosphere-nats-ingress-"))}
    }
    found = problems("production", documents)
    assert "atmosphere-dispatch-langchain: starts with fewer replicas than its autoscaler's minimum" in found
    assert "atmosphere-dispatch-anthropic does not log in as the dispatch role" in found
    assert "Job atmosphere-provision does not read the shared atmosphere-config: it would make no pool's queue" in found


def test_removing_a_pool_takes_its_component_line_and_its_name_and_the_checks_see_a_half_removal() -> None:
    # What the overlays' comment says: delete the component's line and the name from the list.
    with staged_copy() as staged:
        path = staged / "overlays" / "production" / "kustomization.yaml"
        text = path.read_text()
        path.write_text(text.replace("  - ../../components/pool-langgraph\n", ""))
        half = build(path.parent)
        path.write_text(text.replace("  - ../../components/pool-langgraph\n", "").replace(",langgraph,", ","))
        whole = build(path.parent)
    assert "atmosphere-dispatch-langgraph" not in workloads(whole)
    assert sorted(configured_pools(whole)) == sorted(set(POOLS) - {"langgraph"})
    assert problems("production", whole) == []
    assert (
        f"ATMOSPHERE_DISPATCH__POOLS names {sorted(POOLS)}, but"
        f" the pools deployed are {sorted(set(POOLS) - {'langgraph'})}"
    ) in problems("production", half)
