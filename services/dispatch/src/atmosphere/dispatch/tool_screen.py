"""The tool-output injection screen at the choke point: governance reads every result before the model does.

Each successful result is sent to governance (`atmo.gov.screen`, kind `tool_output`), which
applies its mode: ANNOTATE wraps a flagged result between banners, SANITIZE replaces it, OFF
passes it. Whatever governance returns is what the model, the client and the journal get. No
answer means the result is withheld (fail-closed): an unscreened result might carry the very
instructions the screen exists to stop.

A result larger than one screen request is screened by its head (Atmosphere scans only the
first 256 KiB too): a verdict that keeps the head unchanged keeps the whole result; banners
around the head are put around the whole result; a head governance rewrote stands alone, with
a note that the unscreened rest was withheld.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from atmosphere.bus import BusError
from atmosphere.bus.sizes import head, utf8_len
from atmosphere.contracts.governance.v1.governance_pb2 import ScreenedText
from atmosphere.contracts.run.v1.run_pb2 import RunSubmission
from atmosphere.dispatch.governance_client import GovernanceClient
from atmosphere.dispatch.tool_errors import SCREEN_NO_VERDICT, SCREEN_UNAVAILABLE

log = logging.getLogger("atmosphere.dispatch")

SCREEN_KIND = "tool_output"
MAX_SCREENED_BYTES = 256 * 1024
"""The most UTF-8 bytes of one result sent to the screen; a longer result is screened by its head."""
DROPPED = "[the result of tool {tool} was withheld by the injection screen]"
"""The result when governance drops it without saying what to show instead."""


@dataclass(frozen=True)
class Screened:
    """A result after the screen: the text the model gets, or the error it gets instead (withheld)."""

    text: str = ""
    error: str | None = None


async def screen_result(
    governance: GovernanceClient, run: RunSubmission, tool: str, content: str, *, max_bytes: int
) -> Screened:
    """`content` as governance lets the model see it; `max_bytes` bounds what one request carries."""
    sent = head(content, min(MAX_SCREENED_BYTES, max_bytes))
    try:
        response = await governance.screen(run, SCREEN_KIND, [sent], source=tool)
    except (BusError, ValueError) as exc:  # ValueError: text protobuf cannot encode (never sent)
        log.warning("run %s: the result of %s was not screened (%s); withheld", run.run_id, tool, exc)
        return Screened(error=SCREEN_UNAVAILABLE.format(tool=tool))
    if len(response.texts) != 1:
        log.warning("run %s: the screen answered %d texts for 1; withheld", run.run_id, len(response.texts))
        return Screened(error=SCREEN_NO_VERDICT.format(tool=tool))
    verdict = response.texts[0]
    if verdict.verdict and verdict.verdict != "SAFE":
        log.info(
            "run %s: the result of %s screened %s (%s, %s): %s",
            run.run_id,
            tool,
            verdict.verdict,
            response.tier,
            response.mode,
            verdict.reason or verdict.probe,
        )
    return Screened(text=_applied(verdict, content, sent, tool))


def _applied(verdict: ScreenedText, content: str, sent: str, tool: str) -> str:
    """The whole result with governance's verdict on its screened part applied."""
    if not verdict.keep:
        return verdict.text or DROPPED.format(tool=tool)
    if len(sent) == len(content):
        return verdict.text
    at = verdict.text.find(sent)
    if at >= 0:  # the head unchanged, or inside ANNOTATE's banners: the whole result, so wrapped
        return verdict.text[:at] + content + verdict.text[at + len(sent) :]
    rest = len(content) - len(sent)
    return (
        f"{verdict.text}\n[the screen rewrote the first {utf8_len(sent)} bytes of this result; the other"
        f" {rest} chars were not screened and are withheld]"
    )
