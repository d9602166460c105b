"""Loading the user's app in a service: a failure is fatal, never a reason to restart."""

from __future__ import annotations

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
        msg = f"cannot load ATMOSPHERE_APP={reference!r} from ATMOSPHERE_APP_DIR={str(app_dir)!r}: {_describe(exc)}"
        raise AppLoadError(msg) from exc


def _describe(exc: Exception) -> str:
    # The SDK's own message already names the module; anything else is the user's error as is.
    return str(exc) if isinstance(exc, UserError) else f"{type(exc).__name__}: {exc}"
