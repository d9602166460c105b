"""Two governance replicas on one nats-server keep one decision log and one set of counters.

Each replica runs through its real `serve()` with a data directory of its own and the same policy
file. Requests to the queue group "governance" reach either replica at random; to ask one replica
in particular, each runs on a connection that also answers its subjects with a suffix naming it
(`Pinned`): the same responders, on a subscription the queue group never sees.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from google.protobuf.message import Message

from atmosphere.bus import Bus, NatsBus, Router, connect, subjects
from atmosphere.contracts.common.v1.common_pb2 import Principal, Usage
from atmosphere.contracts.common.v1.service_pb2 import HealthCheckRequest, HealthCheckResponse
from atmosphere.contracts.governance.v1.governance_pb2 import (
    AdminRequest,
    AdminResponse,
    AdmitRequest,
    Decision,
    ListDecisionsRequest,
    ListDecisionsResponse,
    RunEndedAck,
    RunEndedReport,
)
from atmosphere.testing import wait_until

from .conftest import service_map

ADA = Principal(user_id="ada", tenant="acme")
RATE_LIMIT = 4
LIMITS = f"""\
policies:
  - {{name: four-a-minute, type: rate-limit, config: {{limit: {RATE_LIMIT}, window-seconds: 600}}}}
"""
SLOTS = """\
policies:
  - {name: one-at-a-time, type: concurrency-limit, config: {max-concurrent: 1}}
"""
PRICING = {"models": {"m": {"input": 0.5, "output": 0.5}}}
"""$0.50 per million tokens: a run of 2,000,000 tokens costs $1."""


class Pinned(NatsBus):
    """A replica's connection that also serves every route at `<subject>.<label>` (outside any queue group)."""

    def __init__(self, base: NatsBus, *, namespace: str, label: str) -> None:
        super().__init__(base.client, namespace=namespace)
        self.label = label

    @contextlib.asynccontextmanager
    async def serve(self, router: Router, *, queue: str | None = None, max_inflight: int = 256) -> AsyncIterator[None]:
        pinned = Router()
        for route in router.routes:
            pinned.add(f"{route.subject}.{self.label}", route.request_type, route.handler)
        async with super().serve(router, queue=queue, max_inflight=max_inflight), super().serve(pinned):
            yield


class Replica:
    """One governance replica, asked by name through its pinned subjects."""

    def __init__(self, client: Bus, label: str) -> None:
        self.client, self.label = client, label

    async def ask(self, op: str, request: Message, reply: type[Any]) -> Any:
        return await self.client.request(f"{subjects.governance(op)}.{self.label}", request, reply, timeout=10)

    async def admit(self, run_id: str) -> Decision:
        answer: Decision = await self.ask("admit", AdmitRequest(run_id=run_id, agent="a", principal=ADA), Decision)
        return answer

    async def end(self, run_id: str, tokens: int = 0) -> RunEndedAck:
        report = RunEndedReport(run_id=run_id, agent="a", principal=ADA, model="m", usage=[Usage(input_tokens=tokens)])
        ack: RunEndedAck = await self.ask("run_ended", report, RunEndedAck)
        return ack

    async def admin(self, op: str, **body: object) -> Any:
        reply = await self.ask(f"admin.{op}", AdminRequest(body_json=json.dumps(body)), AdminResponse)
        return json.loads(reply.result_json)

    async def decisions(self) -> list[tuple[str, str, bool, str]]:
        reply = await self.ask("decisions", ListDecisionsRequest(limit=100), ListDecisionsResponse)
        return [(d.decision_id, d.run_id, d.allowed, d.reason) for d in reply.decisions]


