"""Token grants, callers and ownership: the one definition ingress and gRPC share."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from atmosphere.config import AuthOptions, TokenGrant
from atmosphere.contracts.common.v1.common_pb2 import Principal
from atmosphere.service import (
    ANONYMOUS,
    Authenticator,
    AuthError,
    conversation_user_key,
    scoped_conversation,
    user_key,
)

ADA = TokenGrant(token="token-ada-123", user_id="ada", paths=("/atmosphere/agent/*",))
BOB = TokenGrant(token="token-bob-456", user_id="bob", paths=("/atmosphere/agent/echo",))
AUTH = Authenticator((ADA, BOB))


def test_without_grants_every_caller_is_anonymous_and_owns_everything() -> None:
    caller = Authenticator(()).identify({}, {})
    assert caller.principal == ANONYMOUS
    assert caller.grant is None
    assert caller.may_access(owner="ada", path="/atmosphere/agent/x")
    assert caller.may_access(owner="", path="/anything")


@pytest.mark.parametrize(
    ("headers", "query", "user"),
    [
        ({"authorization": "Bearer token-ada-123"}, {}, "ada"),
        ({"authorization": "bearer   token-ada-123  "}, {}, "ada"),
        ({"x-api-key": "token-bob-456"}, {}, "bob"),
        ({}, {"access_token": "token-bob-456"}, "bob"),
    ],
)
def test_a_presented_token_names_its_user(headers: dict[str, str], query: dict[str, str], user: str) -> None:
    assert AUTH.identify(headers, query).user_id == user


@pytest.mark.parametrize(
    "headers",
    [{}, {"authorization": "Bearer "}, {"authorization": "Basic token-ada-123"}, {"x-api-key": "token-ada-12"}],
)
def test_a_missing_or_unknown_token_is_401(headers: dict[str, str]) -> None:
    with pytest.raises(AuthError) as raised:
        AUTH.identify(headers)
    assert raised.value.status == 401


def test_a_path_outside_the_grant_is_403() -> None:
    with pytest.raises(AuthError) as raised:
        AUTH.caller("/atmosphere/agent/notes", {"x-api-key": "token-bob-456"})
    assert raised.value.status == 403
    assert AUTH.principal("/atmosphere/agent/notes", {"x-api-key": "token-ada-123"}).user_id == "ada"


def test_only_the_owner_may_access_a_run_and_only_through_a_granted_path() -> None:
    bob = AUTH.identify({"x-api-key": "token-bob-456"})
    assert bob.may_access(owner="bob", path="/atmosphere/agent/echo")
    assert not bob.may_access(owner="ada", path="/atmosphere/agent/echo")
    assert not bob.may_access(owner="bob", path="/atmosphere/agent/notes")
    # An ownerless run (started anonymously) belongs to nobody once auth is on: fail closed.
    assert not bob.may_access(owner="", path="/atmosphere/agent/echo")


def test_conversations_are_scoped_per_user_and_scoping_a_scoped_id_scopes_it_again() -> None:
    ada = Principal(user_id="ada")
    mine = scoped_conversation("trip", ada)
    assert mine == f"{user_key('ada')}--trip"
    assert conversation_user_key(mine) == user_key("ada")
    # Bob naming Ada's scoped id gets a conversation of his own, not hers.
    stolen = scoped_conversation(mine, Principal(user_id="bob"))
    assert stolen != mine
    assert conversation_user_key(stolen) == user_key("bob")
    # Anonymous ids stay as given and belong to no user.
    assert scoped_conversation("trip", ANONYMOUS) == "trip"
    assert conversation_user_key("trip") == ""
    assert conversation_user_key("0123456789abcde--x") == ""  # 15 hex digits: not a user key


@pytest.mark.parametrize("user_id", ["", "   ", "anonymous", "Anonymous"])
def test_a_grant_must_name_a_real_user(user_id: str) -> None:
    with pytest.raises(ValidationError, match="user_id"):
        TokenGrant(token="long-enough", user_id=user_id)


def test_grants_parse_from_json() -> None:
    options = AuthOptions.model_validate_json('{"auth_tokens": [{"token": "abcdefgh", "user_id": " ada "}]}')
    assert options.auth_tokens[0].user_id == "ada"
    assert options.auth_tokens[0].allows("/atmosphere/agent/anything")


def test_an_anonymous_caller_cannot_choose_a_users_quota_bucket() -> None:
    anonymous = Principal(auth_method="anonymous")
    forged = f"{user_key('ada')}--notes"
    scoped = scoped_conversation(forged, anonymous)
    assert conversation_user_key(scoped) == ""  # counted with the other anonymous conversations
    assert scoped != forged
    assert scoped_conversation("plain-id", anonymous) == "plain-id"  # ordinary ids are untouched
