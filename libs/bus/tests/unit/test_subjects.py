import pytest

from atmosphere.bus import run_queue, subjects


def test_builders_produce_the_documented_layout() -> None:
    assert subjects.run_submit("echo") == "atmo.submit.echo"
    assert subjects.run_submit_all() == "atmo.submit.>"
    assert subjects.run_submit("echo", level=2) == "atmo.submit.nested.2.echo"
    assert subjects.run_submit_level(0) == "atmo.submit.*"
    assert subjects.run_submit_level(1) == "atmo.submit.nested.1.*"
    with pytest.raises(ValueError, match="nesting level"):
        subjects.run_submit_level(-1)
    assert subjects.run_events("r1") == "atmo.run.r1.evt"
    assert subjects.run_events_all() == "atmo.run.*.evt"
    assert subjects.run_control("r1") == "atmo.run.r1.ctl"
    assert subjects.tool("get_weather") == "atmo.tool.get_weather"
    assert subjects.mcp_tool("docs") == "atmo.tool.mcp:docs"
    assert subjects.matches("atmo.tool.*", subjects.mcp_tool("docs"))
    assert subjects.governance("admit") == "atmo.gov.admit"
    assert subjects.memory("history.load") == "atmo.mem.history.load"
    assert subjects.tape("steps") == "atmo.tape.steps"
    assert subjects.service_health("tape") == "atmo.svc.tape.health"
    assert subjects.service_info("tape") == "atmo.svc.tape.info"
    assert subjects.memory_tool("write_todos") == "atmo.mem.tool.write_todos"
    assert subjects.matches(subjects.memory_tools_all(), subjects.memory_tool("ls"))
    assert not subjects.matches(subjects.memory_tools_all(), subjects.tool("ls"))
    assert subjects.conversation_closed() == "atmo.conv.closed"


@pytest.mark.parametrize("bad", ["", "a.b", "a b", "*", ">", "x*", "a\nb", "é", "x" * 129])
def test_unsafe_tokens_are_refused(bad: str) -> None:
    with pytest.raises(ValueError, match="invalid"):
        subjects.run_submit(bad)
    with pytest.raises(ValueError, match="invalid"):
        subjects.run_events(bad)


@pytest.mark.parametrize("bad", ["history..load", "history.*", ".load"])
def test_dotted_operations_are_checked_token_by_token(bad: str) -> None:
    with pytest.raises(ValueError, match="invalid"):
        subjects.memory(bad)


@pytest.mark.parametrize(
    ("pattern", "subject", "expected"),
    [
        ("a.b", "a.b", True),
        ("a.b", "a.c", False),
        ("a.*", "a.b", True),
        ("a.*", "a.b.c", False),
        ("a.>", "a.b.c", True),
        ("a.>", "a", False),
        ("*.b", "a.b", True),
        (">", "a", True),
        ("atmo.run.*.evt", "atmo.run.r1.evt", True),
        ("atmo.run.*.evt", "atmo.run.r1.ctl", False),
        ("a.b.c", "a.b", False),
    ],
)
def test_matches_follows_nats_wildcards(pattern: str, subject: str, expected: bool) -> None:
    assert subjects.matches(pattern, subject) is expected


@pytest.mark.parametrize(
    ("a", "b", "expected"),
    [
        ("atmo.run.submit.>", "atmo.run.*.evt", True),
        (subjects.run_submit_all(), subjects.run_events_all(), False),
        # The nesting levels' worker consumers share a work-queue stream: no two may overlap.
        (subjects.run_submit_level(0), subjects.run_submit_level(1), False),
        (subjects.run_submit_level(1), subjects.run_submit_level(2), False),
        (subjects.run_submit_level(0), subjects.run_submit("nested"), True),
        ("a.*", "a.b", True),
        ("a.>", "a", False),
        ("a.b", "a.c", False),
        ("a.*.c", "a.b.*", True),
    ],
)
def test_overlaps_detects_what_jetstream_refuses(a: str, b: str, expected: bool) -> None:
    assert subjects.overlaps(a, b) is expected
    assert subjects.overlaps(b, a) is expected


def test_namespace_validation() -> None:
    assert subjects.validate_namespace("") == ""
    assert subjects.validate_namespace("tenant.dev") == "tenant.dev"
    for bad in ("a..b", "a.*", "a b", ".a"):
        with pytest.raises(ValueError, match="namespace"):
            subjects.validate_namespace(bad)


POOLS = ("", "langchain", "nested", "pool", "openai-agents")
"""The default pool, ordinary runtime pools, and pools named like the subjects' own words."""


def test_no_two_pools_or_levels_share_a_queue() -> None:
    # Every pool's worker consumers share `ATMO_RUNS`, a work queue: JetStream refuses overlapping filters.
    filters = [subjects.run_submit_level(level, pool) for pool in POOLS for level in range(4)]
    for i, a in enumerate(filters):
        for b in filters[i + 1 :]:
            assert not subjects.overlaps(a, b), (a, b)


@pytest.mark.parametrize("pool", POOLS)
@pytest.mark.parametrize("level", range(4))
def test_a_submission_lands_in_its_pools_queue_only(pool: str, level: int) -> None:
    subject = subjects.run_submit("writer", level=level, pool=pool)
    queues = {(p, n) for p in POOLS for n in range(4) if subjects.matches(subjects.run_submit_level(n, p), subject)}
    assert queues == {(pool, level)}
    assert subjects.matches(subjects.run_submit_all(), subject)  # and `ATMO_RUNS` captures it


def test_the_default_pool_keeps_its_subjects() -> None:
    # Agents pinned to no runtime are queued where they always were: a deployment without pools is unchanged.
    assert subjects.run_submit("echo") == "atmo.submit.echo"
    assert subjects.run_submit("echo", level=2) == "atmo.submit.nested.2.echo"
    assert subjects.run_submit("echo", pool="langchain") == "atmo.submit.pool.langchain.echo"
    assert subjects.run_submit("echo", level=1, pool="langchain") == "atmo.submit.nested.1.pool.langchain.echo"


@pytest.mark.parametrize("pool", ["a.b", "*", ">", "has space", ""])
def test_a_pool_must_be_one_safe_token(pool: str) -> None:
    if not pool:
        assert run_queue.durable_name(0, pool) == "dispatch"
        return
    with pytest.raises(ValueError, match="dispatch pool"):
        subjects.run_submit("echo", pool=pool)
    with pytest.raises(ValueError, match="dispatch pool"):
        run_queue.durable_name(0, pool)


def test_each_pool_gets_a_worker_consumer_per_level() -> None:
    specs = run_queue.consumers(pools=["langchain", "", "langchain"])
    assert [(s.durable, s.filter_subject) for s in specs] == [
        ("dispatch", "atmo.submit.*"),
        ("dispatch-nested-1", "atmo.submit.nested.1.*"),
        ("dispatch-nested-2", "atmo.submit.nested.2.*"),
        ("dispatch-nested-3", "atmo.submit.nested.3.*"),
        ("dispatch-pool-langchain", "atmo.submit.pool.langchain.*"),
        ("dispatch-pool-langchain-nested-1", "atmo.submit.nested.1.pool.langchain.*"),
        ("dispatch-pool-langchain-nested-2", "atmo.submit.nested.2.pool.langchain.*"),
        ("dispatch-pool-langchain-nested-3", "atmo.submit.nested.3.pool.langchain.*"),
    ]
