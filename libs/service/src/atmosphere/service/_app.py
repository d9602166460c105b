"""Loading the user's app in a service: a failure is fatal, never a reason to restart."""

from __future__ import annotations

import sys
from pathlib import Path

from atmosphere.sdk import App, UserError
from atmosphere.sdk.host import load_app

EXIT_APP_UNLOADABLE = 4
"""The exit code of a service whose app cannot be imported.

A restart imports the same code again and fails the same way, so a supervisor that sees this
code stops (`atmosphere dev` stops the whole stack) instead of restarting in a loop.
"""


class AppLoadError(Exception):
    """The configured app cannot be loaded: restarting the process will not help."""


def load_service_app(reference: str, app_dir: Path | str) -> App:
    """Import the `module:attribute` app for a service, as `AppLoadError` when that fails.

    The user's module may raise anything while it is imported (a syntax error, a missing
    dependency, its own exception), and each of them means the same: this app cannot be served.
    """
    try:
        return load_app(reference, app_dir=app_dir)
    except Exception as exc:
        where = f"ATMOSPHERE_APP={reference!r} from ATMOSPHERE_APP_DIR={str(app_dir)!r}"
        msg = f"cannot load {where}: {_describe(reference, exc)}"
        raise AppLoadError(msg) from exc


def _describe(reference: str, exc: Exception) -> str:
    # The SDK's own message already names the module; anything else is the user's error as is.
    if not isinstance(exc, UserError):
        return f"{type(exc).__name__}: {exc}"
    return _not_an_app(reference) or str(exc)


def _not_an_app(reference: str) -> str | None:
    """What the attribute is instead of an App, in plain words (None: the module did not import).

    The SDK says only "... is NoneType", which reads the same for a typo in the attribute and for
    an `app` never assigned; the module is imported by then, so it can be asked which it was.
    """
    module_name, _, attribute = reference.partition(":")
    module = sys.modules.get(module_name)
    if module is None or not attribute:
        return None
    apps = sorted(name for name, value in vars(module).items() if isinstance(value, App))
    if not hasattr(module, attribute):
        known = f"its App is {' or '.join(map(repr, apps))}" if apps else "and no App at all"
        return f"{module_name} has no attribute {attribute!r} ({known})"
    value = getattr(module, attribute)
    if value is None:
        return f"{reference} is None, not an atmosphere.sdk.App — did you forget `{attribute} = App(...)`?"
    if isinstance(value, type) and issubclass(value, App):
        return f"{reference} is the App class itself, not an App — use an instance: `{attribute} = App([...])`"
    if isinstance(value, type):
        # Typically an `@agent` class named directly: it must be listed in an App.
        return (
            f"{reference} is the class {value.__name__}, not an atmosphere.sdk.App — "
            f"list it in one (`app = App([{value.__name__}])`) and point ATMOSPHERE_APP at that"
        )
    kind = type(value).__name__
    article = "an" if kind[:1].lower() in "aeiou" else "a"
    return f"{reference} is {article} {kind}, not an atmosphere.sdk.App; point ATMOSPHERE_APP at `App(...)`"
