"""`python -m atmosphere.ingress`: read settings once and run until SIGTERM/SIGINT."""

import sys

from atmosphere.ingress.app import serve
from atmosphere.ingress.settings import IngressSettings
from atmosphere.service import run


def main() -> int:
    """Entry point of `atmosphere-ingress`."""
    return run(serve, IngressSettings, service="ingress")


if __name__ == "__main__":
    sys.exit(main())
