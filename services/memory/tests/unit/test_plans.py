from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import pytest

from atmosphere.memory.plans import (
    MAX_STEPS,
    AgentPlan,
    PlanError,
    PlanStatus,
    PlanStep,
    parse_write_todos,
    plan_wire,
    render_markdown,
    run_write_todos,
)
from atmosphere.memory.planstore import MAX_PLAN_BYTES, MAX_PLAN_FILES, PlanKey, PlanStore

TODOS_REQUIRED = "'todos' is required and must be an array of {content, status, activeForm}"
NOT_OBJECT = "each todo must be an object with 'content' and 'status'"
NO_CONTENT = "each todo needs a non-empty 'content'"

PLAN = AgentPlan(
    (
        PlanStep("Read the issue", PlanStatus.COMPLETED),
        PlanStep("Run tests", PlanStatus.IN_PROGRESS, "Running tests"),
        PlanStep("Write the fix", PlanStatus.PENDING),
        PlanStep("Ask for help", PlanStatus.ABANDONED),
    ),
    "Fix the bug",
)


# -- status ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "status"),
    [
        ("in_progress", PlanStatus.IN_PROGRESS),
        ("in-progress", PlanStatus.IN_PROGRESS),
        ("inprogress", PlanStatus.IN_PROGRESS),
        ("active", PlanStatus.IN_PROGRESS),
        ("doing", PlanStatus.IN_PROGRESS),
        ("completed", PlanStatus.COMPLETED),
        ("complete", PlanStatus.COMPLETED),
        ("done", PlanStatus.COMPLETED),
        ("finished", PlanStatus.COMPLETED),
        ("abandoned", PlanStatus.ABANDONED),
        ("cancelled", PlanStatus.ABANDONED),
        ("canceled", PlanStatus.ABANDONED),
        ("skipped", PlanStatus.ABANDONED),
        ("pending", PlanStatus.PENDING),
        ("todo", PlanStatus.PENDING),
        ("  IN_PROGRESS \n", PlanStatus.IN_PROGRESS),
        ("Done", PlanStatus.COMPLETED),
        ("CANCELLED", PlanStatus.ABANDONED),
        ("in progress", PlanStatus.PENDING),  # not an alias: unknown degrades to pending
        ("blocked", PlanStatus.PENDING),
        ("", PlanStatus.PENDING),
        ("   ", PlanStatus.PENDING),
        (None, PlanStatus.PENDING),
    ],
)
def test_status_parse_is_lenient(text: str | None, status: PlanStatus) -> None:
    assert PlanStatus.parse(text) is status


# -- parsing --------------------------------------------------------------------------------


def test_parse_full_arguments() -> None:
    plan = parse_write_todos(
        {
            "todos": [
                {"content": "Read the issue", "status": "done"},
                {"content": "Run tests", "status": "in_progress", "activeForm": "Running tests"},
                {"content": "Write the fix"},
                {"content": "Ask for help", "status": "skipped"},
            ],
            "goal": "Fix the bug",
        }
    )
    assert plan == PLAN


def test_double_encoded_todos_are_decoded() -> None:
    todos = [{"content": "Run tests", "status": "in_progress", "activeForm": "Running tests"}]
    plan = parse_write_todos({"todos": "  " + json.dumps(todos) + "\n"})
    assert plan.steps == (PlanStep("Run tests", PlanStatus.IN_PROGRESS, "Running tests"),)
    assert plan.goal is None


def test_values_are_stringified() -> None:
    plan = parse_write_todos({"todos": [{"content": 42, "status": True, "activeForm": 1.5}], "goal": 7})
    assert plan.steps == (PlanStep("42", PlanStatus.PENDING, "1.5"),)
    assert plan.goal == "7"
    nested = parse_write_todos({"todos": [{"content": {"a": [1, "é"]}}]})
    assert nested.steps[0].content == '{"a": [1, "é"]}'


@pytest.mark.parametrize("goal", [None, "", "   "])
def test_blank_goal_is_none(goal: str | None) -> None:
    assert parse_write_todos({"todos": [], "goal": goal}).goal is None


