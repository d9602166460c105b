"""`python -m atmosphere.cli.app_check REFERENCE APP_DIR`: import the app as a service would.

`atmosphere dev` runs this before it starts anything, in a process of its own (the user's module
may start threads or take seconds to import; none of that belongs in the supervisor). It exits 0
when the app loads (and prints its agents and runtime pools), else prints the error and exits
with the services' "app unloadable" code.
"""

from __future__ import annotations

import sys
import traceback

POOLS_LINE = "runtime pools: "
"""The line that lists the app's runtime pools (comma-separated, maybe none)."""


def main(argv: list[str]) -> int:
    """Load `argv[0]` (`module:attribute`) with `argv[1]` first on `sys.path`."""
    reference, app_dir = argv
    # Imported here: `atmosphere dev` checks first that these distributions are installed at all.
    from atmosphere.sdk import UserError  # noqa: PLC0415
    from atmosphere.service import EXIT_APP_UNLOADABLE, AppLoadError, load_service_app  # noqa: PLC0415

    try:
        app = load_service_app(reference, app_dir)
    except AppLoadError as exc:
        cause = exc.__cause__
        # A plain "module not found" needs no traceback; the user's own failure does (its line).
        if cause is not None and not isinstance(cause, UserError):
            traceback.print_exception(cause, file=sys.stderr)
        print(f"Error: {exc}", file=sys.stderr)
        return EXIT_APP_UNLOADABLE
    print(f"app {reference}: agents {', '.join(app.agents) or '(none)'}")
    # Read by `atmosphere dev`: the runtime pools to start a dispatch process for.
    print(f"{POOLS_LINE}{','.join(app.pools)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
