"""The injection screens governance serves on `atmo.gov.screen`: tool results and retrieved documents.

The configuration is read once at start; the classification is the screens library's
(`atmosphere.governance.screens`). Tool results get the tool-output screen (ANNOTATE by default,
SANITIZE, OFF; the seed's banners); retrieved documents the document screen (DROP, FLAG, SANITIZE;
fail-closed unless fail-open is set). A tier that cannot run (its package is missing, no endpoint)
stops governance at start with the reason: it never quietly falls back to a weaker one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from atmosphere.contracts.governance.v1.governance_pb2 import ScreenedText, ScreenResponse
from atmosphere.governance.injection import FLAG_PREFIX, Breach
from atmosphere.governance.screens import (
    InjectionClassifier,
    ToolOutputAction,
    ToolOutputMode,
    screen_documents,
    screen_tool_output,
)

MAX_TEXTS = 100
"""Texts screened in one request."""


@dataclass(frozen=True)
class Screening:
    """The configured screens and the classifier tier they use."""

    tool_output_mode: ToolOutputMode = ToolOutputMode.ANNOTATE
    document_breach: Breach = Breach.DROP
    document_fail_open: bool = False
    tier: str = "RULE_BASED"
    classifier: InjectionClassifier | None = None
    """None: RULE_BASED, bounded as each screen bounds it (tool output: its first 256 KiB)."""

    def runtime_info(self) -> dict[str, Any]:
        """The screens really attached, for the runtime truth.

        The tool-output screen is: dispatch asks it for every tool result. `ragSafety` is not
        reported: nothing retrieves documents yet, so no document passes the screen (it is served,
        for the retrieval that will call it).
        """
        mode = self.tool_output_mode
        return {"toolOutputScreen": {"active": mode is not ToolOutputMode.OFF, "mode": mode.value, "tier": self.tier}}

    async def screen(self, kind: str, texts: list[str]) -> ScreenResponse:
        """Screen `texts` of `kind` ("tool_output" or "document").

        Raises:
            ValueError: an unknown kind, or too many texts.
        """
        if len(texts) > MAX_TEXTS:
            raise ValueError(f"{len(texts)} texts in one request; at most {MAX_TEXTS} are screened at once")
        if kind == "tool_output":
            answers = [await self._tool_output(text) for text in texts]
            return ScreenResponse(texts=answers, tier=self.tier, mode=self.tool_output_mode.value)
        if kind == "document":
            screened = await screen_documents(
                texts, self.document_breach, self.classifier, fail_open=self.document_fail_open
            )
            answers = []
            for decision in screened:
                verdict = decision.classification
                text = decision.text or ""
                if decision.flagged and self.document_breach is Breach.FLAG:
                    text = FLAG_PREFIX + text  # kept, but whoever reads the context sees the warning
                answers.append(
                    ScreenedText(
                        keep=decision.keep,
                        text=text,
                        verdict=verdict.verdict.value,
                        probe=verdict.probe or "",
                        reason=verdict.reason,
                    )
                )
            return ScreenResponse(texts=answers, tier=self.tier, mode=self.document_breach.value)
        raise ValueError(f"unknown screen kind {kind!r} (known: tool_output, document)")

    async def _tool_output(self, text: str) -> ScreenedText:
        screened = await screen_tool_output(text, self.tool_output_mode, self.classifier)
        verdict = screened.classification
        if verdict is None:
            return ScreenedText(keep=True, text=text, verdict="SAFE", reason="not screened")
        return ScreenedText(
            keep=screened.action is not ToolOutputAction.WITHHELD or bool(screened.text),
            text=screened.text,
            verdict=verdict.verdict.value,
            probe=verdict.probe or "",
            reason=verdict.reason,
        )
