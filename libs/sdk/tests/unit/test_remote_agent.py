"""`RemoteAgent`: a coordinator's fleet member reached over A2A, declared and checked up front."""

from __future__ import annotations

import pytest

from atmosphere.sdk import App, RemoteAgent, UserError, agent, coordinator
from atmosphere.sdk.host import spec_of

URL = "https://b.example/atmosphere/a2a/researcher"


@agent(name="writer")
class Writer:
    """Writes."""


def test_a_coordinator_keeps_local_and_remote_members_apart() -> None:
    remote = RemoteAgent("researcher", URL, description="Finds sources.")

    @coordinator(name="lead", fleet=[Writer, remote])
    class Lead: ...

    spec = spec_of(Lead)
    assert spec.fleet == ("writer",)
    assert spec.remotes == (remote,)
    # The app checks only the local members: the remote one is served elsewhere.
    assert App(agents=[Writer, Lead]).agent("lead") is spec


def test_a_remote_without_url_is_left_to_the_deployment() -> None:
    assert RemoteAgent("researcher").url == ""


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("ftp://b.example/a2a", "http:// or https://"),
        ("file:///etc/passwd", "http:// or https://"),
        ("https://", "with a host"),
        ("https://user:secret@b.example/a2a", "must not hold credentials"),
        ("https://b.example/a2a?agent=x", "no query or fragment"),
        ("https://b.example:99999/a2a", "malformed"),
        ("https://b.example/" + "a" * 2100, "longer than"),
    ],
)
def test_a_remote_url_must_be_plain_http(url: str, problem: str) -> None:
    with pytest.raises(UserError, match=problem):
        RemoteAgent("researcher", url)


def test_a_remote_name_is_an_agent_name() -> None:
    with pytest.raises(UserError, match="must be 1-64 letters"):
        RemoteAgent("../researcher", URL)


def test_a_fleet_names_each_member_once() -> None:
    with pytest.raises(UserError, match=r"names \['writer'\] twice"):

        @coordinator(name="lead", fleet=[Writer, RemoteAgent("writer", URL)])
        class Lead: ...

    with pytest.raises(UserError, match="share a URL"):

        @coordinator(name="lead2", fleet=[RemoteAgent("a", URL), RemoteAgent("b", URL)])
        class Lead2: ...


def test_a_remote_member_cannot_shadow_an_agent_of_the_app() -> None:
    @coordinator(name="lead", fleet=[RemoteAgent("writer", URL)])
    class Lead: ...

    with pytest.raises(UserError, match="named like agents of the app"):
        App(agents=[Writer, Lead])
