"""Policies written in Python: the application registers them at import, governance installs them.

The registry is module-level (one per process), like Atmosphere's ServiceLoader-found policies.
"""

from __future__ import annotations

import threading

from atmosphere.governance.policies.model import Policy

_registered: list[Policy] = []
_lock = threading.Lock()


def register_policy(policy: Policy) -> None:
    """Add `policy` to the ones governance installs after the file policies (once per object)."""
    if not isinstance(policy, Policy):
        raise TypeError(f"{policy!r} is not a policy (needs identity, evaluate and release)")
    with _lock:
        if all(existing is not policy for existing in _registered):
            _registered.append(policy)


def registered_policies() -> list[Policy]:
    """The registered policies, in registration order."""
    with _lock:
        return list(_registered)


def clear_registered_policies() -> None:
    """Forget every registered policy (for tests and for re-imports)."""
    with _lock:
        _registered.clear()
