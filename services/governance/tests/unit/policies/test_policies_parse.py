"""Strict parsing: schema detection, identities, errors naming the line, hostile documents refused."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from atmosphere.governance.policies import (
    NATIVE_TYPES,
    DenyListPolicy,
    MsAgentOsPolicy,
    PolicyFileError,
    load_policy_files,
    parse_policies,
)

NATIVE = """\
version: "2.1"
policies:
  - name: no-sql
    type: deny-list
    config:
      phrases: [drop table]
  - name: pinned
    type: message-length
    version: "7"
    config:
      max-chars: 10
"""


def test_fourteen_built_in_types() -> None:
    assert len(NATIVE_TYPES) == 14
    assert "moderation" in NATIVE_TYPES


def test_native_entries_carry_their_identity() -> None:
    first, second = parse_policies(NATIVE, source="yaml:/etc/p.yaml")
    assert isinstance(first, DenyListPolicy)
    assert (first.identity.name, first.identity.source, first.identity.version) == ("no-sql", "yaml:/etc/p.yaml", "2.1")
    assert second.identity.version == "7"
    assert first.identity.digest.startswith("sha256:")
    assert len(first.identity.digest) == len("sha256:") + 64
    assert first.identity.digest != second.identity.digest
    # The digest covers the entry's definition: change a phrase, the digest changes.
    again = parse_policies(NATIVE.replace("drop table", "truncate"), source="yaml:/etc/p.yaml")[0]
    assert again.identity.digest != first.identity.digest
    assert parse_policies(NATIVE, source="yaml:/etc/p.yaml")[0].identity == first.identity


def test_default_version_is_embedded() -> None:
    (policy,) = parse_policies("policies:\n  - name: k\n    type: kill-switch\n", source="yaml:x")
    assert policy.identity.version == "embedded"


def test_ms_document_is_one_policy() -> None:
    (policy,) = parse_policies(
        "name: prod\nrules:\n  - name: r\n    condition: {field: model, operator: eq, value: x}\n    action: deny\n",
        source="yaml:ms",
    )
    assert isinstance(policy, MsAgentOsPolicy)
    assert (policy.identity.name, policy.identity.version) == ("prod", "1.0")
    (unnamed,) = parse_policies("rules: []\n", source="yaml:ms")
    assert unnamed.identity.name == "unnamed"


@pytest.mark.parametrize("text", ["", "# only a comment\n", "description: nothing here\n"])
def test_documents_without_policies_are_empty(text: str) -> None:
    assert parse_policies(text, source="yaml:x") == []


ERRORS = [
    ("policies: []\nrules: []\n", 1, "both 'rules' and 'policies'"),
    ("policies:\n  - name: a\n    type: no-such-type\n", 3, "unknown policy type 'no-such-type'"),
    ("policies:\n  - type: deny-list\n", 2, "requires a non-blank 'name'"),
    ("policies:\n  - name: a\n", 2, "requires a non-blank 'type'"),
    ("policies:\n  - name: a\n    type: deny-list\n    confg: {}\n", 4, "unknown key 'confg'"),
    ("policies:\n  - name: a\n    type: message-length\n    config:\n      max_chars: 3\n", 5, "unknown config key"),
    ("policies:\n  - name: a\n    type: message-length\n    config:\n      max-chars: ten\n", 5, "must be an integer"),
    ("policies:\n  - name: a\n    type: message-length\n    config:\n      max-chars: -1\n", 2, "positive 'max-chars'"),
    ("policies:\n  - name: a\n    type: pii-redaction\n    config: {mode: shout}\n", 4, "unknown pii-redaction mode"),
    ("policies:\n  - name: a\n    type: cost-ceiling\n    config:\n      budget-usd: .nan\n", 5, "must be a number"),
    ("policies: {a: 1}\n", 1, "'policies' must be a sequence"),
    ("policies:\n  - just a string\n", 2, "policies[0] must be a mapping"),
    ("- a\n- b\n", 1, "the document root must be a mapping"),
    ("a: 1\na: 2\n", 2, "duplicate key 'a'"),
    ("a: [unclosed\n", 2, "invalid YAML"),
    ("a: 1\n---\nb: 2\n", 2, "invalid YAML"),
    ("policies:\n  - name: a\n    type: deny-list\n    config:\n      phrases: !!python/object:os.system x\n", 5, ""),
    ("rules:\n  - name: r\n    condition: {field: f, operator: like, value: x}\n", 3, "unknown operator 'like'"),
    (
        "rules:\n  - name: r\n    condition: {field: f, operator: eq}\n    action: reject\n",
        4,
        "unknown action 'reject'",
    ),
    ("rules:\n  - name: r\n    condition: {field: f, operator: matches, value: '(x'}\n", 3, "invalid regex"),
    ("rules:\n  - name: r\n    condition: {operator: eq}\n", 3, "non-blank 'field'"),
    ("rules:\n  - name: r\n    action: deny\n", 2, "requires a mapping 'condition'"),
    ("rules:\n  - condition: {field: f, operator: eq}\n", 2, "non-blank 'name'"),
    ("rules:\n  - name: r\n    condition: {field: f, operator: eq}\n    priority: high\n", 4, "'priority' must be"),
    ("rules: []\ndefaults: {action: maybe}\n", 2, "unknown action 'maybe'"),
    ("agent_control_specification_version: '1'\n", 1, "not supported"),
]


@pytest.mark.parametrize(("text", "line", "problem"), ERRORS)
def test_errors_name_the_source_and_the_line(text: str, line: int, problem: str) -> None:
    with pytest.raises(PolicyFileError) as caught:
        parse_policies(text, source="yaml:/srv/policies.yaml")
    message = str(caught.value)
    assert message.startswith(f"yaml:/srv/policies.yaml:{line}: "), message
    assert problem in message


def test_unknown_operator_and_action_list_the_supported_ones() -> None:
    with pytest.raises(PolicyFileError, match=r"supported: eq, ne, gt, lt, gte, lte, in, contains, matches"):
        parse_policies("rules:\n  - name: r\n    condition: {field: f, operator: like}\n", source="yaml:x")
    with pytest.raises(PolicyFileError, match=r"supported: allow, deny, block, audit"):
        parse_policies(
            "rules:\n  - name: r\n    condition: {field: f, operator: eq}\n    action: no\n", source="yaml:x"
        )


# -- hostile documents -----------------------------------------------------------------------


def test_a_huge_document_is_refused_before_parsing() -> None:
    text = "description: " + "x" * (1024 * 1024) + "\n"
    with pytest.raises(PolicyFileError, match="larger than 1048576 bytes"):
        parse_policies(text, source="yaml:huge")


@pytest.mark.parametrize("character", ["\x9c", "\x00", "\x1b"], ids=["c1-control", "nul", "escape"])
def test_a_control_character_is_a_refused_document_not_a_crash(character: str) -> None:
    with pytest.raises(PolicyFileError, match="invalid YAML"):
        parse_policies(f"version: 1{character}\n", source="yaml:control")


def test_deep_nesting_is_refused() -> None:
    with pytest.raises(PolicyFileError, match="nested deeper than 64"):
        parse_policies("a: " + "[" * 5000 + "]" * 5000 + "\n", source="yaml:deep")


def test_an_alias_bomb_is_refused_not_expanded() -> None:
    lines = ['l0: &l0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for level in range(1, 9):
        refs = ",".join([f"*l{level - 1}"] * 9)
        lines.append(f"l{level}: &l{level} [{refs}]")
    lines.append("policies:\n  - name: bomb\n    type: deny-list\n    config:\n      phrases: *l8")
    started = time.perf_counter()
    with pytest.raises(PolicyFileError, match="more than 100000 values"):
        parse_policies("\n".join(lines) + "\n", source="yaml:bomb")
    assert time.perf_counter() - started < 30  # refused, not expanded (9**9 values)


def test_a_recursive_alias_is_refused() -> None:
    text = "policies:\n  - name: r\n    type: deny-list\n    config:\n      phrases: &a [x, *a]\n"
    with pytest.raises(PolicyFileError, match="recursive alias"):
        parse_policies(text, source="yaml:loop")


def test_a_small_anchor_is_fine() -> None:
    text = (
        "words: &words [drop table, rm -rf]\n"
        "policies:\n  - name: a\n    type: deny-list\n    config: {phrases: *words}\n"
    )
    (policy,) = parse_policies(text, source="yaml:x")
    assert isinstance(policy, DenyListPolicy)


# -- files -----------------------------------------------------------------------------------


def test_load_policy_files_in_order(tmp_path: Path) -> None:
    first = tmp_path / "a.yaml"
    second = tmp_path / "b.yaml"
    first.write_text(NATIVE, encoding="utf-8")
    second.write_text("rules: []\nname: ms\n", encoding="utf-8")
    policies = load_policy_files([first, second])
    assert [p.identity.name for p in policies] == ["no-sql", "pinned", "ms"]
    assert policies[0].identity.source == f"yaml:{first}"
    assert policies[2].identity.source == f"yaml:{second}"


def test_a_missing_file_is_an_error(tmp_path: Path) -> None:
    missing = tmp_path / "nope.yaml"
    with pytest.raises(PolicyFileError, match=f"yaml:{missing}: policy file not found"):
        load_policy_files([missing])


def test_a_file_that_is_not_utf8_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "bin.yaml"
    path.write_bytes(b"\xff\xfe\x00policies")
    with pytest.raises(PolicyFileError, match="cannot read policy file"):
        load_policy_files([path])
