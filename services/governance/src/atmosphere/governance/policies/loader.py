"""Policy files: one YAML document each, in the native schema (`policies:`) or Microsoft's (`rules:`).

Parsing is strict and fails at startup rather than installing less than the file says: an unknown
type, operator, action or config key, a bad value or an invalid regex is a `PolicyFileError`
naming the source and the line. A document with both `policies:` and `rules:` is an error; one
with neither holds no policies.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

import yaml

from atmosphere.governance.policies.dryrun import DryRunPolicy
from atmosphere.governance.policies.matching import compile_regex
from atmosphere.governance.policies.model import Policy, PolicyFileError, PolicyIdentity
from atmosphere.governance.policies.ms import Action, MsAgentOsPolicy, Operator, Rule
from atmosphere.governance.policies.native import NATIVE_TYPES
from atmosphere.governance.policies.yamldoc import MAX_DOCUMENT_BYTES, Config, Document

ACS_ROOT_KEY: Final = "agent_control_specification_version"
_ENTRY_KEYS: Final = frozenset({"name", "type", "version", "config", "dry-run"})
_OPERATORS: Final = ", ".join(Operator)
_ACTIONS: Final = ", ".join(Action)


def parse_policies(text: str, *, source: str) -> list[Policy]:
    """The policies one YAML document defines; `source` (e.g. `yaml:/etc/p.yaml`) names them."""
    doc = Document(text, source)
    if doc.root is None:
        return []
    root = doc.mapping(doc.root, "the document root")
    if ACS_ROOT_KEY in root:
        raise doc.error(root[ACS_ROOT_KEY][0], "Agent Control Specification manifests are not supported")
    if "rules" in root and "policies" in root:
        raise doc.error(doc.root, "document has both 'rules' and 'policies' keys; pick one schema")
    if "rules" in root:
        return [_ms_document(doc, root)]
    if "policies" not in root:
        return []
    default_version = _root_text(doc, root, "version", "embedded")
    entries = doc.sequence(root["policies"][1], "'policies'")
    return [_native_entry(doc, index, node, default_version) for index, node in enumerate(entries)]


def load_policy_files(paths: Sequence[Path]) -> list[Policy]:
    """The policies of every file, in order; each named `yaml:<path>`. A missing file is an error."""
    policies: list[Policy] = []
    for path in paths:
        source = f"yaml:{path}"
        try:
            if path.stat().st_size > MAX_DOCUMENT_BYTES:
                raise PolicyFileError(f"{source}: policy document larger than {MAX_DOCUMENT_BYTES} bytes")
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise PolicyFileError(f"{source}: policy file not found") from None
        except (OSError, UnicodeDecodeError) as exc:
            raise PolicyFileError(f"{source}: cannot read policy file: {exc}") from None
        policies.extend(parse_policies(text, source=source))
    return policies


def _root_text(doc: Document, root: dict[str, tuple[yaml.Node, yaml.Node]], key: str, default: str) -> str:
    if key not in root:
        return default
    return doc.scalar_text(root[key][1], f"'{key}'").strip() or default


def _required_text(
    doc: Document, fields: dict[str, tuple[yaml.Node, yaml.Node]], key: str, owner: yaml.Node, what: str
) -> str:
    text = doc.scalar_text(fields[key][1], f"'{key}'").strip() if key in fields else ""
    if not text:
        raise doc.error(owner, f"{what} requires a non-blank '{key}'")
    return text


def _native_entry(doc: Document, index: int, node: yaml.Node, default_version: str) -> Policy:
    what = f"policies[{index}]"
    fields = doc.mapping(node, what)
    for key, (key_node, _) in fields.items():
        if key not in _ENTRY_KEYS:
            raise doc.error(
                key_node, f"unknown key '{key}' in {what} (supported: config, dry-run, name, type, version)"
            )
    name = _required_text(doc, fields, "name", node, what)
    kind = _required_text(doc, fields, "type", node, what).lower()
    native = NATIVE_TYPES.get(kind)
    if native is None:
        known = ", ".join(sorted(NATIVE_TYPES))
        raise doc.error(fields["type"][1], f"unknown policy type '{kind}' in {what} ('{name}') (known: {known})")
    version = _root_text(doc, fields, "version", default_version)
    identity = PolicyIdentity.of(name, doc.source, version, doc.definition(node))
    config = Config(doc, node, fields["config"][1] if "config" in fields else None, native.keys)
    dry_run = doc.plain(fields["dry-run"][1]) if "dry-run" in fields else False
    if not isinstance(dry_run, bool):
        raise doc.error(fields["dry-run"][1], f"{what} ('{name}'): 'dry-run' must be true or false, got {dry_run!r}")
    try:
        policy = native.build(identity, config)
    except ValueError as exc:
        if isinstance(exc, PolicyFileError):
            raise
        raise doc.error(node, f"{what} ('{name}'): {exc}") from None
    return DryRunPolicy(policy) if dry_run else policy


def _ms_document(doc: Document, root: dict[str, tuple[yaml.Node, yaml.Node]]) -> Policy:
    rules = [_ms_rule(doc, index, node) for index, node in enumerate(doc.sequence(root["rules"][1], "'rules'"))]
    default_action = Action.ALLOW
    if "defaults" in root and not _is_empty(root["defaults"][1]):
        defaults = doc.mapping(root["defaults"][1], "'defaults'")
        if "action" in defaults:
            default_action = _ms_action(doc, defaults["action"][1], "defaults")
    identity = PolicyIdentity.of(
        _root_text(doc, root, "name", "unnamed"), doc.source, _root_text(doc, root, "version", "1.0"), doc.text
    )
    return MsAgentOsPolicy(identity, rules, default_action)


def _ms_rule(doc: Document, index: int, node: yaml.Node) -> Rule:
    what = f"rules[{index}]"
    fields = doc.mapping(node, what)
    name = _required_text(doc, fields, "name", node, what)
    what = f"{what} ('{name}')"
    if "condition" not in fields:
        raise doc.error(node, f"{what} requires a mapping 'condition'")
    condition_node = fields["condition"][1]
    condition = doc.mapping(condition_node, f"the condition of {what}")
    field = _required_text(doc, condition, "field", condition_node, f"the condition of {what}")
    operator = _ms_operator(doc, condition, condition_node, what)
    value_node = condition["value"][1] if "value" in condition else None
    value: Any = doc.plain(value_node) if value_node is not None else None
    action = _ms_action(doc, fields["action"][1], what) if "action" in fields else Action.ALLOW
    priority = doc.plain(fields["priority"][1]) if "priority" in fields else 0
    if isinstance(priority, bool) or not isinstance(priority, int):
        raise doc.error(fields["priority"][1], f"{what}: 'priority' must be an integer, got {priority!r}")
    message = doc.scalar_text(fields["message"][1], "'message'") if "message" in fields else ""
    regex = None
    if operator is Operator.MATCHES:
        try:
            regex = compile_regex("" if value is None else str(value), ignore_case=False)
        except ValueError as exc:
            raise doc.error(value_node or condition_node, f"{what}: {exc}") from None
    return Rule(name, field, operator, value, action, priority, message, regex)


def _ms_operator(
    doc: Document, condition: dict[str, tuple[yaml.Node, yaml.Node]], owner: yaml.Node, what: str
) -> Operator:
    node = condition["operator"][1] if "operator" in condition else owner
    raw = doc.scalar_text(node, "'operator'").strip().lower() if "operator" in condition else ""
    if raw not in set(Operator):
        raise doc.error(node, f"unknown operator '{raw}' in {what} (supported: {_OPERATORS})")
    return Operator(raw)


def _ms_action(doc: Document, node: yaml.Node, what: str) -> Action:
    raw = doc.scalar_text(node, "'action'").strip().lower()
    if raw == "":
        return Action.ALLOW
    if raw not in set(Action):
        raise doc.error(node, f"unknown action '{raw}' in {what} (supported: {_ACTIONS})")
    return Action(raw)


def _is_empty(node: yaml.Node) -> bool:
    return isinstance(node, yaml.ScalarNode) and node.tag == "tag:yaml.org,2002:null"
