"""`python -m atmosphere.sandbox`: read settings once and run until SIGTERM/SIGINT."""

import sys

from atmosphere.sandbox.app import serve
from atmosphere.sandbox.settings import SandboxSettings
from atmosphere.service import run


def main() -> int:
    """Entry point of `atmosphere-sandbox`."""
    return run(serve, SandboxSettings, service="sandbox")


if __name__ == "__main__":
    sys.exit(main())
