"""`PermissionMode` on `@agent`/`@coordinator`/`@ai_endpoint`, and `roles=` on `@tool`."""

from __future__ import annotations

import pytest

from atmosphere.sdk import PermissionMode, UserError, agent, ai_endpoint, coordinator, tool
from atmosphere.sdk.host import spec_of


def test_the_default_mode_is_default() -> None:
    @agent(name="plain")
    class Plain:
        """Plain."""

    assert spec_of(Plain).permission_mode is PermissionMode.DEFAULT


def test_every_declaration_takes_a_mode_as_a_value_or_a_name() -> None:
    @agent(name="planner", permission_mode=PermissionMode.PLAN)
    class Planner:
        """Plans."""

    @coordinator(name="boss", permission_mode="deny_all")
    class Boss:
        """Delegates."""

    @ai_endpoint(path="/api/edit", permission_mode="Accept-Edits")
    class Edit:
        """Edits."""

    assert spec_of(Planner).permission_mode is PermissionMode.PLAN
    assert spec_of(Boss).permission_mode is PermissionMode.DENY_ALL
    assert spec_of(Edit).permission_mode is PermissionMode.ACCEPT_EDITS


@pytest.mark.parametrize("value", ["yolo", "", 3, None])
def test_an_unknown_mode_fails_at_decoration_time(value: object) -> None:
    with pytest.raises(UserError, match="permission_mode must be a PermissionMode"):

        @agent(name="bad", permission_mode=value)  # type: ignore[arg-type]
        class Bad:
            """Bad."""


def test_strictness_orders_the_modes() -> None:
    order = [
        PermissionMode.BYPASS,
        PermissionMode.ACCEPT_EDITS,
        PermissionMode.DEFAULT,
        PermissionMode.PLAN,
        PermissionMode.DENY_ALL,
    ]
    assert sorted(PermissionMode, key=lambda m: m.strictness) == order


@pytest.mark.parametrize(
    ("base", "requested", "expected"),
    [
        (PermissionMode.DEFAULT, PermissionMode.PLAN, PermissionMode.PLAN),
        (PermissionMode.DEFAULT, PermissionMode.BYPASS, PermissionMode.DEFAULT),
        (PermissionMode.BYPASS, PermissionMode.ACCEPT_EDITS, PermissionMode.ACCEPT_EDITS),
        (PermissionMode.DENY_ALL, PermissionMode.PLAN, PermissionMode.DENY_ALL),
        (PermissionMode.PLAN, PermissionMode.PLAN, PermissionMode.PLAN),
    ],
)
def test_a_request_can_only_tighten(base: PermissionMode, requested: PermissionMode, expected: PermissionMode) -> None:
    assert base.stricter(requested) is expected


@pytest.mark.parametrize(
    ("text", "mode"),
    [
        ("plan", PermissionMode.PLAN),
        (" DENY_ALL ", PermissionMode.DENY_ALL),
        ("accept-edits", PermissionMode.ACCEPT_EDITS),
        ("PermissionMode.BYPASS", PermissionMode.BYPASS),
        ("nope", None),
        ("", None),
    ],
)
def test_modes_parse_by_name_in_any_case(text: str, mode: PermissionMode | None) -> None:
    assert PermissionMode.parse(text) is mode


def test_a_tool_records_its_roles() -> None:
    @tool(roles=("admin", "ops", "admin"))
    def purge() -> str:
        """Purge everything."""
        return "done"

    @tool
    def look() -> str:
        """Look."""
        return "seen"

    assert purge.roles == ("admin", "ops")
    assert look.roles == ()


@pytest.mark.parametrize("roles", ["admin", ("admin", ""), ("admin", 3), 7])
def test_roles_must_be_a_list_of_names(roles: object) -> None:
    with pytest.raises(UserError, match="roles must be a list of role names"):

        @tool(roles=roles)  # type: ignore[call-overload, untyped-decorator]
        def purge() -> str:
            """Purge everything."""
            return "done"
