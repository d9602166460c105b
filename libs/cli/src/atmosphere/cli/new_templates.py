"""The files of `atmosphere new`'s starter kept as templates (`starter/`): its README and its deployment.

The deployment is one image of the project that holds the app and every service, so the
services that import the app (dispatch, governance, the sandbox) import this one. Atmosphere's
own docker-compose.yml and Kubernetes base run it: compose through `deploy/compose.env`
(`ATMOSPHERE_IMAGE`, `ATMOSPHERE_APP`), kustomize through the overlay `deploy/k8s/kustomization.yaml`
(the component `app-image` and one `images:` entry). Both name the same image, the one `--image`
gives. A template's `{{key}}` placeholders are filled here; the other braces are the files' own.
"""

from __future__ import annotations

import re
from importlib import resources
from pathlib import Path

from atmosphere.bus.permissions import AUTH_CONFIG_FILE, Role

_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
IMAGE = re.compile(
    rf"(?P<name>(?:[A-Za-z0-9.-]+(?::[0-9]+)?/)?{_COMPONENT}(?:/{_COMPONENT})*)(?::(?P<tag>[A-Za-z0-9_][A-Za-z0-9_.-]{{0,127}}))?"
)
"""A Docker image reference without a digest: `[registry[:port]/]path[:tag]`."""
DEFAULT_TAG = "0.1.0"
"""The tag of the default image: the starter's version."""


def kube_name(directory: Path) -> str:
    """A DNS label from the directory's name (`My_Agents` → `my-agents`): the namespace, the default image."""
    name = re.sub(r"[^a-z0-9-]+", "-", directory.resolve().name.lower()).strip("-")[:63].strip("-")
    return name or "atmosphere-agents"


def image_problem(image: str) -> str | None:
    """Why `image` cannot name the project's image, or None."""
    if IMAGE.fullmatch(image) is None:
        return f"{image!r} is not an image name like registry.example.com/team/my-agents:1.2.3 (no digest)"
    return None


def split_image(image: str) -> tuple[str, str]:
    """(name, tag) of `image`; `latest` when it has no tag, as Docker reads it."""
    found = IMAGE.fullmatch(image)
    if found is None:
        raise ValueError(image_problem(image))
    return found["name"], found["tag"] or "latest"


def render(template: str, values: dict[str, str]) -> str:
    """The text of `starter/<template>` with each `{{key}}` replaced."""
    text = (resources.files("atmosphere.cli") / "starter" / template).read_text()
    for key, value in values.items():
        text = text.replace("{{" + key + "}}", value)
    if left := re.findall(r"\{\{\w+\}\}", text):
        msg = f"starter/{template} has placeholders nobody fills: {left}"
        raise ValueError(msg)
    return text


def _secrets() -> str:
    """The overlay's Secrets: what `atmosphere bus-credentials --out deploy/k8s/credentials` writes."""
    lines = ["  - name: atmosphere-nats-auth", "    files:", f"      - credentials/{AUTH_CONFIG_FILE}"]
    for role in Role:
        lines += [f"  - name: atmosphere-nats-{role}", "    envs:", f"      - credentials/{role}.env"]
    return "\n".join(lines)


def template_files(directory: Path, *, distribution: str, package: str, image: str) -> dict[Path, str]:
    """The README, the image's Dockerfile and build context filter, and what runs it under compose and kustomize."""
    image_name, image_tag = split_image(image)
    values = {
        "name": directory.resolve().name,
        "distribution": distribution,
        "package": package,
        "app": f"{package}.agents:app",
        "image": image,
        "image_name": image_name,
        "image_tag": image_tag,
        "namespace": kube_name(directory),
        "secrets": _secrets(),
    }
    return {
        directory / "README.md": render("README.md", values),
        directory / "Dockerfile": render("Dockerfile", values),
        directory / ".dockerignore": render("dockerignore", values),
        directory / ".gitignore": render("gitignore", values),
        directory / "deploy" / "compose.env": render("compose.env", values),
        directory / "deploy" / "k8s" / "kustomization.yaml": render("kustomization.yaml", values),
        directory / "deploy" / "k8s" / "namespace.yaml": render("namespace.yaml", values),
    }