def test_empty_list_is_a_valid_plan() -> None:
    assert parse_write_todos({"todos": []}) == AgentPlan((), None)
    assert parse_write_todos({"todos": "[]"}) == AgentPlan((), None)


@pytest.mark.parametrize(
    "arguments",
    [
        None,
        {},
        {"todos": None},
        {"todos": ""},
        {"todos": "   "},
        {"todos": "not json"},
        {"todos": '{"content": "an object, not a list"}'},
        {"todos": json.dumps(json.dumps([{"content": "triple encoded"}]))},
        {"todos": "[" * 100_000},
        {"todos": {"content": "x"}},
        {"todos": 3},
        {"goal": "only a goal"},
    ],
)
def test_todos_required_error(arguments: dict[str, object] | None) -> None:
    with pytest.raises(PlanError) as caught:
        parse_write_todos(arguments)
    assert caught.value.message == TODOS_REQUIRED
    assert str(caught.value) == TODOS_REQUIRED


@pytest.mark.parametrize("item", ["Run tests", 1, None, ["Run tests", "pending"]])
def test_each_todo_must_be_an_object(item: object) -> None:
    with pytest.raises(PlanError, match=r"^each todo must be an object with 'content' and 'status'$"):
        parse_write_todos({"todos": [{"content": "ok"}, item]})


@pytest.mark.parametrize("item", [{}, {"content": None}, {"content": ""}, {"content": "  \t"}, {"status": "pending"}])
def test_each_todo_needs_content(item: dict[str, object]) -> None:
    with pytest.raises(PlanError, match=r"^each todo needs a non-empty 'content'$"):
        parse_write_todos({"todos": [item]})


def test_blank_step_cannot_be_built() -> None:
    with pytest.raises(PlanError):
        PlanStep("  ")


# -- rendering ------------------------------------------------------------------------------


def test_markdown_with_goal() -> None:
    assert render_markdown(PLAN) == (
        "Goal: Fix the bug\n- [x] Read the issue\n- [~] Running tests\n- [ ] Write the fix\n- [-] Ask for help"
    )


def test_markdown_without_goal() -> None:
    plan = AgentPlan((PlanStep("Run tests"), PlanStep("Ship", PlanStatus.COMPLETED)))
    assert render_markdown(plan) == "- [ ] Run tests\n- [x] Ship"


def test_markdown_empty() -> None:
    assert render_markdown(AgentPlan()) == "(no steps)"
    assert render_markdown(AgentPlan((), "Think")) == "Goal: Think\n(no steps)"
    assert render_markdown(AgentPlan((), "  ")) == "(no steps)"


def test_markdown_active_form_only_while_in_progress() -> None:
    plan = AgentPlan(
        (
            PlanStep("Run tests", PlanStatus.IN_PROGRESS, "  "),
            PlanStep("Lint", PlanStatus.PENDING, "Linting"),
            PlanStep("Build", PlanStatus.COMPLETED, "Building"),
            PlanStep("Deploy", PlanStatus.ABANDONED, "Deploying"),
        )
    )
    assert render_markdown(plan) == "- [~] Run tests\n- [ ] Lint\n- [x] Build\n- [-] Deploy"
    assert not render_markdown(plan).endswith("\n")


# -- wire -----------------------------------------------------------------------------------


def test_plan_wire_shape() -> None:
    assert plan_wire(PLAN, "conv-1", "assistant") == {
        "steps": [
            {"content": "Read the issue", "status": "completed"},
            {"content": "Run tests", "status": "in_progress", "activeForm": "Running tests"},
            {"content": "Write the fix", "status": "pending"},
            {"content": "Ask for help", "status": "abandoned"},
        ],
        "goal": "Fix the bug",
        "conversationId": "conv-1",
        "agentId": "assistant",
    }
    wire = plan_wire(AgentPlan((PlanStep("x", PlanStatus.IN_PROGRESS, " "),)), "c", "a")
    assert wire["steps"] == [{"content": "x", "status": "in_progress"}]
    assert wire["goal"] is None
    json.dumps(wire)  # serializable as is


