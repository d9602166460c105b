"""Prompt-injection screens over text from outside the conversation: tool results and retrieved documents.

Tiers (`Tier`): RULE_BASED (the probes that also screen memory facts), EMBEDDING_SIMILARITY (an
offline MiniLM model, optional extra `embedding`) and LLM_CLASSIFIER (an OpenAI-compatible endpoint;
`atmosphere.governance.screens.llm`), chosen with `build_classifier`; higher tiers run on top of the
RULE_BASED floor. `screen_tool_output` applies the ANNOTATE / SANITIZE / OFF modes at the tool choke
point; `screen_documents` applies DROP / FLAG / SANITIZE to retrieved documents, fail-closed.
"""

from atmosphere.governance.injection import Breach, Classification, Verdict
from atmosphere.governance.screens.documents import (
    MAX_DOCUMENT_CHARS,
    SANITIZED_DOCUMENT_PLACEHOLDER,
    ScreenedDocument,
    screen_documents,
)
from atmosphere.governance.screens.embedding import (
    DEFAULT_EXEMPLARS,
    EmbeddingSimilarityClassifier,
    Encoder,
    Exemplar,
)
from atmosphere.governance.screens.layered import LayeredClassifier
from atmosphere.governance.screens.rule_based import RuleBasedClassifier
from atmosphere.governance.screens.select import LlmEndpoint, build_classifier
from atmosphere.governance.screens.tiers import EmbeddingUnavailable, InjectionClassifier, Tier, TierUnavailable
from atmosphere.governance.screens.tool_output import (
    ANNOTATION_FOOTER,
    ANNOTATION_HEADER,
    MAX_SCANNED_CHARS,
    WITHHELD_PLACEHOLDER,
    ScreenedToolOutput,
    ToolOutputAction,
    ToolOutputMode,
    screen_tool_output,
)

__all__ = [
    "ANNOTATION_FOOTER",
    "ANNOTATION_HEADER",
    "DEFAULT_EXEMPLARS",
    "MAX_DOCUMENT_CHARS",
    "MAX_SCANNED_CHARS",
    "SANITIZED_DOCUMENT_PLACEHOLDER",
    "WITHHELD_PLACEHOLDER",
    "Breach",
    "Classification",
    "EmbeddingSimilarityClassifier",
    "EmbeddingUnavailable",
    "Encoder",
    "Exemplar",
    "InjectionClassifier",
    "LayeredClassifier",
    "LlmEndpoint",
    "RuleBasedClassifier",
    "ScreenedDocument",
    "ScreenedToolOutput",
    "Tier",
    "TierUnavailable",
    "ToolOutputAction",
    "ToolOutputMode",
    "Verdict",
    "build_classifier",
    "screen_documents",
    "screen_tool_output",
]
