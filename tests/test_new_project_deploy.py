"""A project of `atmosphere new` deploys in its own image: compose and kustomize run it, checked offline.

The project names one image (`--image`) in two files: `deploy/compose.env`, which Atmosphere's
docker-compose.yml reads (`ATMOSPHERE_IMAGE`, `ATMOSPHERE_APP`), and the overlay
`deploy/k8s/kustomization.yaml` on Atmosphere's base with the `app-image` component. Both are
checked as the repository's own deploy files are: compose against the Compose schema, the overlay
built with the real kustomize (through the `atmosphere` link the project's README makes) and held
to every check of `scripts.validate_k8s`. Every Atmosphere container must run the project's image
and every service read the project's app. tests/e2e/test_new_project.py serves that app.
"""

from __future__ import annotations

import re
import shlex
import shutil
import tomllib
from pathlib import Path
from typing import Any

import pytest

from atmosphere.bus.permissions import write_credentials
from atmosphere.cli.new import new_project
from scripts.k8s_pods import named, pod_spec, workloads
from scripts.k8s_render import ROOT, SERVICES, build
from scripts.validate_compose import load, schema_errors
from scripts.validate_k8s import problems
from tests.test_k8s_drain import container_environment, settings_of

Document = dict[str, Any]
IMAGE = "registry.example.com/team/my-agents:1.2.3"
APP = "my_agents.agents:app"


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`atmosphere new my-agents --image IMAGE`, linked to this checkout, with credentials: as its README says."""
    directory = tmp_path_factory.mktemp("own") / "my-agents"
    new_project(directory, image=IMAGE)
    (directory / "atmosphere").symlink_to(ROOT)  # `ln -s /path/to/atmosphere atmosphere`
    write_credentials(directory / "deploy" / "k8s" / "credentials")  # `atmosphere bus-credentials --out ...`
    return directory


@pytest.fixture(scope="module")
def rendered(project: Path) -> list[Document]:
    return build(project / "deploy" / "k8s")


def env_file(path: Path) -> dict[str, str]:
    """KEY=VALUE lines, as Compose reads an env file."""
    lines = [line for line in path.read_text().splitlines() if line.strip() and not line.startswith("#")]
    return dict(line.split("=", 1) for line in lines)


def readme_command(project: Path, start: str) -> list[str]:
    """The words of the README's command that begins with `start` (continued lines joined)."""
    text = (project / "README.md").read_text().replace("\\\n", " ")
    found = re.search(rf"^ +({re.escape(start)}.*)$", text, re.M)
    assert found, f"the starter's README has no `{start} ...` command"
    return shlex.split(found[1])


def atmosphere_containers(documents: list[Document]) -> dict[str, Document]:
    return {
        name: container
        for name, workload in workloads(documents).items()
        if name.startswith("atmosphere-")
        for container in pod_spec(workload)["containers"]
    }


def test_compose_runs_every_service_of_the_readme_in_the_projects_image(project: Path) -> None:
    variables = env_file(project / "deploy" / "compose.env")
    assert variables == {"ATMOSPHERE_IMAGE": IMAGE, "ATMOSPHERE_APP": APP}
    command = readme_command(project, "docker compose")
    assert command[:6] == [
        "docker",
        "compose",
        "-f",
        "atmosphere/docker-compose.yml",
        "--env-file",
        "deploy/compose.env",
    ]
    assert command[6:8] == ["up", "--no-build"]  # the image is the project's: never build Atmosphere's under its name
    compose = load(variables, project / command[3])
    assert schema_errors(compose) == []
    services = compose["services"]
    assert sorted(command[8:]) == sorted(SERVICES)
    # The services named and what they wait for (the JetStream layout's provisioning).
    for name in [*command[8:], "provision"]:
        assert services[name]["image"] == IMAGE, name
        assert services[name]["environment"]["ATMOSPHERE_APP"] == APP, name


