"""What every rendered workload's pods must have: probes, resources, the restricted profile, volumes.

Each check returns the problems it found as sentences naming the object (empty: none), so a test
shows them all at once and a broken manifest says what to fix.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

Document = dict[str, Any]
WORKLOAD_KINDS = ("Deployment", "StatefulSet", "Job")
RUN_TO_END = ("Job",)
"""Workloads whose pods do one thing and exit (provisioning): no probes, no selector of their own."""
RUN_AS = 10001
POD_SECURITY = {
    "runAsNonRoot": True,
    "runAsUser": RUN_AS,
    "runAsGroup": RUN_AS,
    "fsGroup": RUN_AS,
    "seccompProfile": {"type": "RuntimeDefault"},
}
CONTAINER_SECURITY = {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True}
TMP = "/tmp"  # noqa: S108 - the path each pod must mount a writable emptyDir at


def named(documents: list[Document], kind: str) -> dict[str, Document]:
    """The objects of `kind` by name."""
    return {d["metadata"]["name"]: d for d in documents if d["kind"] == kind}


def workloads(documents: list[Document]) -> dict[str, Document]:
    """Every Deployment, StatefulSet and Job by name."""
    return {d["metadata"]["name"]: d for d in documents if d["kind"] in WORKLOAD_KINDS}


def pod_spec(workload: Document) -> Document:
    """The pod template's spec."""
    return workload["spec"]["template"]["spec"]  # type: ignore[no-any-return]


def pod_labels(workload: Document) -> dict[str, str]:
    """The labels of the workload's pods."""
    return workload["spec"]["template"]["metadata"].get("labels", {})  # type: ignore[no-any-return]


def pod_problems(workload: Document) -> Iterator[str]:
    """Pod-level problems: the restricted profile, host access, the service account token."""
    spec = pod_spec(workload)
    security = spec.get("securityContext", {})
    for field, wanted in POD_SECURITY.items():
        if security.get(field) != wanted:
            yield f"pod securityContext.{field} is {security.get(field)!r}, not {wanted!r}"
    for host in ("hostNetwork", "hostPID", "hostIPC"):
        if spec.get(host):
            yield f"pod uses {host}"
    if spec.get("automountServiceAccountToken") is not False:
        yield "pod mounts a service account token it never uses"
    selector = workload["spec"].get("selector")  # a Job's is made by the cluster
    if selector is not None and not selector["matchLabels"].items() <= pod_labels(workload).items():
        yield "selector misses its own pods"


def container_problems(container: Document, *, probed: bool = True) -> Iterator[str]:
    """Container-level problems: probes (when `probed`), resources, the restricted profile, an image."""
    if not container.get("image"):
        yield "no image"
    for probe in ("readinessProbe", "livenessProbe") if probed else ():
        if probe not in container:
            yield f"no {probe}"
    resources = container.get("resources", {})
    for bound in ("requests", "limits"):
        for resource in ("cpu", "memory"):
            if resource not in resources.get(bound, {}):
                yield f"no {resource} {bound}"
    security = container.get("securityContext", {})
    for field, wanted in CONTAINER_SECURITY.items():
        if security.get(field) != wanted:
            yield f"securityContext.{field} is {security.get(field)!r}, not {wanted!r}"
    capabilities = security.get("capabilities", {})
    if capabilities.get("drop") != ["ALL"]:
        yield f"capabilities.drop is {capabilities.get('drop')!r}, not ['ALL']"
    if capabilities.get("add") or security.get("privileged"):
        yield "asks for privileges (capabilities.add or privileged)"
    yield from (
        f"env {e.get('name')} has no value" for e in container.get("env", []) if not e.keys() & {"value", "valueFrom"}
    )


def volume_problems(workload: Document) -> Iterator[str]:
    """Every volume mounted, every mount declared, /tmp writable, no host paths."""
    spec = pod_spec(workload)
    volumes = {v["name"]: v for v in spec.get("volumes", [])}
    claims = {t["metadata"]["name"] for t in workload["spec"].get("volumeClaimTemplates", [])}
    for container in spec["containers"]:
        mounts = {m["mountPath"]: m["name"] for m in container.get("volumeMounts", [])}
        yield from (f"mounts undeclared volume {n}" for n in sorted(set(mounts.values()) - set(volumes) - claims))
        if "emptyDir" not in volumes.get(mounts.get(TMP, ""), {}):
            yield f"container {container['name']}: {TMP} is no emptyDir (the root filesystem is read-only)"
    mounted = {m["name"] for c in spec["containers"] for m in c.get("volumeMounts", [])}
    yield from (f"declares unmounted volume {v}" for v in sorted((set(volumes) | claims) - mounted))
    yield from (f"volume {n} is a hostPath" for n, v in volumes.items() if "hostPath" in v)


def workload_problems(documents: list[Document]) -> list[str]:
    """Every problem of every workload's pods, each naming its workload (and container)."""
    found: list[str] = []
    for name, workload in workloads(documents).items():
        where = f"{workload['kind']} {name}"
        found += [f"{where}: {p}" for p in pod_problems(workload)]
        found += [f"{where}: {p}" for p in volume_problems(workload)]
        probed = workload["kind"] not in RUN_TO_END
        for container in pod_spec(workload)["containers"]:
            problems = container_problems(container, probed=probed)
            found += [f"{where}: container {container['name']}: {p}" for p in problems]
    return found
