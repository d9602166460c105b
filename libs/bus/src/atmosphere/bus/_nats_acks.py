"""Where the acknowledgements of `NatsBus.js_publish_nowait` come back: one inbox, matched by token."""

from __future__ import annotations

import asyncio
import itertools
import json

from nats.aio.client import Client
from nats.aio.msg import Msg

from atmosphere.bus._api import PublishAck
from atmosphere.bus._nats_core import SUBSCRIPTION_PENDING_LIMIT
from atmosphere.bus.errors import BusError, StreamUnavailableError


class AckInbox:
    """One inbox subscription for every acknowledgement a connection waits for, each a future.

    A future is forgotten once it is done, or cancelled by whoever gave up on it.
    """

    def __init__(self, client: Client, stream_prefix: str) -> None:
        """Subscribe on `client` at the first `expect`; stream names lose `stream_prefix`."""
        self._nc = client
        self._stream_prefix = stream_prefix
        self._acks: dict[str, asyncio.Future[PublishAck]] = {}
        self._prefix = ""
        self._tokens = itertools.count()

    async def expect(self) -> tuple[str, asyncio.Future[PublishAck]]:
        """A reply subject for one publish, and the future its acknowledgement resolves."""
        if not self._prefix:
            prefix = self._nc.new_inbox() + "."
            await self._nc.subscribe(prefix + "*", cb=self._on_ack, pending_msgs_limit=SUBSCRIPTION_PENDING_LIMIT)
            self._prefix = prefix
        token = str(next(self._tokens))
        ack: asyncio.Future[PublishAck] = asyncio.get_running_loop().create_future()
        self._acks[token] = ack
        ack.add_done_callback(lambda _: self._acks.pop(token, None))
        return self._prefix + token, ack

    async def _on_ack(self, msg: Msg) -> None:
        ack = self._acks.pop(msg.subject[len(self._prefix) :], None)
        if ack is None or ack.done():
            return  # given up on (and sent again), or a duplicate answer
        if (msg.headers or {}).get("Status") == "503":
            # No responders: usually a stream without a leader for a moment (the caller retries).
            ack.set_exception(StreamUnavailableError(msg.subject))
            return
        try:
            answer = json.loads(msg.data)
            if "error" in answer:
                reason = answer["error"].get("description", "refused")
                ack.set_exception(BusError(f"jetstream refused the message: {reason}"))
                return
            stream = str(answer["stream"]).removeprefix(self._stream_prefix)
            ack.set_result(PublishAck(stream=stream, seq=int(answer["seq"]), duplicate=bool(answer.get("duplicate"))))
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            ack.set_exception(BusError(f"malformed jetstream acknowledgement: {exc}"))
