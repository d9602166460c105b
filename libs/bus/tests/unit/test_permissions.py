"""The permission matrix: who may publish and subscribe where, in a namespace."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest

from atmosphere.bus import JetStreamLayout, subjects
from atmosphere.bus.permissions import (
    AUTH_CONFIG_FILE,
    SERVICE_ROLES,
    Credential,
    Role,
    authorization_config,
    inbox_prefix,
    new_credentials,
    permissions,
    user_name,
    write_credentials,
)

NS = "team.dev"
STREAM_PREFIX = "TEAM_DEV_"


def wire(subject: str) -> str:
    return f"{NS}.{subject}"


def publishers(subject: str) -> set[Role]:
    return {role for role in Role if permissions(role, namespace=NS).may_publish(wire(subject))}


def subscribers(subject: str) -> set[Role]:
    return {role for role in Role if permissions(role, namespace=NS).may_subscribe(wire(subject))}


def api_users(subject: str) -> set[Role]:
    return {role for role in Role if permissions(role, namespace=NS).may_publish(subject)}


def test_the_namespace_is_applied_to_every_entry() -> None:
    for role in Role:
        granted = permissions(role, namespace=NS)
        for entry in granted.publish:
            if entry.startswith("$"):
                # JetStream's own subjects carry our names as stream names, prefixed.
                assert entry == "$JS.API.INFO" or STREAM_PREFIX in entry, (role, entry)
            else:
                assert entry.startswith(f"{NS}.atmo."), (role, entry)
        for entry in granted.subscribe:
            assert entry.startswith(f"{NS}.atmo.") or entry == f"{inbox_prefix(user_name(role, NS))}.>", (role, entry)


def test_without_a_namespace_entries_are_the_logical_subjects() -> None:
    granted = permissions(Role.SANDBOX)
    assert "atmo.tool.*" in granted.subscribe
    assert "$KV.ATMO_TOOLS.>" in granted.publish
    assert granted.may_subscribe(subjects.tool("search"))
    assert not granted.may_subscribe(wire(subjects.tool("search")))


def test_only_ingress_and_dispatch_submit_runs_and_only_dispatch_submits_sub_runs() -> None:
    assert publishers(subjects.run_submit("echo")) == {Role.INGRESS, Role.DISPATCH}
    for level in (1, 2, 3):
        assert publishers(subjects.run_submit("echo", level=level)) == {Role.DISPATCH}


def test_only_dispatch_publishes_run_events_but_for_the_submitters_run_id_event() -> None:
    # Seq 1 of a run (its run id) is written by whoever submits it (`runs.submit_run`); every
    # later event by the dispatch worker running it.
    assert publishers(subjects.run_events("r1")) == {Role.DISPATCH, Role.INGRESS}
    assert publishers(subjects.run_probe("r1")) == {Role.DISPATCH}
    assert publishers(subjects.run_journal("r1")) == {Role.DISPATCH}


def test_only_dispatch_calls_tools() -> None:
    for subject in (
        subjects.tool("search"),
        subjects.memory_tool("write_todos"),
        subjects.sandbox_session_tool("i1", "code_exec"),
        subjects.sandbox_release("i1"),
    ):
        assert publishers(subject) == {Role.DISPATCH}, subject


def test_only_the_service_that_serves_a_subject_subscribes_to_it() -> None:
    served = {
        subjects.tool("search"): Role.SANDBOX,
        subjects.sandbox_session_tool("i1", "code_exec"): Role.SANDBOX,
        subjects.sandbox_release("i1"): Role.SANDBOX,
        subjects.memory("history.load"): Role.MEMORY,
        subjects.memory_tool("write_file"): Role.MEMORY,
        subjects.governance("admit"): Role.GOVERNANCE,
        subjects.governance("admin.reload"): Role.GOVERNANCE,
        subjects.tape("runs"): Role.TAPE,
        subjects.run_control("r1"): Role.DISPATCH,
        subjects.conversation_closed(): Role.DISPATCH,
        subjects.run_submit("echo"): None,  # a stream captures it; nobody subscribes
    }
    for subject, server in served.items():
        assert subscribers(subject) == ({server} if server else set()), subject
    for role in SERVICE_ROLES:
        assert subscribers(subjects.service_health(role)) == {role}
        assert subscribers(subjects.service_info(role)) == {role}


def test_run_events_are_read_by_their_followers_only() -> None:
    assert subscribers(subjects.run_events("r1")) == {Role.INGRESS, Role.DISPATCH, Role.OBSERVER}
    assert subscribers(subjects.run_events_all()) == {Role.INGRESS, Role.DISPATCH, Role.OBSERVER}
    events = STREAM_PREFIX + subjects.EVENTS_STREAM
    # Ordered replays (ephemeral consumers) and stored messages; tape records with a durable.
    readers = {Role.INGRESS, Role.DISPATCH, Role.OBSERVER}
    assert api_users(f"$JS.API.CONSUMER.CREATE.{events}") == readers
    assert api_users(f"$JS.API.STREAM.MSG.GET.{events}") == readers
    assert api_users(f"$JS.API.DIRECT.GET.{events}.{wire(subjects.run_events('r1'))}") == readers
    assert api_users(f"$JS.API.CONSUMER.DURABLE.CREATE.{events}.tape-1") == {Role.TAPE}
    assert api_users(f"$JS.ACK.{events}.tape-1.1.2.3.4.5") == {Role.TAPE}


def test_governance_admin_and_checks_are_each_callers_own() -> None:
    assert publishers(subjects.governance("admin.reload")) == {Role.INGRESS}
    assert publishers(subjects.governance("decisions")) == {Role.INGRESS}
    assert publishers(subjects.governance("admit")) == {Role.DISPATCH}
    assert publishers(subjects.governance("check_tool")) == {Role.DISPATCH}
    assert publishers(subjects.governance("screen_facts")) == {Role.MEMORY}


def test_the_observer_reads_events_and_the_tape_and_nothing_else() -> None:
    granted = permissions(Role.OBSERVER, namespace=NS)
    assert not granted.responds
    ours = [e for e in granted.publish if not e.startswith("$")]
    assert ours == [wire(subjects.tape("x")).removesuffix(".x") + ".>"]
    assert not any("STREAM.CREATE" in e or "STREAM.UPDATE" in e or "PURGE" in e for e in granted.publish)
    assert not granted.may_publish(wire(subjects.run_control("r1")))


def test_nobody_deletes_streams_or_reads_another_inbox() -> None:
    for role in Role:
        granted = permissions(role, namespace=NS)
        for name in (subjects.RUNS_STREAM, subjects.EVENTS_STREAM, subjects.JOURNAL_STREAM):
            assert not granted.may_publish(f"$JS.API.STREAM.DELETE.{STREAM_PREFIX}{name}")
            assert not granted.may_publish(f"$JS.API.CONSUMER.DELETE.{STREAM_PREFIX}{name}.x")
        assert not granted.may_subscribe("_INBOX.>")
        assert not granted.may_subscribe(">")
        for other in Role:
            if other is not role:
                assert not granted.may_subscribe(f"{inbox_prefix(user_name(other, NS))}.abc")


def test_every_service_provisions_the_whole_layout() -> None:
    layout = JetStreamLayout()
    names = [
        *(s.name for s in layout.streams()),
        *(f"KV_{b.name}" for b in layout.buckets()),
        *(f"OBJ_{b.name}" for b in layout.object_buckets()),
    ]
    for role in SERVICE_ROLES:
        granted = permissions(role)
        for name in names:
            for op in ("CREATE", "UPDATE", "INFO"):
                assert granted.may_publish(f"$JS.API.STREAM.{op}.{name}"), (role, op, name)
    assert not permissions(Role.OBSERVER).may_publish(f"$JS.API.STREAM.CREATE.{subjects.EVENTS_STREAM}")


def test_every_stream_and_bucket_of_the_layout_is_used_by_some_role() -> None:
    # One added to the layout needs its readers and writers in `permissions`, or nobody can use it.
    layout = JetStreamLayout()
    for stream in layout.streams():
        users = {
            role
            for role in Role
            if any(
                permissions(role).may_publish(f"$JS.API.{op}.{stream.name}{tail}")
                for op, tail in (("CONSUMER.CREATE", ""), ("CONSUMER.DURABLE.CREATE", ".d"), ("STREAM.MSG.GET", ""))
            )
        }
        writers = {role for role in Role if any(permissions(role).may_publish(s) for s in stream.subjects)}
        assert users, f"nobody reads {stream.name}"
        assert writers, f"nobody writes {stream.name}"
    for bucket in layout.buckets():
        assert any(permissions(role).may_publish(f"$KV.{bucket.name}.k") for role in Role), (
            f"nobody writes {bucket.name}"
        )
    for objects in layout.object_buckets():
        assert any(permissions(role).may_publish(f"$O.{objects.name}.M.k") for role in Role), objects.name


def test_wildcard_subscriptions_need_one_entry_covering_them() -> None:
    granted = permissions(Role.INGRESS, namespace=NS)
    assert granted.may_subscribe(wire(subjects.run_events_all()))
    assert not granted.may_subscribe(f"{NS}.atmo.run.>")
    assert not granted.may_subscribe(f"{NS}.atmo.*.r1.evt")


def test_user_names_and_inboxes() -> None:
    assert user_name(Role.TAPE) == "atmo-tape"
    assert user_name(Role.TAPE, NS) == "team.dev.atmo-tape"
    assert inbox_prefix("team.dev.atmo-tape") == "_INBOX_team_dev_atmo-tape"
    with pytest.raises(ValueError, match="namespace"):
        user_name(Role.TAPE, "bad ns")


def test_the_server_config_lists_every_user_with_its_permissions() -> None:
    credentials = new_credentials(namespace=NS)
    text = authorization_config(credentials.values(), namespace=NS, extra_users=[{"user": "admin", "password": "x"}])
    assert text.startswith("authorization: ")
    users = {u["user"]: u for u in json.loads(text.removeprefix("authorization: "))["users"]}
    assert set(users) == {user_name(r, NS) for r in Role} | {"admin"}
    sandbox = users[user_name(Role.SANDBOX, NS)]
    assert sandbox["password"] == credentials[Role.SANDBOX].password
    assert sandbox["permissions"] == permissions(Role.SANDBOX, namespace=NS).server_config()
    assert sandbox["permissions"]["allow_responses"] is True
    assert "allow_responses" not in users[user_name(Role.OBSERVER, NS)]["permissions"]
    with pytest.raises(ValueError, match="twice"):
        authorization_config([*credentials.values(), credentials[Role.TAPE]], namespace=NS)


def test_credentials_are_fresh_and_never_shown() -> None:
    first, second = new_credentials(), new_credentials()
    assert all(first[r].password != second[r].password for r in Role)
    assert len({c.password for c in first.values()}) == len(Role)
    assert first[Role.TAPE].password not in repr(first[Role.TAPE])
    assert Credential(Role.TAPE, "u", "p").env() == {"ATMOSPHERE_NATS__USER": "u", "ATMOSPHERE_NATS__PASSWORD": "p"}


def test_written_files_are_private_and_match(tmp_path: Path) -> None:
    out = tmp_path / "creds"
    files = write_credentials(out, namespace=NS)
    assert files.server_config == out / AUTH_CONFIG_FILE
    assert set(files.env_files) == set(Role)
    for path in (files.server_config, *files.env_files.values()):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
    config = json.loads(files.server_config.read_text().removeprefix("authorization: "))
    passwords = {u["user"]: u["password"] for u in config["users"]}
    for role, path in files.env_files.items():
        env = dict(line.split("=", 1) for line in path.read_text().splitlines())
        assert env == files.credentials[role].env()
        assert passwords[env["ATMOSPHERE_NATS__USER"]] == env["ATMOSPHERE_NATS__PASSWORD"]
    # Written again: new passwords, still private, nothing else left in the directory.
    again = write_credentials(out, namespace=NS)
    assert again.credentials[Role.INGRESS].password != files.credentials[Role.INGRESS].password
    assert sorted(p.name for p in out.iterdir()) == sorted([AUTH_CONFIG_FILE, *(f"{r}.env" for r in Role)])
