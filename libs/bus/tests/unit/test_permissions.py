"""The permission matrix: who may publish and subscribe where, in a namespace."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest

from atmosphere.bus import JetStreamLayout, RequiredLayout, run_queue, subjects
from atmosphere.bus.permissions import (
    AUTH_CONFIG_FILE,
    SERVICE_ROLES,
    Credential,
    Role,
    authorization_config,
    inbox_prefix,
    new_credentials,
    permissions,
    role_layout,
    user_name,
    write_credentials,
)
from atmosphere.bus.runs import MAX_NESTING

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
                assert entry in {"$JS.API.INFO", "$JS.API.STREAM.NAMES"} or STREAM_PREFIX in entry, (role, entry)
                # ... and a consumer's filter, when the subject names one, is a subject of ours.
                if ".CONSUMER.CREATE." in entry:
                    assert entry.split(".", 6)[6].startswith(f"{NS}.atmo."), (role, entry)
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
        subjects.mcp_tool("docs"),
        subjects.memory_tool("write_todos"),
        subjects.sandbox_session_tool("i1", "code_exec"),
        subjects.sandbox_release("i1"),
    ):
        assert publishers(subject) == {Role.DISPATCH}, subject


def test_only_the_service_that_serves_a_subject_subscribes_to_it() -> None:
    served = {
        subjects.tool("search"): Role.SANDBOX,
        subjects.mcp_tool("docs"): Role.SANDBOX,
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
    # Stored events are read by direct get (replays, and the tape recording them): no consumer.
    readers = {Role.INGRESS, Role.DISPATCH, Role.OBSERVER, Role.TAPE}
    assert api_users(f"$JS.API.STREAM.MSG.GET.{events}") == readers
    assert api_users(f"$JS.API.DIRECT.GET.{events}") == readers
    assert api_users(f"$JS.API.DIRECT.GET.{events}.{wire(subjects.run_events('r1'))}") == readers
    assert api_users(f"$JS.API.CONSUMER.CREATE.{events}") == set()
    assert api_users(f"$JS.API.CONSUMER.DURABLE.CREATE.{events}.tape-1") == set()


def test_nobody_but_the_provisioner_creates_a_consumer_and_it_only_the_run_queues() -> None:
    # Whoever may create a consumer chooses where the server delivers it (push to any subject),
    # and `$JS.API.CONSUMER.CREATE.<stream>` updates any consumer named in its body.
    every_stream = [
        *(STREAM_PREFIX + s.name for s in JetStreamLayout().streams()),
        *(f"KV_{STREAM_PREFIX}{b.name}" for b in JetStreamLayout().buckets()),
        *(f"OBJ_{STREAM_PREFIX}{b.name}" for b in JetStreamLayout().object_buckets()),
    ]
    for stream in every_stream:
        for subject in (
            f"$JS.API.CONSUMER.CREATE.{stream}",
            f"$JS.API.CONSUMER.CREATE.{stream}.probe",
            f"$JS.API.CONSUMER.CREATE.{stream}.probe.{NS}.atmo.x",
            f"$JS.API.CONSUMER.DURABLE.CREATE.{stream}.probe",
            f"$JS.API.CONSUMER.DELETE.{stream}.probe",
        ):
            assert api_users(subject) == set(), subject
    runs = STREAM_PREFIX + subjects.RUNS_STREAM
    for level, consumer in enumerate(run_queue.consumers()):
        filtered = f"$JS.API.CONSUMER.CREATE.{runs}.{consumer.durable}.{wire(subjects.run_submit_level(level))}"
        assert api_users(filtered) == {Role.PROVISIONER}
        # Dispatch binds to them: info, next message, acknowledgements; nothing more.
        assert api_users(f"$JS.API.CONSUMER.MSG.NEXT.{runs}.{consumer.durable}") == {Role.DISPATCH}
        assert api_users(f"$JS.ACK.{runs}.{consumer.durable}.1.2.3.4.5") == {Role.DISPATCH}
        assert api_users(f"$JS.API.CONSUMER.INFO.{runs}.{consumer.durable}") == {Role.DISPATCH, Role.PROVISIONER}
    # A runtime pool's consumers are named after its runtime, unknown here: dispatch may bind any
    # consumer of the run queue (all of them are its own), of no other stream.
    for level in range(MAX_NESTING + 1):
        durable = run_queue.durable_name(level, "langchain")
        pool_filter = wire(subjects.run_submit_level(level, "langchain"))
        assert api_users(f"$JS.API.CONSUMER.CREATE.{runs}.{durable}.{pool_filter}") == {Role.PROVISIONER}
        assert api_users(f"$JS.API.CONSUMER.MSG.NEXT.{runs}.{durable}") == {Role.DISPATCH}
        assert api_users(f"$JS.ACK.{runs}.{durable}.1.2.3.4.5") == {Role.DISPATCH}
    # Only with a pool queue's filter: not the default pool's queue, nor run events.
    assert api_users(f"$JS.API.CONSUMER.CREATE.{runs}.other.{wire(subjects.run_submit_level(0))}") == set()
    assert api_users(f"$JS.API.CONSUMER.CREATE.{runs}.other.{wire(subjects.run_events_all())}") == set()
    events = STREAM_PREFIX + subjects.EVENTS_STREAM
    assert api_users(f"$JS.API.CONSUMER.MSG.NEXT.{events}.other") == set()


def test_replicas_read_their_log_and_hear_of_its_writes() -> None:
    # Memory and governance apply their own log by direct get, woken by its subject.
    assert subscribers(subjects.memory_log()) == {Role.MEMORY}
    assert subscribers(subjects.governance_log("decision")) == {Role.GOVERNANCE}
    assert api_users(f"$JS.API.DIRECT.GET.{STREAM_PREFIX}{subjects.MEMORY_LOG_STREAM}") == {Role.MEMORY}
    assert api_users(f"$JS.API.DIRECT.GET.{STREAM_PREFIX}{subjects.GOVERNANCE_LOG_STREAM}") == {Role.GOVERNANCE}


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
    assert not any(
        "STREAM.CREATE" in e or "STREAM.UPDATE" in e or "PURGE" in e or "CONSUMER" in e for e in granted.publish
    )
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


def test_only_the_provisioner_makes_the_layout_and_it_reads_and_writes_nothing() -> None:
    layout = JetStreamLayout()
    names = [
        *(STREAM_PREFIX + s.name for s in layout.streams()),
        *(f"KV_{STREAM_PREFIX}{b.name}" for b in layout.buckets()),
        *(f"OBJ_{STREAM_PREFIX}{b.name}" for b in layout.object_buckets()),
    ]
    for name in names:
        for op in ("CREATE", "UPDATE"):
            assert api_users(f"$JS.API.STREAM.{op}.{name}") == {Role.PROVISIONER}, (op, name)
        assert api_users(f"$JS.API.STREAM.DELETE.{name}") == set(), name
    provisioner = permissions(Role.PROVISIONER, namespace=NS)
    assert not provisioner.responds
    assert all(e.startswith("$JS.API.") for e in provisioner.publish)
    assert not any(".PURGE." in e or ".MSG." in e or ".DIRECT." in e for e in provisioner.publish)
    assert provisioner.subscribe == (f"{inbox_prefix(user_name(Role.PROVISIONER, NS))}.>",)


def test_purges_are_the_journals_writer_and_the_object_buckets_users() -> None:
    purgers = {
        name: api_users(f"$JS.API.STREAM.PURGE.{name}")
        for name in (
            *(STREAM_PREFIX + s.name for s in JetStreamLayout().streams()),
            *(f"KV_{STREAM_PREFIX}{b.name}" for b in JetStreamLayout().buckets()),
            f"OBJ_{STREAM_PREFIX}{subjects.TOOL_RESULTS_BUCKET}",
        )
    }
    assert {name: who for name, who in purgers.items() if who} == {
        STREAM_PREFIX + subjects.JOURNAL_STREAM: {Role.DISPATCH},
        f"OBJ_{STREAM_PREFIX}{subjects.TOOL_RESULTS_BUCKET}": {Role.DISPATCH, Role.SANDBOX},
    }


def test_a_role_checks_at_start_exactly_what_it_uses() -> None:
    layout = JetStreamLayout(consumers=run_queue.consumers())
    assert role_layout(Role.SANDBOX, layout) == RequiredLayout(
        buckets=(subjects.TOOLS_BUCKET,), object_buckets=(subjects.TOOL_RESULTS_BUCKET,)
    )
    assert role_layout(Role.TAPE, layout) == RequiredLayout(
        streams=(subjects.EVENTS_STREAM,), buckets=(subjects.AGENTS_BUCKET,)
    )
    dispatch = role_layout(Role.DISPATCH, layout)
    assert dispatch.consumers == run_queue.consumers()
    assert set(dispatch.streams) == {subjects.RUNS_STREAM, subjects.EVENTS_STREAM, subjects.JOURNAL_STREAM}
    assert role_layout(Role.PROVISIONER, layout) == layout.required()
    for role in SERVICE_ROLES:
        # It may inspect every stream and bucket it checks (a refused look would only time out).
        granted = permissions(role)
        needed = role_layout(role, layout)
        for name in (
            *needed.streams,
            *(f"KV_{b}" for b in needed.buckets),
            *(f"OBJ_{b}" for b in needed.object_buckets),
        ):
            assert granted.may_publish(f"$JS.API.STREAM.INFO.{name}"), (role, name)
        for consumer in needed.consumers:
            assert granted.may_publish(f"$JS.API.CONSUMER.INFO.{consumer.stream}.{consumer.durable}"), role


def test_every_stream_and_bucket_of_the_layout_is_used_by_some_role() -> None:
    # One added to the layout needs its readers and writers in `permissions`, or nobody can use it.
    layout = JetStreamLayout()
    for stream in layout.streams():
        users = {
            role
            for role in Role
            if any(
                permissions(role).may_publish(f"$JS.API.{op}.{stream.name}{tail}")
                for op, tail in (("CONSUMER.MSG.NEXT", ".dispatch"), ("DIRECT.GET", ""))
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
