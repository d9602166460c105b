"""The document screen: retrieved documents (RAG) on their way into a run's context.

Each document is classified whole (no prefix scan: documents are chunks, and a bound that let an
injection hide after it would be a hole); a longer one is an ERROR. INJECTED documents are dropped,
flagged or sanitized per `Breach`; an ERROR drops the document unless `fail_open` (fail-closed by
default: an unscreened document is not trusted).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from atmosphere.governance.injection import Breach, Classification, Verdict
from atmosphere.governance.screens.layered import classify_safely
from atmosphere.governance.screens.rule_based import RuleBasedClassifier
from atmosphere.governance.screens.tiers import InjectionClassifier

MAX_DOCUMENT_CHARS = 256 * 1024
"""Longest document screened; a longer one is an ERROR (dropped unless fail-open)."""
SANITIZED_DOCUMENT_PLACEHOLDER = "[retrieved content was flagged as potential prompt injection and removed]"


@dataclass(frozen=True, slots=True)
class ScreenedDocument:
    """The decision about one document."""

    keep: bool
    text: str | None
    """What to put in the context (`None` when not kept)."""
    classification: Classification
    flagged: bool
    """Kept although INJECTED (`Breach.FLAG`, text unchanged) or replaced (`Breach.SANITIZE`): show it as unsafe."""

    @property
    def audited(self) -> bool:
        """Whether this decision belongs in the decision log (every non-safe one does)."""
        return self.classification.verdict is not Verdict.SAFE


_DEFAULT_CLASSIFIER = RuleBasedClassifier(max_chars=MAX_DOCUMENT_CHARS)


def decide(text: str, classification: Classification, breach: Breach, *, fail_open: bool) -> ScreenedDocument:
    """Apply the breach policy to one classified document."""
    if classification.verdict is Verdict.SAFE:
        return ScreenedDocument(True, text, classification, False)
    if classification.verdict is Verdict.ERROR:
        return ScreenedDocument(fail_open, text if fail_open else None, classification, False)
    if breach is Breach.FLAG:
        return ScreenedDocument(True, text, classification, True)
    if breach is Breach.SANITIZE:
        return ScreenedDocument(True, SANITIZED_DOCUMENT_PLACEHOLDER, classification, True)
    return ScreenedDocument(False, None, classification, False)


async def screen_documents(
    texts: Sequence[str],
    breach: Breach = Breach.DROP,
    classifier: InjectionClassifier | None = None,
    *,
    fail_open: bool = False,
) -> list[ScreenedDocument]:
    """Screen each document in order (one decision per input, never raises); RULE_BASED unless told."""
    chosen = classifier or _DEFAULT_CLASSIFIER
    decisions: list[ScreenedDocument] = []
    for text in texts:
        if len(text) > MAX_DOCUMENT_CHARS:
            reason = f"document of {len(text)} characters exceeds the {MAX_DOCUMENT_CHARS}-character screening limit"
            classification = Classification(Verdict.ERROR, 0.0, None, reason)
        else:
            classification = await classify_safely(chosen, text)
        decisions.append(decide(text, classification, breach, fail_open=fail_open))
    return decisions