# -- store: persistence ---------------------------------------------------------------------


def test_round_trip_and_document_shape(tmp_path: Path) -> None:
    store = PlanStore(tmp_path)
    assert store.get("assistant", "conv-1") is None
    assert not (tmp_path / "plans").exists()  # created lazily
    store.put("assistant", "conv-1", PLAN)
    assert store.get("assistant", "conv-1") == PLAN
    path = tmp_path / "plans" / "assistant" / "conv-1.json"
    assert store.path_of("assistant", "conv-1") == path
    assert json.loads(path.read_text("utf-8")) == {
        "goal": "Fix the bug",
        "steps": [
            {"content": "Read the issue", "status": "COMPLETED", "activeForm": None},
            {"content": "Run tests", "status": "IN_PROGRESS", "activeForm": "Running tests"},
            {"content": "Write the fix", "status": "PENDING", "activeForm": None},
            {"content": "Ask for help", "status": "ABANDONED", "activeForm": None},
        ],
    }
    assert [p.name for p in path.parent.iterdir()] == ["conv-1.json"]  # no temp file left behind


def test_put_replaces_the_whole_plan(tmp_path: Path) -> None:
    store = PlanStore(tmp_path)
    store.put("a", "c", PLAN)
    replacement = AgentPlan((PlanStep("Only step"),))
    store.put("a", "c", replacement)
    assert store.get("a", "c") == replacement


def test_unicode_round_trip(tmp_path: Path) -> None:
    store = PlanStore(tmp_path)
    plan = AgentPlan((PlanStep("Écrire le café ☕", PlanStatus.IN_PROGRESS, "Écrivant"),), "But: 完成")
    store.put("agent", "conv", plan)
    assert store.get("agent", "conv") == plan


def test_keys_are_independent(tmp_path: Path) -> None:
    store = PlanStore(tmp_path)
    one, two = AgentPlan((PlanStep("one"),)), AgentPlan((PlanStep("two"),))
    store.put("a", "c1", one)
    store.put("a", "c2", two)
    store.put("b", "c1", two)
    assert store.get("a", "c1") == one
    assert store.get("a", "c2") == two
    assert store.get("b", "c1") == two
    assert store.list() == [PlanKey("a", "c1"), PlanKey("a", "c2"), PlanKey("b", "c1")]
    assert store.list("a") == [PlanKey("a", "c1"), PlanKey("a", "c2")]
    assert store.list("nobody") == []


def test_delete_and_drop_conversation(tmp_path: Path) -> None:
    store = PlanStore(tmp_path)
    assert store.list() == []
    assert store.drop_conversation("c1") == 0
    assert not store.delete("a", "c1")
    for agent in ("a", "b", "c"):
        store.put(agent, "c1", PLAN)
    store.put("a", "c2", PLAN)
    assert store.delete("c", "c1")
    assert not store.delete("c", "c1")
    assert store.drop_conversation("c1") == 2
    assert store.list() == [PlanKey("a", "c2")]
    assert store.get("a", "c1") is None


