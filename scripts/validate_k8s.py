"""Build both Kubernetes overlays and check every object, offline.

    .venv/bin/python -m scripts.validate_k8s      # from the repository root; exit 1 on any problem

Each overlay is built with the pinned kustomize (`kubectl kustomize`) in a copy with throwaway
credentials (`scripts/k8s_render.py`), every object is validated against the Kubernetes JSON
schemas shipped by the PyPI package `kubernetes-validate` (strict: an unknown field is an error),
and the whole is checked: probes, resources and the restricted profile on every pod
(`k8s_pods`), references between objects (`k8s_references`), a budget and an autoscaler per
service and the NetworkPolicies (`k8s_coverage`), and the Job that provisions the JetStream
layout with the provisioner's login alone (`k8s_provision`), and the runtime pools: each one
deployed is named in `ATMOSPHERE_DISPATCH__POOLS`, runs its own image and is reachable by nothing
(`k8s_pools`); each has a budget and an autoscaler like a service. `make test` runs the same through
tests/test_k8s_overlays.py.
"""

from __future__ import annotations

import functools
import json
import sys
from typing import Any

import kubernetes_validate  # type: ignore[import-untyped]  # ships no type information

from scripts.k8s_coverage import namespace_problems, network_problems, scaling_problems
from scripts.k8s_pods import workload_problems
from scripts.k8s_pools import deployed_pools, pool_problems
from scripts.k8s_provision import provisioning_problems
from scripts.k8s_references import reference_problems
from scripts.k8s_render import SERVICES, render_overlays

Document = dict[str, Any]
KUBERNETES_VERSIONS = ("1.30", "1.37")
"""The oldest release the manifests are meant for, and the pinned kubectl's."""
MIN_REPLICAS = {"dev": 1, "production": 2}
"""The fewest replicas of every service each overlay keeps."""


def schema_errors(documents: list[Document], version: str) -> list[str]:
    """Each object that the Kubernetes `version` schemas refuse, with the reason."""
    found = []
    for document in documents:
        reason = _schema_error(json.dumps(document, sort_keys=True), version)
        if reason is not None:
            where = f"{document['kind']} {document['metadata']['name']}"
            found.append(f"{where} is invalid for Kubernetes {version}: {reason}")
    return found


@functools.lru_cache(maxsize=4096)
def _schema_error(document: str, version: str) -> str | None:
    # Keyed by the object's text: each validation reads the schema files anew (~20 ms), and the
    # tests check many copies of the same output with one object broken.
    try:
        kubernetes_validate.validate(json.loads(document), version, strict=True)
    except (kubernetes_validate.ValidationError, kubernetes_validate.SchemaNotFoundError) as exc:
        return _reason(exc)
    return None


def _reason(exc: Exception) -> str:
    # A ValidationError wraps jsonschema's: its path says which field.
    path = "/".join(str(p) for p in getattr(exc, "path", ()))
    message = getattr(exc, "message", str(exc))
    return f"{path}: {message}" if path else message


def problems(overlay: str, documents: list[Document]) -> list[str]:
    """Everything wrong with what `overlay` renders to."""
    # Each runtime pool is scaled and budgeted as a service of its own (`atmosphere-dispatch-<runtime>`).
    scaled = (*SERVICES, *(name.removeprefix("atmosphere-") for name in sorted(deployed_pools(documents))))
    return [
        *(e for version in KUBERNETES_VERSIONS for e in schema_errors(documents, version)),
        *workload_problems(documents),
        *reference_problems(documents),
        *scaling_problems(documents, scaled, min_replicas=MIN_REPLICAS[overlay]),
        *network_problems(documents),
        *namespace_problems(documents),
        *provisioning_problems(documents),
        *pool_problems(documents),
    ]


@functools.cache
def rendered() -> dict[str, list[Document]]:
    """Both overlays, built once per process."""
    return render_overlays()


def main() -> int:
    """Check both overlays; print each problem; 1 when there is any."""
    failed = False
    for overlay, documents in rendered().items():
        found = problems(overlay, documents)
        print(f"{overlay}: {len(documents)} objects, {len(found)} problems")
        for problem in found:
            print(f"  {problem}")
        failed = failed or bool(found)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