def test_the_overlay_builds_and_passes_every_check_with_the_projects_image(
    project: Path, rendered: list[Document]
) -> None:
    # Held to the dev overlay's standard: one replica of each service at least.
    assert problems("dev", rendered) == []
    assert {n.removeprefix("atmosphere-") for n in atmosphere_containers(rendered)} == {*SERVICES, "provision"}
    for name, container in atmosphere_containers(rendered).items():
        assert container["image"] == IMAGE, name
    # The services that import the app read the project's (the image puts it on their path).
    for service in ("dispatch", "governance", "sandbox"):
        assert settings_of(service, container_environment(rendered, service)).app == APP, service
    assert set(named(rendered, "Namespace")) == {"my-agents"}
    assert {d["metadata"].get("namespace") for d in rendered if d["kind"] != "Namespace"} == {"my-agents"}


def test_both_files_name_the_image_the_readme_builds_and_pushes(project: Path) -> None:
    kustomization = (project / "deploy" / "k8s" / "kustomization.yaml").read_text()
    assert "newName: registry.example.com/team/my-agents\n" in kustomization
    assert 'newTag: "1.2.3"\n' in kustomization
    assert readme_command(project, "docker build") == ["docker", "build", "-t", IMAGE, "."]
    assert readme_command(project, "docker push") == ["docker", "push", IMAGE]


def test_the_repository_readme_walks_the_starters_commands(project: Path) -> None:
    # README.md's "Deploy your own agents" uses the same image name as this project.
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## Deploy your own agents") :]
    section = section[: section.index("\n## ", 1)].replace("\\\n", " ")
    for start in ("docker build", "docker push", "docker compose", "kubectl apply"):
        [line] = [line for line in section.splitlines() if line.startswith(start)]
        assert shlex.split(line, comments=True) == readme_command(project, start), start


def test_the_image_installs_the_project_with_every_extra_of_the_repositorys_images(project: Path) -> None:
    dockerfile = (project / "Dockerfile").read_text()
    assert '"my-agents"' in dockerfile  # the distribution of the project's pyproject
    assert tomllib.loads((project / "pyproject.toml").read_text())["project"]["name"] == "my-agents"
    # The doors and clients that service.Dockerfile installs with --all-extras.
    for service in ("ingress", "sandbox", "dispatch"):
        extras = tomllib.loads((ROOT / "services" / service / "pyproject.toml").read_text())["project"]
        names = ",".join(extras["optional-dependencies"])
        assert f'"atmosphere-ai-{service}[{names}]"' in dockerfile, service
    assert f"ATMOSPHERE_APP={APP}" in dockerfile
    assert "USER 10001:10001" in dockerfile  # the pods' runAsUser, compose's `user:`
    assert "exec python -m atmosphere.${SERVICE" in dockerfile
    ignored = (project / ".dockerignore").read_text().splitlines()
    assert ignored[-4:] == ["*", "!dist/*.whl", "!pyproject.toml", "!atmosphere-policies.yaml"]
    copied = re.findall(r"^COPY (?!--from)(.+) \S+$", dockerfile, re.M)
    assert copied == ["dist", "pyproject.toml atmosphere-policies.yam[l]"]


def test_a_runtime_pool_added_to_the_overlay_runs_the_projects_image(project: Path) -> None:
    # A pool imports the app too; the project puts its adapter in its dependencies, so its image has it.
    overlay = project / "deploy" / "k8s"
    staged = project / "deploy" / "k8s-with-a-pool"
    shutil.copytree(overlay, staged)
    text = (overlay / "kustomization.yaml").read_text()
    text = text.replace(
        "  - ../../atmosphere/deploy/k8s/components/app-image\n",
        "  - ../../atmosphere/deploy/k8s/components/pool-langchain\n"
        "  - ../../atmosphere/deploy/k8s/components/app-image\n",
    )
    text = text.replace(
        f"      - ATMOSPHERE_APP={APP}\n",
        f"      - ATMOSPHERE_APP={APP}\n      - ATMOSPHERE_DISPATCH__POOLS=langchain\n",
    )
    (staged / "kustomization.yaml").write_text(text)
    documents = build(staged)
    assert problems("dev", documents) == []
    assert atmosphere_containers(documents)["atmosphere-dispatch-langchain"]["image"] == IMAGE