@pytest.mark.parametrize(
    "content",
    [
        b"",
        b"not json",
        b"[]",
        b'{"goal": 1, "steps": []}',
        b'{"goal": null}',
        b'{"goal": null, "steps": "abc"}',
        b'{"goal": null, "steps": [{"content": "x", "status": "WHATEVER"}]}',
        b'{"goal": null, "steps": [{"content": "  ", "status": "PENDING"}]}',
        b'{"goal": null, "steps": [{"content": 3, "status": "PENDING"}]}',
        b'{"goal": null, "steps": [{"status": "PENDING"}]}',
        b"\xff\xfe",
        b'{"goal": "' + b"x" * (MAX_PLAN_BYTES + 10) + b'", "steps": []}',
    ],
)
def test_corrupt_document_reads_as_none(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "plans" / "a" / "c.json"
    path.parent.mkdir(parents=True)
    path.write_bytes(content)
    assert PlanStore(tmp_path).get("a", "c") is None


def test_lenient_document_fields(tmp_path: Path) -> None:
    path = tmp_path / "plans" / "a" / "c.json"
    path.parent.mkdir(parents=True)
    path.write_text('{"steps": [{"content": "x"}, {"content": "y", "status": "DONE_NOT", "activeForm": null}]}')
    assert PlanStore(tmp_path).get("a", "c") is None  # unknown enum name is corrupt
    path.write_text('{"steps": [{"content": "x"}, {"content": "y", "status": "COMPLETED", "activeForm": null}]}')
    assert PlanStore(tmp_path).get("a", "c") == AgentPlan((PlanStep("x"), PlanStep("y", PlanStatus.COMPLETED)))


def test_directory_in_place_of_a_plan(tmp_path: Path) -> None:
    (tmp_path / "plans" / "a" / "c.json").mkdir(parents=True)
    store = PlanStore(tmp_path)
    assert store.get("a", "c") is None
    with pytest.raises(PlanError, match=r"^Failed to persist plan a/c: "):
        store.put("a", "c", PLAN)
    with pytest.raises(PlanError, match=r"^Failed to delete plan a/c: "):
        store.delete("a", "c")
    assert store.list() == []


# -- store: bounds --------------------------------------------------------------------------


def test_step_limit(tmp_path: Path) -> None:
    store = PlanStore(tmp_path)
    store.put("a", "c", AgentPlan(tuple(PlanStep(f"s{i}") for i in range(MAX_STEPS))))
    with pytest.raises(PlanError) as caught:
        store.put("a", "c", AgentPlan(tuple(PlanStep(f"s{i}") for i in range(MAX_STEPS + 1))))
    assert caught.value.message == "plan rejected: 257 steps exceeds the 256-step limit"
    stored = store.get("a", "c")
    assert stored is not None
    assert len(stored.steps) == MAX_STEPS


def test_byte_limit(tmp_path: Path) -> None:
    store = PlanStore(tmp_path)
    plan = AgentPlan(tuple(PlanStep("x" * 1000) for _ in range(200)))
    size = len(
        json.dumps(
            {"goal": None, "steps": [{"content": "x" * 1000, "status": "PENDING", "activeForm": None}] * 200},
            separators=(",", ":"),
        )
    )
    assert size > MAX_PLAN_BYTES
    with pytest.raises(PlanError) as caught:
        store.put("a", "c", plan)
    assert caught.value.message == f"plan rejected: {size} bytes exceeds the 131072-byte limit"
    assert store.get("a", "c") is None
    assert not (tmp_path / "plans").exists()


def test_byte_limit_counts_utf8_bytes(tmp_path: Path) -> None:
    # 100 steps of 500 three-byte characters: under the limit in characters, over it in bytes.
    plan = AgentPlan(tuple(PlanStep("€" * 500) for _ in range(100)))
    with pytest.raises(PlanError, match=r"^plan rejected: \d+ bytes exceeds the 131072-byte limit$"):
        PlanStore(tmp_path).put("a", "c", plan)


def test_default_file_cap() -> None:
    assert MAX_PLAN_FILES == 1024
    with pytest.raises(ValueError, match="at least 1"):
        PlanStore(Path("/nonexistent"), max_plan_files=0)


def _age(store: PlanStore, agent: str, conversation: str, seconds_ago: int) -> None:
    path = store.path_of(agent, conversation)
    stamp = 1_700_000_000 - seconds_ago
    os.utime(path, (stamp, stamp))


def test_least_recently_modified_plans_are_evicted_at_the_cap(tmp_path: Path) -> None:
    store = PlanStore(tmp_path, max_plan_files=3)
    store.put("a", "old", PLAN)
    store.put("b", "middle", PLAN)
    store.put("a", "new", PLAN)
    _age(store, "a", "old", 300)
    _age(store, "b", "middle", 200)
    _age(store, "a", "new", 100)
    # Rewriting an existing plan at the cap evicts nothing.
    store.put("a", "old", PLAN)
    assert len(store.list()) == 3
    _age(store, "a", "old", 300)
    # A new plan at the cap evicts the least recently modified one, never rejects.
    store.put("c", "fresh", PLAN)
    assert store.list() == [PlanKey("a", "new"), PlanKey("b", "middle"), PlanKey("c", "fresh")]
    store.put("c", "fresher", PLAN)
    assert store.list() == [PlanKey("a", "new"), PlanKey("c", "fresh"), PlanKey("c", "fresher")]
    for i in range(10):
        store.put("d", f"c{i}", PLAN)
        assert len(store.list()) == 3
    assert store.get("d", "c9") == PLAN


def test_cap_of_one(tmp_path: Path) -> None:
    store = PlanStore(tmp_path, max_plan_files=1)
    store.put("a", "c1", PLAN)
    store.put("a", "c2", PLAN)
    assert store.list() == [PlanKey("a", "c2")]


# -- store: keys ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("agent", "conversation", "message"),
    [
        ("", "c", "agentId must not be blank"),
        ("  ", "c", "agentId must not be blank"),
        ("a", "", "conversationId must not be blank"),
        ("a", " \t", "conversationId must not be blank"),
        ("a/b", "c", "agentId contains illegal path characters: a/b"),
        ("a\\b", "c", "agentId contains illegal path characters: a\\b"),
        ("..", "c", "agentId contains illegal path characters: .."),
        ("a..b", "c", "agentId contains illegal path characters: a..b"),
        (".", "c", "agentId contains illegal path characters: ."),
        ("a", "../../etc/passwd", "conversationId contains illegal path characters: ../../etc/passwd"),
        ("a", "/abs", "conversationId contains illegal path characters: /abs"),
        ("a", "..", "conversationId contains illegal path characters: .."),
        ("a", "x\x00y", "conversationId contains illegal path characters: x\x00y"),
    ],
)
def test_key_validation(tmp_path: Path, agent: str, conversation: str, message: str) -> None:
    store = PlanStore(tmp_path)
    for call in (
        lambda: store.put(agent, conversation, PLAN),
        lambda: store.get(agent, conversation),
        lambda: store.delete(agent, conversation),
    ):
        with pytest.raises(PlanError) as caught:
            call()
        assert caught.value.message == message
    assert not (tmp_path / "plans").exists()


