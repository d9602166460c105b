"""`python -m atmosphere.dispatch`: read settings once and run until SIGTERM/SIGINT."""

import sys

from atmosphere.dispatch.app import serve
from atmosphere.dispatch.settings import DispatchSettings
from atmosphere.service import run


def main() -> int:
    """Entry point of `atmosphere-dispatch`."""
    return run(serve, DispatchSettings, service="dispatch")


if __name__ == "__main__":
    sys.exit(main())
