"""False positives of the rule-based screens on the shipped benign corpus: at most 1 %."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType

import pytest

from atmosphere.governance.injection import Breach, Verdict
from atmosphere.governance.screens import ToolOutputAction, ToolOutputMode, screen_documents, screen_tool_output

BENIGN = Path(__file__).parents[2] / "data" / "benign"
MAX_FALSE_POSITIVE_RATE = 0.01


def load_corpus() -> list[dict[str, str]]:
    with (BENIGN / "corpus.jsonl").open(encoding="utf-8") as fh:
        return [json.loads(line) for line in fh]


def load_builder() -> ModuleType:
    spec = importlib.util.spec_from_file_location("build_corpus", BENIGN / "build_corpus.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


CORPUS = load_corpus()


def report(false_positives: list[tuple[str, str]]) -> str:
    lines = [f"{len(false_positives)} of {len(CORPUS)} benign documents flagged:"]
    lines += [f"  {doc_id}: {reason}" for doc_id, reason in false_positives]
    return "\n".join(lines)


def test_corpus_is_large_varied_and_well_formed() -> None:
    assert len(CORPUS) >= 500
    assert len({doc["id"] for doc in CORPUS}) == len(CORPUS)
    assert len({doc["text"] for doc in CORPUS}) == len(CORPUS)
    assert all(set(doc) == {"id", "source", "text"} and doc["text"].strip() for doc in CORPUS)
    assert len({doc["source"] for doc in CORPUS}) >= 15


def test_shipped_corpus_is_what_the_seeded_builder_makes() -> None:
    assert load_builder().build() == CORPUS


async def test_tool_output_screen_false_positives_at_most_one_percent() -> None:
    false_positives = []
    for doc in CORPUS:
        screened = await screen_tool_output(doc["text"], ToolOutputMode.ANNOTATE)
        if screened.action is not ToolOutputAction.PASSED:
            assert screened.classification is not None
            false_positives.append((doc["id"], screened.classification.reason))
    print(report(false_positives))  # visible with -s, and in the failure message below
    assert len(false_positives) <= MAX_FALSE_POSITIVE_RATE * len(CORPUS), report(false_positives)


async def test_document_screen_false_positives_at_most_one_percent() -> None:
    screened = await screen_documents([doc["text"] for doc in CORPUS], Breach.DROP)
    false_positives = [
        (doc["id"], decision.classification.reason)
        for doc, decision in zip(CORPUS, screened, strict=True)
        if not decision.keep
    ]
    assert all(d.classification.verdict is not Verdict.ERROR for d in screened)
    assert len(false_positives) <= MAX_FALSE_POSITIVE_RATE * len(CORPUS), report(false_positives)


@pytest.mark.parametrize("source", ["tool/code", "person/email", "tool/shell"])
def test_the_corpus_exercises_the_probe_words_in_ordinary_senses(source: str) -> None:
    # A corpus without "ignore", "user:" or "you are now" would prove nothing about false positives.
    texts = "\n".join(doc["text"] for doc in CORPUS if doc["source"] == source).lower()
    assert "ignore" in texts
    if source == "tool/code":
        assert "    user: postgres" in texts
        assert "user, err :=" in texts
    if source == "person/email":
        assert "you are now" in texts
