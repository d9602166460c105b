"""YAML read the way kustomize and docker compose read it: a key written twice is an error.

PyYAML alone keeps the last of two equal keys, which once hid a doubled `volumes` list and a
doubled claim that the real builder refuses.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

import yaml

MERGE_TAG = "tag:yaml.org,2002:merge"
Document = dict[str, Any]


class StrictLoader(yaml.SafeLoader):
    """A safe loader that refuses a mapping with the same key twice, as kustomize does."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Hashable, Any]:
        """The mapping of `node`, after checking that no key is written twice in it."""
        seen: set[Any] = set()
        # A merge (`<<: *anchor`) may be overridden by a key written beside it; only keys
        # written twice in the mapping itself are a mistake.
        for key_node, _ in (pair for pair in node.value if pair[0].tag != MERGE_TAG):
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    "while constructing a mapping", node.start_mark, f"found duplicate key {key!r}", key_node.start_mark
                )
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def strict_load(text: str) -> Any:
    """The one document of `text`."""
    return yaml.load(text, Loader=StrictLoader)  # noqa: S506 - StrictLoader is a SafeLoader


def strict_load_all(text: str) -> list[Document]:
    """Every non-empty document of `text`."""
    return [d for d in yaml.load_all(text, Loader=StrictLoader) if d]
