"""The documentation stays true: docs/*.md and the README front page, checked against the code.

The README's own tests moved here when the reference moved out of the README into `docs/`
(built by `make docs`). What is checked:

- every environment variable a service reads has exactly one row on docs/settings.md (and none
  elsewhere), every row and every mention names a variable that exists, and every numeric bound
  the code enforces is in the row's constraint column;
- the commands the pages show exist: `make` targets, bench scripts, `atmosphere` flags;
- the code blocks: Python compiles, JSON and YAML parse (policy files through governance's own
  loader), bash passes `bash -n`, and a block marked `<!-- check: run -->` runs in-process;
- every relative link resolves, anchors included; the SDK's exported names are all named;
- the site builds with `mkdocs build --strict`, and `make test` builds it.

The `<!-- own-project:* -->` blocks of docs/your-own-project.md are run end to end by
tests/e2e/test_own_project.py and are the starter of `atmosphere new` (libs/cli/tests/integration/test_new.py).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import importlib.util
import inspect
import json
import re
import shlex
import subprocess
import sys
import typing
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import BaseModel
from pydantic_settings import BaseSettings

from atmosphere.cli.__main__ import _parser
from atmosphere.config import env_names

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
README = ROOT / "README.md"
PAGES = sorted(DOCS.glob("*.md"))
SETTINGS_PAGE = DOCS / "settings.md"
SERVICES = ("governance", "memory", "tape", "sandbox", "dispatch", "ingress")

ROW = re.compile(r"^\| `((?:ATMOSPHERE|LLM)_[A-Z0-9_]+)` \|", re.M)
MENTION = re.compile(r"\b((?:ATMOSPHERE|LLM)_[A-Z0-9_]*[A-Z0-9_])(\*?)")
# Words that look like settings but are not read by any service's settings class.
NOT_SETTINGS = {
    "ATMOSPHERE_TEST_NATS_URL": "the pytest plugin's existing server (atmosphere.testing)",
    "ATMOSPHERE_IMAGE": "the image of every Atmosphere container in docker-compose.yml (an app's own)",
    "LLM_CLASSIFIER": "a value of ATMOSPHERE_AI_INJECTION_SCREEN_TIER",
    "LLM_ROUND": "a kind of durable runs' journal records (EFFECT_KIND_LLM_ROUND)",
    "ATMOSPHERE_ARTIFACTS": "where the console's browser tests save their screenshots (tests/e2e/test_console.py)",
}


def text_of(path: Path) -> str:
    return path.read_text(encoding="utf-8")


def everything() -> list[Path]:
    return [README, *PAGES]


# -- settings --------------------------------------------------------------------------------


def settings_classes() -> dict[str, type[BaseSettings]]:
    classes = {}
    for service in SERVICES:
        module = importlib.import_module(f"atmosphere.{service}.settings")
        classes[service] = getattr(module, f"{service.capitalize()}Settings")
    return classes


@dataclass(frozen=True)
class Setting:
    name: str
    bounds: tuple[str, ...]
    """The numeric bounds the field enforces, as the settings page writes them (`≥ 0`, `> 0`, ...)."""
    spellings: frozenset[str]
    """Every variable name that sets it (the camelCase keys of `code_exec` and `eval` too)."""


def _number(value: object) -> str:
    return str(int(value)) if isinstance(value, float) and value.is_integer() else str(value)


def _bounds(field: Any) -> tuple[str, ...]:
    signs = {"ge": "≥", "gt": ">", "le": "≤", "lt": "<"}
    return tuple(
        f"{sign} {_number(getattr(m, key))}"
        for m in field.metadata
        for key, sign in signs.items()
        if getattr(m, key, None) is not None
    )


def _walk(model: type[BaseModel], stem: str, depth: int, out: dict[str, Setting]) -> None:
    # The same walk as `atmosphere.config.env_names` (which the first test holds it to), keeping
    # each field's bounds and, for flat settings classes with aliases, every spelling read.
    config = getattr(model, "model_config", {})
    for name, field in model.model_fields.items():
        annotation = field.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseSettings):
            _walk(annotation, str(annotation.model_config.get("env_prefix", "")), depth + 1, out)
            continue
        env = f"{stem}{(field.alias or name).upper()}"
        if isinstance(annotation, type) and issubclass(annotation, BaseModel) and depth < 3:
            _walk(annotation, env + "__", depth + 1, out)
            continue
        spellings = {env}
        if config.get("env_prefix_target") == "all":
            aliases = (name, field.alias, field.validation_alias)
            spellings |= {f"{stem}{a.upper()}" for a in aliases if isinstance(a, str)}
        out[env] = Setting(env, _bounds(field), frozenset(spellings))


def known_settings() -> dict[str, Setting]:
    found: dict[str, Setting] = {}
    for cls in settings_classes().values():
        _walk(cls, str(cls.model_config.get("env_prefix", "")), 0, found)
    return found


def settings_rows() -> dict[str, str]:
    """Each documented variable's row on the settings page."""
    return {m[1]: line for line in text_of(SETTINGS_PAGE).splitlines() if (m := ROW.match(line))}