def test_drop_and_list_validate_their_key(tmp_path: Path) -> None:
    store = PlanStore(tmp_path)
    with pytest.raises(PlanError, match="conversationId contains illegal path characters"):
        store.drop_conversation("../x")
    with pytest.raises(PlanError, match="agentId must not be blank"):
        store.list("")


def test_dotted_but_legal_keys(tmp_path: Path) -> None:
    store = PlanStore(tmp_path)
    store.put("agent.v1", ".hidden", PLAN)
    store.put("agent.v1", "a.b.c", PLAN)
    assert store.list() == [PlanKey("agent.v1", ".hidden"), PlanKey("agent.v1", "a.b.c")]


def test_foreign_files_are_not_listed(tmp_path: Path) -> None:
    store = PlanStore(tmp_path)
    store.put("a", "c", PLAN)
    agent_dir = tmp_path / "plans" / "a"
    (agent_dir / ".plan-deadbeef.tmp").write_text("{}")
    (agent_dir / "notes.txt").write_text("hi")
    (agent_dir / "sub.json").mkdir()
    (tmp_path / "plans" / "stray.json").write_text("{}")
    assert store.list() == [PlanKey("a", "c")]


# -- store: concurrency ---------------------------------------------------------------------


def test_concurrent_puts_to_one_key_leave_a_valid_document(tmp_path: Path) -> None:
    store = PlanStore(tmp_path)
    plans = [AgentPlan(tuple(PlanStep(f"thread {t} step {i}") for i in range(50)), f"goal {t}") for t in range(8)]
    errors: list[BaseException] = []
    reads: list[AgentPlan | None] = []
    start = threading.Barrier(len(plans) + 1)

    def writer(plan: AgentPlan) -> None:
        try:
            start.wait()
            for _ in range(25):
                store.put("a", "c", plan)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    def reader() -> None:
        start.wait()
        for _ in range(200):
            reads.append(store.get("a", "c"))

    threads = [threading.Thread(target=writer, args=(p,)) for p in plans] + [threading.Thread(target=reader)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert not errors
    assert store.get("a", "c") in plans
    # Lock-free readers never observe a torn document: every read is absent or one whole plan.
    assert all(read is None or read in plans for read in reads)
    assert [p.name for p in (tmp_path / "plans" / "a").iterdir()] == ["c.json"]


def test_concurrent_new_plans_respect_the_cap(tmp_path: Path) -> None:
    store = PlanStore(tmp_path, max_plan_files=5)
    errors: list[BaseException] = []

    def writer(t: int) -> None:
        try:
            for i in range(10):
                store.put(f"agent{t}", f"c{i}", PLAN)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(t,)) for t in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert not errors
    assert len(store.list()) == 5