class Replicas:
    """Starts governance replicas on `nats_url`, each with its own data directory."""

    def __init__(self, nats_url: str, namespace: str, root: Path, client: Bus, governance: dict[str, Any]) -> None:
        self.nats_url, self.namespace, self.root, self.client = nats_url, namespace, root, client
        self.governance = governance

    @contextlib.asynccontextmanager
    async def run(self, label: str) -> AsyncIterator[Replica]:
        serve, settings = service_map(
            self.nats_url, self.namespace, self.root / label, ("governance",), governance=self.governance
        )["governance"]
        stop = asyncio.Event()
        async with connect(self.nats_url, name=f"governance-{label}", namespace=self.namespace) as base:
            bus = Pinned(base, namespace=self.namespace, label=label)
            task = asyncio.create_task(serve(settings, stop=stop, bus=bus))
            replica = Replica(self.client, label)

            async def ready() -> bool:
                if task.done():
                    task.result()
                with contextlib.suppress(Exception):
                    health = await self.client.request(
                        f"{subjects.service_health('governance')}.{label}",
                        HealthCheckRequest(),
                        HealthCheckResponse,
                        timeout=0.5,
                    )
                    return health.ready
                return False

            try:
                await wait_until(ready, timeout=30, what=f"governance replica {label} to be ready")
                yield replica
            finally:
                stop.set()
                await asyncio.wait_for(task, 30)


def policy_settings(root: Path, text: str) -> dict[str, Any]:
    root.mkdir(parents=True, exist_ok=True)
    (root / "policies.yaml").write_text(text)
    (root / "pricing.json").write_text(json.dumps(PRICING))
    return {"governance": {"policy_files": [root / "policies.yaml"], "pricing_file": root / "pricing.json"}}


@pytest.mark.timeout(120)
async def test_two_replicas_share_one_log_and_one_rate_limit_and_a_new_replica_catches_up(
    nats_url: str, bus_namespace: str, nats_bus: NatsBus, tmp_path: Path
) -> None:
    replicas = Replicas(nats_url, bus_namespace, tmp_path, nats_bus, policy_settings(tmp_path, LIMITS))
    async with replicas.run("a") as a:
        async with replicas.run("b") as b:
            for n in range(RATE_LIMIT):  # spread alternately over both
                assert (await (a if n % 2 == 0 else b).admit(f"r{n}")).allowed
            # A read waits for its replica to apply the log: both list the same four decisions.
            listed = await a.decisions()
            assert len(listed) == RATE_LIMIT
            assert await b.decisions() == listed
            # Each replica counted the other's admissions: the next one is refused by either.
            for replica in (a, b):
                refused = await replica.admit(f"over-{replica.label}")
                assert not refused.allowed
                assert refused.reason == f"rate-limited: user:ada exceeded {RATE_LIMIT} requests per 600s"
            listed = await b.decisions()
            assert await a.decisions() == listed
            assert len(listed) == RATE_LIMIT + 2
        # b is stopped; a new replica with a fresh data directory applies the stream from its start.
        async with replicas.run("c") as c:
            assert await c.decisions() == listed
            assert not (await c.admit("over-c")).allowed  # and counts what is still in the window
            assert await a.decisions() == await c.decisions()


@pytest.mark.timeout(120)
async def test_slots_cost_and_the_kill_switch_are_one_state_across_replicas(
    nats_url: str, bus_namespace: str, nats_bus: NatsBus, tmp_path: Path
) -> None:
    replicas = Replicas(nats_url, bus_namespace, tmp_path, nats_bus, policy_settings(tmp_path, SLOTS))
    async with replicas.run("a") as a, replicas.run("b") as b:
        assert (await a.admit("r1")).allowed
        await wait_until(lambda: held(b, 1), what="b to hold the slot a gave")
        refused = await b.admit("r2")
        assert (refused.allowed, refused.policy) == (False, "one-at-a-time")
        ack = await b.end("r1", tokens=2_000_000)  # the end reaches b, not a
        assert (ack.tenant, ack.cost_usd) == ("acme", 1.0)
        for replica in (a, b):
            summary = await replica.admin("summary")
            assert summary["heldConcurrencySlots"] == 0
            assert summary["spendUsdByTenant"] == {"acme": 1.0}
        assert (await a.admit("r3")).allowed  # the slot is free on a too

        armed = await a.admin("arm", reason="incident 9", operator="oncall")
        assert armed["armed"]
        assert (await b.admin("health"))["killSwitch"]["reason"] == "incident 9"
        stopped = await b.admit("r4")
        assert (stopped.allowed, stopped.reason) == (False, "incident 9")
        await b.admin("disarm", operator="oncall")
        assert (await a.admin("health"))["killSwitch"]["armed"] is False


async def held(replica: Replica, slots: int) -> bool:
    return bool((await replica.admin("summary"))["heldConcurrencySlots"] == slots)
