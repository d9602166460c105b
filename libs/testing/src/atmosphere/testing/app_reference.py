"""Where an `App` object can be imported from: the services load an app by `module:attribute`.

A test holds the `App` itself, but the services take `ATMOSPHERE_APP` and `ATMOSPHERE_APP_DIR`
as on a served stack, and the sandbox's tool workers are other processes that import the app
afresh. So the app is looked up among the imported modules: the module that holds it, and the
directory it is importable from (the app directory, whose `atmosphere-policies.yaml` governance
loads).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from atmosphere.sdk import App


@dataclass(frozen=True, slots=True)
class AppReference:
    """How a service names the app: `ATMOSPHERE_APP` and `ATMOSPHERE_APP_DIR`."""

    app: str
    """`module:attribute`."""
    app_dir: Path
    """The directory the module is importable from."""


def reference_of(app: App) -> AppReference | None:
    """Where `app` is importable from by another process, or None (e.g. an `App` made inside a function).

    The modules that define the app's agents are searched first, so that a module which only
    re-imports the app (a test's `from my_agent.app import app`) names it second.
    """
    own = {spec.cls.__module__ for spec in app.agents.values()}
    modules = sorted(sys.modules.items(), key=lambda item: item[0] not in own)
    for name, module in modules:
        if module is None or name == "__main__":
            continue
        attribute = _attribute_holding(module, app)
        root = _import_root(module) if attribute is not None else None
        if attribute is not None and root is not None:
            return AppReference(app=f"{name}:{attribute}", app_dir=root)
    return None


def _attribute_holding(module: ModuleType, app: App) -> str | None:
    try:
        found = [key for key, value in vars(module).items() if value is app]
    except TypeError:  # a module-like object without a `__dict__`
        return None
    return found[0] if found else None


def _import_root(module: ModuleType) -> Path | None:
    """The directory `import <module.__name__>` finds the module's file from, or None."""
    location = getattr(module, "__file__", None)
    if not location:
        return None
    path = Path(location).resolve()
    parts = module.__name__.split(".")
    package = path.name == "__init__.py"
    # `a.b.c` is `<root>/a/b/c.py` or `<root>/a/b/c/__init__.py`: climb one directory per part.
    climb = len(parts) - (0 if package else 1)
    if climb >= len(path.parents):
        return None
    root = path.parents[climb]
    tail = [*parts, path.name] if package else [*parts[:-1], parts[-1] + path.suffix]
    # A name the importer made up (e.g. for a file run as a script) matches no such layout.
    return root if root.joinpath(*tail) == path else None
