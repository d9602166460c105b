"""Who makes the JetStream layout in a rendered overlay: one Job, with the provisioner's login, and no service.

No service's NATS login may create or change a stream, bucket or consumer
(`atmosphere.bus.permissions`), so an overlay without the provisioning Job never starts: every
service waits for the layout, then exits. And the provisioner's credentials in a service's pod
would hand that service the power the table takes away.
"""

from __future__ import annotations

from typing import Any

from scripts.k8s_pods import named, pod_spec, workloads

Document = dict[str, Any]
JOB = "atmosphere-provision"
COMMAND = ["python", "-m", "atmosphere.dispatch.provision"]
CREDENTIALS = "atmosphere-nats-provisioner-"
"""The provisioner's Secret, by the prefix kustomize keeps before its content hash."""


def _secrets(workload: Document) -> list[str]:
    containers = pod_spec(workload)["containers"]
    return [s["secretRef"]["name"] for c in containers for s in c.get("envFrom", []) if "secretRef" in s]


def provisioning_problems(documents: list[Document]) -> list[str]:
    """What keeps the layout from being made exactly once, by the provisioner alone."""
    found: list[str] = []
    job = named(documents, "Job").get(JOB)
    if job is None:
        return [f"no Job {JOB}: nothing provisions the JetStream layout, and no service may"]
    [container] = pod_spec(job)["containers"]
    if container.get("command") != COMMAND:
        found.append(f"Job {JOB} runs {container.get('command')}, not {COMMAND}")
    # Dispatch's image, whatever its name: an app's own image (components/app-image) holds it too.
    dispatch = workloads(documents).get("atmosphere-dispatch")
    images = {str(c.get("image", "")) for c in pod_spec(dispatch)["containers"]} if dispatch else set()
    if str(container.get("image", "")) not in images:
        found.append(f"Job {JOB} runs {container.get('image')}: the provisioner is in dispatch's image")
    if not any(s.startswith(CREDENTIALS) for s in _secrets(job)):
        found.append(f"Job {JOB} does not log in as the provisioner")
    if pod_spec(job).get("restartPolicy") not in ("OnFailure", "Never"):
        found.append(f"Job {JOB} has no restartPolicy a Job may have")
    for name, workload in workloads(documents).items():
        if name != JOB and any(s.startswith(CREDENTIALS) for s in _secrets(workload)):
            found.append(f"{workload['kind']} {name} reads the provisioner's credentials")
    return found
