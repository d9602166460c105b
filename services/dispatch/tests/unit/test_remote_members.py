"""Remote fleet members as a dispatch resolves them: the app's declarations, the deployment's settings.

No A2A server here (and no `a2a` extra needed): what the settings accept, and what the info says.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import SecretStr, ValidationError

from atmosphere.dispatch.app import Dispatch
from atmosphere.dispatch.remote_delegation import EXTRA, RemoteMember, missing_client
from atmosphere.dispatch.settings import DelegationOptions, DispatchSettings, LlmSettings, RemoteAgentSetting

ROOT = Path(__file__).resolve().parents[4]
MOVED = "https://research.internal:8443/atmosphere/a2a/researcher"


def settings(delegation: DelegationOptions) -> DispatchSettings:
    return DispatchSettings(
        app="examples.remote_fleet:app",
        app_dir=ROOT,
        llm=LlmSettings(base_url="http://127.0.0.1:9/v1", model="m"),
        delegation=delegation,
    )


def test_the_deployment_moves_a_declared_member_and_the_info_says_if_it_is_reachable() -> None:
    remote = RemoteAgentSetting(url=MOVED, token=SecretStr("s3cr3t"))
    dispatch = Dispatch.resolve(settings(DelegationOptions(remotes={"researcher": remote})))

    assert dispatch.remote_fleets == {
        "lead": {"researcher": RemoteMember("researcher", MOVED, "s3cr3t", "Finds sources.")}
    }
    expected = (
        "ACTIVE(a2a https://research.internal:8443)" if missing_client() is None else f"INACTIVE(install {EXTRA})"
    )
    assert dispatch.info()["remoteAgents"] == {"researcher": expected}
    assert "s3cr3t" not in repr(dispatch.info())


def test_without_settings_the_declared_url_is_used() -> None:
    dispatch = Dispatch.resolve(settings(DelegationOptions()))
    assert dispatch.remote_fleets["lead"]["researcher"].url == "http://127.0.0.1:8081/atmosphere/a2a/researcher"


@pytest.mark.parametrize(
    ("remotes", "problem"),
    [
        ({"researcher": {"url": "ftp://b.example/a2a"}}, "http:// or https://"),
        ({"researcher": {"url": "https://u:p@b.example/a2a"}}, "must not hold credentials"),
        ({"researcher": {"uri": "https://b.example/a2a"}}, "Extra inputs are not permitted"),
        ({"../x": {"url": "https://b.example/a2a"}}, "a remote agent's name"),
    ],
)
def test_a_malformed_remote_setting_stops_dispatch_at_start(remotes: object, problem: str) -> None:
    with pytest.raises(ValidationError, match=problem):
        DelegationOptions.model_validate({"remotes": remotes})


def test_the_remote_deadline_is_within_the_tools_own() -> None:
    with pytest.raises(ValidationError):
        DelegationOptions(remote_timeout=121)