def test_the_walk_here_reads_what_env_names_reads() -> None:
    names = set().union(*(env_names(cls) for cls in settings_classes().values()))
    assert set(known_settings()) == names


def test_every_setting_is_documented_exactly_once() -> None:
    rows = Counter(ROW.findall(text_of(SETTINGS_PAGE)))
    for service, cls in settings_classes().items():
        names = set(env_names(cls))
        missing = sorted(names - set(rows))
        assert not missing, f"docs/settings.md has no row for these {service} settings: {missing}"
    twice = sorted(name for name, count in rows.items() if count > 1)
    assert not twice, f"documented more than once on docs/settings.md: {twice}"
    known = known_settings()
    for path in everything():
        if path != SETTINGS_PAGE:
            elsewhere = [name for name in ROW.findall(text_of(path)) if name in known]
            assert not elsewhere, f"{path.relative_to(ROOT)} documents settings outside docs/settings.md: {elsewhere}"


def test_every_documented_setting_exists() -> None:
    unknown = sorted(set(settings_rows()) - set(known_settings()))
    assert not unknown, f"docs/settings.md documents variables no service reads: {unknown}"


def test_every_setting_a_page_mentions_exists() -> None:
    known = known_settings()
    spellings = set().union(*(s.spellings for s in known.values()))
    for path in everything():
        for name, star in MENTION.findall(text_of(path)):
            if star or name.endswith("_"):  # a family: `ATMOSPHERE_TAPE__*`
                assert any(s.startswith(name) for s in spellings), f"{path.relative_to(ROOT)}: {name}* matches nothing"
            else:
                assert name in spellings or name in NOT_SETTINGS, f"{path.relative_to(ROOT)} mentions {name}"


def test_what_is_not_a_setting_is_what_the_docs_say() -> None:
    plugin = text_of(ROOT / "libs/testing/src/atmosphere/testing/pytest_plugin.py")
    assert '"ATMOSPHERE_TEST_NATS_URL"' in plugin
    tier = settings_classes()["governance"].model_fields["ai_injection_screen_tier"].annotation
    assert "LLM_CLASSIFIER" in typing.get_args(tier)
    assert "EFFECT_KIND_LLM_ROUND" in text_of(ROOT / "proto/atmosphere/contracts/journal/v1/journal.proto")
    assert "image: ${ATMOSPHERE_IMAGE:-" in text_of(ROOT / "docker-compose.yml")
    assert 'os.environ.get("ATMOSPHERE_ARTIFACTS"' in text_of(ROOT / "tests/e2e/test_console.py")


def test_the_settings_page_states_every_bound_the_code_enforces() -> None:
    rows = settings_rows()
    for setting in known_settings().values():
        constraint = rows[setting.name].split(" | ")[3]
        for bound in setting.bounds:
            assert bound in constraint, f"{setting.name}: the constraint column lacks `{bound}` ({constraint!r})"