def test_lock_cache_is_bounded(tmp_path: Path) -> None:
    store = PlanStore(tmp_path)
    for i in range(300):
        store.put("a", f"c{i}", AgentPlan())
    assert len(store._locks) == 256


# -- store: symbolic links ------------------------------------------------------------------


def test_symlinked_plan_file_is_not_followed(tmp_path: Path) -> None:
    root, outside = tmp_path / "root", tmp_path / "outside"
    outside.mkdir()
    secret = outside / "secret.json"
    secret.write_text(json.dumps({"goal": "stolen", "steps": []}))
    store = PlanStore(root)
    store.put("a", "real", PLAN)
    link = root / "plans" / "a" / "c.json"
    link.symlink_to(secret)
    assert store.get("a", "c") is None  # not read through the link
    with pytest.raises(PlanError, match=r"^Path escapes workspace: plans/a/c\.json is a symbolic link$"):
        store.put("a", "c", PLAN)
    assert json.loads(secret.read_text()) == {"goal": "stolen", "steps": []}  # not written through
    assert store.list() == [PlanKey("a", "real")]  # links are not plans
    assert store.delete("a", "c")  # deleting removes the link, not its target
    assert secret.exists()
    assert not link.is_symlink()


def test_symlinked_agent_dir_is_not_followed(tmp_path: Path) -> None:
    root, outside = tmp_path / "root", tmp_path / "outside"
    (outside / "a").mkdir(parents=True)
    (outside / "a" / "c.json").write_text(json.dumps({"goal": "stolen", "steps": []}))
    (root / "plans").mkdir(parents=True)
    (root / "plans" / "a").symlink_to(outside / "a", target_is_directory=True)
    store = PlanStore(root)
    assert store.get("a", "c") is None
    with pytest.raises(PlanError, match=r"^Path escapes workspace: plans/a is a symbolic link$"):
        store.put("a", "new", PLAN)
    assert sorted(p.name for p in (outside / "a").iterdir()) == ["c.json"]
    assert store.list() == []
    assert store.drop_conversation("c") == 0
    assert (outside / "a" / "c.json").exists()


def test_symlinked_plans_dir_is_not_followed(tmp_path: Path) -> None:
    root, outside = tmp_path / "root", tmp_path / "outside"
    (outside / "a").mkdir(parents=True)
    (outside / "a" / "c.json").write_text(json.dumps({"goal": "stolen", "steps": []}))
    root.mkdir()
    (root / "plans").symlink_to(outside, target_is_directory=True)
    store = PlanStore(root, max_plan_files=1)
    assert store.get("a", "c") is None
    with pytest.raises(PlanError, match=r"^Path escapes workspace: plans is a symbolic link$"):
        store.put("a", "new", PLAN)
    assert store.list() == []
    assert (outside / "a" / "c.json").exists()  # eviction did not reach through the link either
    assert sorted(p.name for p in (outside / "a").iterdir()) == ["c.json"]


def test_symlinked_owner_root_is_allowed(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "link").symlink_to(real, target_is_directory=True)
    store = PlanStore(tmp_path / "link")
    store.put("a", "c", PLAN)
    assert store.get("a", "c") == PLAN
    assert (real / "plans" / "a" / "c.json").is_file()


