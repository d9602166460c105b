"""Control of one running run: cancellation and approval decisions from `atmo.run.<id>.ctl`."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from atmosphere.bus import MessageContext, Router, subjects
from atmosphere.contracts.run.v1.run_pb2 import ApprovalDecision, Control, ControlAck

log = logging.getLogger("atmosphere.dispatch")


NOT_THE_OWNER = "unknown run"
"""The refusal of a control message from anyone but the run's owner: it reveals nothing."""


class RunControl:
    """What a client may ask of a run while it runs; answered by the worker that owns it.

    Only the run's owner may cancel it or answer its approvals: ingress checks that already,
    and the worker checks again (defense in depth), so one faulty edge cannot act on another
    user's run. A run without an owner (no-auth mode) takes control from anyone.
    """

    def __init__(self, run_id: str, *, owner: str = "") -> None:
        """Control run `run_id`, started by the user `owner` ("" for an anonymous run)."""
        self.run_id = run_id
        self.owner = owner
        self.cancel_reason: str | None = None
        self._on_cancel: Callable[[], object] | None = None
        self._approvals: dict[str, asyncio.Future[ApprovalDecision]] = {}

    @property
    def cancelled(self) -> bool:
        """Whether a cancel was accepted."""
        return self.cancel_reason is not None

    def on_cancel(self, callback: Callable[[], object]) -> None:
        """Call `callback` (once) when a cancel arrives; at once if one already did."""
        self._on_cancel = callback
        if self.cancelled:
            callback()

    def expect_approval(self, approval_id: str) -> asyncio.Future[ApprovalDecision]:
        """A future resolved by the matching decision."""
        future: asyncio.Future[ApprovalDecision] = asyncio.get_running_loop().create_future()
        self._approvals[approval_id] = future
        future.add_done_callback(lambda _: self._approvals.pop(approval_id, None))
        return future

    async def handle(self, message: Control, _ctx: MessageContext) -> ControlAck:
        """`atmo.run.<id>.ctl`: a cancel, or an approval decision (from the run's owner only)."""
        if not self.accepts_from(message):
            log.warning("run %s: refused a control message from someone other than its owner", self.run_id)
            return ControlAck(accepted=False, detail=NOT_THE_OWNER)
        action = message.WhichOneof("action")
        if action == "cancel":
            if self.cancel_reason is None:
                self.cancel_reason = message.cancel.reason or "cancelled by the client"
                log.info("run %s: cancel requested (%s)", self.run_id, self.cancel_reason)
                if self._on_cancel is not None:
                    self._on_cancel()
            return ControlAck(accepted=True)
        if action == "approval":
            future = self._approvals.get(message.approval.approval_id)
            if future is None or future.done():
                return ControlAck(accepted=False, detail="unknown or expired approval id")
            future.set_result(message.approval)
            return ControlAck(accepted=True)
        return ControlAck(accepted=False, detail="empty control message")

    def accepts_from(self, message: Control) -> bool:
        """Whether `message` comes from the run's owner (always, for a run without one)."""
        return not self.owner or message.principal.user_id == self.owner

    def router(self) -> Router:
        """The run's control subject."""
        router = Router()
        router.add(subjects.run_control(self.run_id), Control, self.handle)
        return router