def test_every_row_has_a_default_a_constraint_and_a_meaning() -> None:
    for name, row in settings_rows().items():
        cells = [c.strip() for c in row.strip("|").split(" | ")]
        assert len(cells) == 5, f"{name}: a row is | variable | services | default | constraint | meaning |"
        assert all(cells), f"{name}: an empty cell (write — when there is nothing to say)"


# -- commands --------------------------------------------------------------------------------


def code_texts(path: Path) -> Iterator[str]:
    """The fenced blocks and inline code spans of a page: where commands are shown."""
    text = text_of(path)
    yield from (b.body for b in blocks(path))
    yield from re.findall(r"`([^`\n]+)`", re.sub(r"```.*?```", "", text, flags=re.S))


def test_the_make_targets_shown_exist() -> None:
    makefile = text_of(ROOT / "Makefile")
    shown = {"run", "test", "docs", "bench", "proto", "clean"}
    for path in everything():
        for code in code_texts(path):
            shown |= set(re.findall(r"(?:^|[\s;&|(])make (?:-s )?([.a-z][\w./-]*)", code, re.M))
    for target in sorted(shown):
        rule = target.replace(".atmosphere/tools", "$(TOOLS)")
        assert re.search(rf"^{re.escape(rule)}:", makefile, re.M), f"the docs show `make {target}`"


def test_the_benches_shown_exist_and_make_bench_runs_them() -> None:
    makefile = text_of(ROOT / "Makefile")
    for path in everything():
        for bench in re.findall(r"`(bench/\w+\.py)`", text_of(path)):
            assert (ROOT / bench).is_file(), bench
            assert bench in makefile, f"`make bench` does not run {bench}"


def _commands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    actions = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(actions[0].choices) if actions else {}


def _options(command: list[str]) -> set[str]:
    parser = _parser()
    for word in command:
        parser = _commands(parser)[word]
    return {o for action in parser._actions for o in action.option_strings}


def shown_atmosphere_flags() -> Iterator[tuple[list[str], str]]:
    """(command, flag) for every `atmosphere <command> --flag` the pages show, `make run RUN_ARGS` too."""
    for path in everything():
        for code in code_texts(path):
            for raw in code.splitlines():
                line = re.split(r"\s(?:#|\|\||&&|;|\|)\s", raw)[0]
                for found in re.finditer(r"\batmosphere (dev|new|bus-credentials|tape (?:follow|export))\b(.*)", line):
                    for flag in re.findall(r"(?<![\w-])--[a-z][a-z-]*", found[2]):
                        yield found[1].split(), flag
                for args in re.findall(r'RUN_ARGS="([^"]*)"', line):
                    for flag in re.findall(r"(?<![\w-])--[a-z][a-z-]*", args):
                        yield ["dev"], flag


def test_the_atmosphere_flags_shown_exist() -> None:
    shown = list(shown_atmosphere_flags())
    assert (["dev"], "--no-model") in shown  # the pattern finds what it is meant to
    for command, flag in shown:
        assert flag in _options(command), f"`atmosphere {' '.join(command)}` has no {flag}"


def test_make_test_builds_the_docs_strictly_and_ci_runs_make_test() -> None:
    makefile = text_of(ROOT / "Makefile")
    # `make test` runs its lanes at once (scripts/test_lanes.py): the gates' lane builds the docs.
    test_rule = re.search(r"^test:[^\n]*\n((?:\t[^\n]*\n)+)", makefile, re.M)
    assert test_rule is not None
    lanes = dict(re.findall(r"(\w+) '(?:nice -n \d+ )?\$\(MAKE\) --no-print-directory ([^']+)'", test_rule[1]))
    assert "docs" in lanes["gates"].split()
    assert {"pytest", "test-lowest"} <= {target for lane in lanes.values() for target in lane.split()}
    assert re.search(r"^docs:.*\n\t.*mkdocs build --strict", makefile, re.M)
    assert "make test" in text_of(ROOT / ".ci/run")
    assert "site/" in text_of(ROOT / ".gitignore").splitlines()