# -- the tool -------------------------------------------------------------------------------


def test_run_without_store() -> None:
    assert run_write_todos(None, "a", "c", {"todos": []}) == (
        "write_todos unavailable: no plan store is bound to this session.",
        None,
    )


def test_run_success_stores_and_renders(tmp_path: Path) -> None:
    store = PlanStore(tmp_path)
    text, plan = run_write_todos(
        store,
        "assistant",
        "conv",
        {"todos": [{"content": "Run tests", "status": "doing", "activeForm": "Running tests"}], "goal": "Ship"},
    )
    assert text == "Goal: Ship\n- [~] Running tests"
    assert plan == AgentPlan((PlanStep("Run tests", PlanStatus.IN_PROGRESS, "Running tests"),), "Ship")
    assert store.get("assistant", "conv") == plan


def test_run_accepts_json_text(tmp_path: Path) -> None:
    text, plan = run_write_todos(PlanStore(tmp_path), "a", "c", '{"todos": "[{\\"content\\": \\"x\\"}]"}')
    assert text == "- [ ] x"
    assert plan is not None


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({}, TODOS_REQUIRED),
        (None, TODOS_REQUIRED),
        ("not json", TODOS_REQUIRED),
        ([{"content": "x"}], TODOS_REQUIRED),
        ({"todos": [1]}, NOT_OBJECT),
        ({"todos": [{"content": ""}]}, NO_CONTENT),
        ({"todos": [{"content": "x"}] * 257}, "plan rejected: 257 steps exceeds the 256-step limit"),
    ],
)
def test_run_failures_are_text(tmp_path: Path, arguments: object, message: str) -> None:
    store = PlanStore(tmp_path)
    assert run_write_todos(store, "a", "c", arguments) == (f"write_todos failed: {message}", None)
    assert store.get("a", "c") is None


@pytest.mark.parametrize(
    ("agent", "conversation", "message"),
    [
        ("", "c", "agentId must not be blank"),
        ("a", "../x", "conversationId contains illegal path characters: ../x"),
    ],
)
def test_run_key_failures_are_text(tmp_path: Path, agent: str, conversation: str, message: str) -> None:
    text, plan = run_write_todos(PlanStore(tmp_path), agent, conversation, {"todos": []})
    assert (text, plan) == (f"write_todos failed: {message}", None)


def test_run_io_failure_is_text(tmp_path: Path) -> None:
    (tmp_path / "plans").write_text("a file where the plans directory should be")
    text, plan = run_write_todos(PlanStore(tmp_path), "a", "c", {"todos": []})
    assert text.startswith("write_todos failed: Failed to persist plan a/c: ")
    assert plan is None


def test_run_overlong_key_is_text(tmp_path: Path) -> None:
    text, plan = run_write_todos(PlanStore(tmp_path), "a", "c" * 300, {"todos": []})
    assert text.startswith("write_todos failed: Failed to persist plan a/")
    assert plan is None


# ---- arguments write_todos does not take (issue 9: built-in tools accepted them silently)


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"todos": [], "plan": "x"}, "got an unknown argument 'plan' (it takes: todos, goal)"),
        ({"items": [{"content": "a"}], "title": "t"}, "got unknown arguments 'items', 'title' (it takes: todos, goal)"),
    ],
)
def test_unknown_arguments_are_refused_by_name(arguments: dict[str, object], message: str) -> None:
    with pytest.raises(PlanError) as caught:
        parse_write_todos(arguments)
    assert caught.value.message == message


def test_an_unknown_argument_is_a_write_todos_failure_and_nothing_is_stored(tmp_path: Path) -> None:
    store = PlanStore(tmp_path)
    text, plan = run_write_todos(store, "agent", "conv", {"todos": [{"content": "a"}], "todo": "typo"})
    assert text == "write_todos failed: got an unknown argument 'todo' (it takes: todos, goal)"
    assert plan is None
    assert store.get("agent", "conv") is None
