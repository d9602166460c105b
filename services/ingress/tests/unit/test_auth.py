import pytest

from atmosphere.ingress.auth import AdminGate, Authenticator, AuthError
from atmosphere.ingress.errors import MalformedRequestError as InboundError
from atmosphere.ingress.inbound import parse_approval, parse_inbound
from atmosphere.ingress.settings import IngressSettings, TokenGrant

GRANTS = (
    TokenGrant(token="token-ada-123", user_id="ada", roles=("admin",), paths=("/atmosphere/agent/*",)),
    TokenGrant(token="token-bob-456", user_id="bob", paths=("/atmosphere/agent/echo",)),
)


def test_no_grants_means_anonymous() -> None:
    assert Authenticator(()).principal("/x", {}, {}).auth_method == "anonymous"


def test_tokens_map_to_principals_per_path() -> None:
    auth = Authenticator(GRANTS)
    ada = auth.principal("/atmosphere/agent/assistant", {"authorization": "Bearer token-ada-123"}, {})
    assert (ada.user_id, ada.auth_method, list(ada.roles)) == ("ada", "bearer", ["admin"])
    bob = auth.principal("/atmosphere/agent/echo", {"x-api-key": "token-bob-456"}, {})
    assert (bob.user_id, bob.auth_method) == ("bob", "api-key")
    assert auth.principal("/atmosphere/agent/echo", {}, {"access_token": "token-bob-456"}).user_id == "bob"
    for headers, status in (
        ({}, 401),
        ({"authorization": "Bearer wrong-token"}, 401),
        ({"authorization": "Basic token-ada-123"}, 401),
    ):
        with pytest.raises(AuthError) as raised:
            auth.principal("/atmosphere/agent/echo", headers, {})
        assert raised.value.status == status
    with pytest.raises(AuthError) as raised:
        auth.principal("/atmosphere/agent/assistant", {"authorization": "Bearer token-bob-456"}, {})
    assert raised.value.status == 403


def test_the_admin_gate_fails_closed() -> None:
    AdminGate(required=False, token="").check({})
    with pytest.raises(AuthError) as raised:
        AdminGate(required=True, token="").check({"authorization": "Bearer anything"})
    assert raised.value.status == 403
    gate = AdminGate(required=True, token="s3cret-admin")
    gate.check({"authorization": "bearer s3cret-admin"})
    with pytest.raises(AuthError) as raised:
        gate.check({"authorization": "Bearer nope"})
    assert raised.value.status == 401


def test_settings_parse_model_pairs_and_grants(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ATMOSPHERE_AI_OPENAI_MODELS", "gpt-4o=assistant, echo=echo")
    monkeypatch.setenv("ATMOSPHERE_INGRESS__AUTH_TOKENS", '[{"token": "abcdefgh", "user_id": "ada"}]')
    settings = IngressSettings()
    assert settings.ai_openai_models == {"gpt-4o": "assistant", "echo": "echo"}
    assert settings.ingress.auth_tokens[0].paths == ("*",)
    monkeypatch.setenv("ATMOSPHERE_AI_OPENAI_MODELS", "broken")
    with pytest.raises(ValueError, match="model=agent"):
        IngressSettings()


@pytest.mark.parametrize(
    ("raw", "action", "payload"),
    [
        ("/__approval/apr_0123456789ab/approve", "approve", ""),
        ("/__approval/apr_0123456789ab/yes", "approve", ""),
        (
            '/__approval/apr_0123456789ab/approve {"arguments": {"path": "/b"}}',
            "approve",
            '{"arguments": {"path": "/b"}}',
        ),
        ("/__approval/apr_0123456789ab/approve {not json", "deny", ""),
        ("/__approval/apr_0123456789ab/approve [1]", "deny", ""),
        ("/__approval/apr_0123456789ab/deny", "deny", ""),
        ("/__approval/apr_0123456789ab/respond done by hand", "respond", '"done by hand"'),
        ('/__approval/apr_0123456789ab/respond {"ok": true}', "respond", '{"ok": true}'),
        ("/__approval/apr_0123456789ab/respond", "deny", ""),
        ("/__approval/apr_0123456789ab/explode", "deny", ""),
    ],
)
def test_approval_replies_deny_when_in_doubt(raw: str, action: str, payload: str) -> None:
    reply = parse_approval(raw)
    assert (reply.approval_id, reply.action, reply.payload_json) == ("apr_0123456789ab", action, payload)
    assert parse_inbound(raw) == reply


def test_a_malformed_approval_is_an_inbound_error() -> None:
    with pytest.raises(InboundError):
        parse_inbound("/__approval/notanid/approve")