def test_the_site_builds_strictly(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    built = {p.parent.name for p in (tmp_path / "site").glob("*/index.html")}
    assert built == {p.stem for p in PAGES if p.stem != "index"}  # every page is in the nav


# -- code blocks -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Block:
    path: Path
    line: int
    lang: str
    body: str
    markers: frozenset[str]

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def blocks(path: Path) -> list[Block]:
    """The fenced blocks of a page, each with the `<!-- ... -->` comments on the lines just above it."""
    lines = text_of(path).split("\n")
    found, i = [], 0
    while i < len(lines):
        opening = re.fullmatch(r"```(\w*)", lines[i])
        if not opening:
            i += 1
            continue
        end = lines.index("```", i + 1)
        markers, j = set(), i - 1
        while j >= 0 and (comment := re.fullmatch(r"<!-- (.+?) -->", lines[j])):
            markers.add(comment[1])
            j -= 1
        found.append(Block(path, i + 1, opening[1], "\n".join(lines[i + 1 : end]) + "\n", frozenset(markers)))
        i = end + 1
    return found


def all_blocks(lang: str) -> list[Block]:
    return [b for path in everything() for b in blocks(path) if b.lang == lang]


def test_every_block_says_its_language() -> None:
    unnamed = [b.where for path in everything() for b in blocks(path) if not b.lang]
    assert not unnamed, f"fenced blocks without a language (```text for output): {unnamed}"


@pytest.mark.parametrize("block", all_blocks("python"), ids=lambda b: b.where)
def test_python_blocks_compile(block: Block) -> None:
    compile(block.body, block.where, "exec")


@pytest.mark.parametrize("block", all_blocks("json"), ids=lambda b: b.where)
def test_json_blocks_parse(block: Block) -> None:
    json.loads(block.body)


@pytest.mark.parametrize("block", all_blocks("yaml"), ids=lambda b: b.where)
def test_yaml_blocks_parse(block: Block) -> None:
    assert yaml.safe_load(block.body) is not None
    if "check: policies" in block.markers:
        from atmosphere.governance.policies.loader import parse_policies

        assert parse_policies(block.body, source=block.where)


@pytest.mark.parametrize("block", all_blocks("bash"), ids=lambda b: b.where)
def test_bash_blocks_are_bash(block: Block) -> None:
    done = subprocess.run(["bash", "-n"], input=block.body, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr


def runnable_pages() -> list[Path]:
    return [path for path in everything() if any("check: run" in b.markers for b in blocks(path))]


def _exec(block: Block, project: Path, index: int) -> None:
    """Write the block where its first line (`# path.py`) says, or to a file of its own, and run it."""
    first = re.match(r"# ([\w./-]+\.py)\b", block.body)
    target = project / (first[1] if first else f"block_{index}.py")
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(block.body)
    spec = importlib.util.spec_from_file_location(f"docs_block_{index}", target)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    for name, function in vars(module).items():
        if name.startswith("test_") and inspect.isfunction(function):
            result = function()
            if inspect.iscoroutine(result):
                asyncio.run(result)


@pytest.mark.parametrize("page", runnable_pages(), ids=lambda p: p.name)
def test_blocks_marked_to_run_run(page: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # In order, in one project directory: a later block may import what an earlier one wrote.
    monkeypatch.syspath_prepend(str(tmp_path))
    before = set(sys.modules)
    try:
        for index, block in enumerate(b for b in blocks(page) if "check: run" in b.markers):
            _exec(block, tmp_path, index)
    finally:
        for name in set(sys.modules) - before:
            if str(getattr(sys.modules[name], "__file__", "") or "").startswith(str(tmp_path)):
                del sys.modules[name]


def test_the_own_project_blocks_are_where_the_tests_read_them() -> None:
    text = text_of(DOCS / "your-own-project.md")
    for name in ("install", "agent", "test", "run-test", "serve"):
        assert f"<!-- own-project:{name} -->" in text
        assert f"<!-- /own-project:{name} -->" in text
    # A fresh machine has Python and make, not uv: the install block must not need uv on PATH.
    install = re.search(r"<!-- own-project:install -->\s*```bash\n(.*?)```", text, re.S)
    assert install is not None
    for line in install[1].splitlines():
        words = shlex.split(line, comments=True)
        assert "uv" not in words, f"the install block calls a bare `uv`: {line}"


# -- links -----------------------------------------------------------------------------------


def github_anchors(path: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", text_of(path), flags=re.S)
    anchors = set()
    for heading in re.findall(r"^#{1,6} (.+)$", text, re.M):
        plain = re.sub(r"[`*]", "", heading).strip().lower()
        anchors.add(re.sub(r"[^\w\- ]", "", plain).replace(" ", "-"))
    return anchors


def relative_links(path: Path) -> Iterator[str]:
    text = re.sub(r"```.*?```", "", text_of(path), flags=re.S)
    text = re.sub(r"`[^`\n]*`", "", text)
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if not re.match(r"[a-z]+:", target):
            yield target


@pytest.mark.parametrize("path", everything(), ids=lambda p: p.name)
def test_every_relative_link_resolves(path: Path) -> None:
    for link in relative_links(path):
        file, _, anchor = link.partition("#")
        target = (path.parent / file).resolve() if file else path
        assert target.is_file(), f"{path.relative_to(ROOT)}: {link} is no file"
        if anchor and target.suffix == ".md":
            assert anchor in github_anchors(target), f"{path.relative_to(ROOT)}: {link} names no heading"


def test_the_front_page_leads_into_every_page() -> None:
    linked = {(README.parent / link.partition("#")[0]).resolve() for link in relative_links(README)}
    index_links = {(DOCS / link.partition("#")[0]).resolve() for link in relative_links(DOCS / "index.md")}
    assert DOCS / "index.md" in linked
    assert {p.resolve() for p in PAGES} - {(DOCS / "index.md").resolve()} <= index_links


# -- the SDK's surface -----------------------------------------------------------------------


def test_what_you_import_names_the_whole_pinned_surface() -> None:
    text = text_of(DOCS / "write-an-agent.md")
    section = text[text.index("## What you import") :]
    section = section[: section.index("\n## ", 1)]
    for module in ("atmosphere.sdk", "atmosphere.sdk.host"):
        for name in importlib.import_module(module).__all__:
            assert re.search(rf"`{name}(\(\))?`", section), f"write-an-agent.md does not name {module}.{name}"


def test_every_error_code_a_run_can_end_with_is_documented() -> None:
    import atmosphere.bus.errors as errors  # the catalogue, filled by the imports below

    for service in SERVICES:
        if importlib.util.find_spec(f"atmosphere.{service}.errors") is not None:
            importlib.import_module(f"atmosphere.{service}.errors")
    wire = (DOCS / "wire.md").read_text()
    codes = [code for code, kind in errors.catalogue().items() if issubclass(kind, errors.RunError)]
    missing = [code for code in codes if f"| `{code}` |" not in wire]
    assert not missing, f"error codes not in docs/wire.md's table: {missing}"


def test_the_capability_matrix_is_what_the_runtimes_declare() -> None:
    # The runtimes' `capabilities()`, each pinned by its contract test: the pages follow the code.
    from scripts.capability_matrix import PAGES, START, matrix, runtimes, with_matrix

    table = matrix(runtimes())
    for page in PAGES:
        text = page.read_text()
        assert START in text, page
        assert with_matrix(text, table) == text, f"{page.name}: run scripts/capability_matrix.py --write"
    assert next(r.name for r in runtimes()) == "built-in"
