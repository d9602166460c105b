"""`atmosphere.bus` against raw nats-py, in the same process and the same run.

Arms (all on one local nats-server, interleaved in shuffled blocks, R rounds):
  * request/reply round trip: raw nats-py request + callback responder (twice, as an A/A
    control) versus `bus.request` + `bus.serve`, each doing the same protobuf work;
  * publish throughput: raw `nc.publish` of a serialized message (twice, A/A) versus
    `bus.publish` of the message.

Reported: medians, per-round paired differences/ratios with their IQR. Targets (issue 2):
the wrapper keeps >= 80 % of raw publish throughput and adds <= 20 µs per round trip.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import sys
import tempfile
from pathlib import Path

import nats
from nats.aio.msg import Msg

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import Arm, added, interleave, iqr

from atmosphere.bus import MessageContext, Router, connect
from atmosphere.contracts.run.v1.run_pb2 import RunEvent, TextDelta
from atmosphere.contracts.tape.v1.tape_pb2 import GetStepsRequest, GetStepsResponse
from atmosphere.testing import NatsServer

EVENT = RunEvent(
    run_id="0123456789abcdef0123456789abcdef", seq=42, session_id="s" * 36, text_delta=TextDelta(text="token ")
)


async def main(rounds: int, requests: int, messages: int) -> int:
    with tempfile.TemporaryDirectory() as scratch:
        server = NatsServer(Path(scratch)).start()
        try:
            return await _bench(server.url, rounds, requests, messages)
        finally:
            server.stop()


async def _bench(url: str, rounds: int, requests: int, messages: int) -> int:
    async with contextlib.AsyncExitStack() as stack:
        raw_server = await nats.connect(url)
        raw_client = await nats.connect(url)
        stack.push_async_callback(raw_server.close)
        stack.push_async_callback(raw_client.close)
        bus_server = await stack.enter_async_context(connect(url, name="bench-server"))
        bus_client = await stack.enter_async_context(connect(url, name="bench-client"))

        async def raw_respond(msg: Msg) -> None:
            request = GetStepsRequest.FromString(msg.data)
            await raw_server.publish(msg.reply, GetStepsResponse(run_id=request.run_id).SerializeToString())

        await raw_server.subscribe("bench.raw", cb=raw_respond)
        router = Router()

        async def bus_respond(request: GetStepsRequest, _ctx: MessageContext) -> GetStepsResponse:
            return GetStepsResponse(run_id=request.run_id)

        router.add("bench.bus", GetStepsRequest, bus_respond)
        await stack.enter_async_context(bus_server.serve(router))
        await raw_server.flush()
        request = GetStepsRequest(run_id="r", from_seq=1, max=10)

        async def raw_rtt() -> int:
            for _ in range(requests):
                reply = await raw_client.request("bench.raw", request.SerializeToString(), timeout=5)
                GetStepsResponse.FromString(reply.data)
            return requests

        async def bus_rtt() -> int:
            for _ in range(requests):
                await bus_client.request("bench.bus", request, GetStepsResponse, timeout=5)
            return requests

        async def raw_pub() -> int:
            for _ in range(messages):
                await raw_client.publish("bench.pub.raw", EVENT.SerializeToString())
            await raw_client.flush()
            return messages

        async def bus_pub() -> int:
            for _ in range(messages):
                await bus_client.publish("bench.pub.bus", EVENT)
            await bus_client.client.flush()
            return messages

        rtt = [Arm("raw nats-py", raw_rtt), Arm("raw nats-py (A/A)", raw_rtt), Arm("atmosphere.bus", bus_rtt)]
        pub = [Arm("raw nats-py", raw_pub), Arm("raw nats-py (A/A)", raw_pub), Arm("atmosphere.bus", bus_pub)]
        await interleave([*rtt, *pub], rounds=rounds)

    print(f"\nbus_roundtrip: {rounds} rounds, {requests} requests and {messages} publishes per block\n")
    print("request/reply round trip, µs per round trip (lower is better)")
    for arm in rtt:
        print(f"  {arm.name:<20} wall {arm.median:8.1f}   cpu {arm.cpu_median:8.1f}")
    wall_added = added(rtt[2], rtt[:2])
    cpu_added = added(rtt[2], rtt[:2], cpu=True)
    noise = added(rtt[1], rtt[:1])
    lo, hi = iqr(wall_added)
    print(
        f"  added by the wrapper: wall {statistics.median(wall_added):+.1f} µs (IQR {lo:+.1f}..{hi:+.1f}),"
        f" cpu {statistics.median(cpu_added):+.1f} µs; A/A wall noise {statistics.median(noise):+.1f} µs"
    )

    print("\npublish throughput (higher is better)")
    for arm in pub:
        print(f"  {arm.name:<20} {1e6 / arm.median:10.0f} msg/s   cpu {arm.cpu_median:6.2f} µs/msg")
    raw_rate = [1e6 / statistics.fmean(pair) for pair in zip(pub[0].samples, pub[1].samples, strict=True)]
    kept = [(1e6 / mine) / base for mine, base in zip(pub[2].samples, raw_rate, strict=True)]
    control = [b / a for a, b in zip(pub[0].samples, pub[1].samples, strict=True)]
    lo, hi = iqr(kept)
    print(
        f"  wrapper / raw throughput: median {statistics.median(kept):.2f} (IQR {lo:.2f}..{hi:.2f});"
        f" A/A ratio {statistics.median(control):.2f}"
    )

    rtt_added = statistics.median(wall_added)
    throughput_kept = statistics.median(kept)
    rtt_ok = rtt_added <= 20.0
    pub_ok = throughput_kept >= 0.80
    print(
        f"\ntargets: added round trip <= 20 µs: {'PASS' if rtt_ok else 'FAIL'};"
        f" throughput kept >= 80 %: {'PASS' if pub_ok else 'FAIL'}"
    )
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=41)
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--messages", type=int, default=20000)
    args = parser.parse_args()
    raise SystemExit(asyncio.run(main(args.rounds, args.requests, args.messages)))
