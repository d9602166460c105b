"""`python -m atmosphere.tape`: read settings once and run until SIGTERM/SIGINT."""

import sys

from atmosphere.service import run
from atmosphere.tape.app import serve
from atmosphere.tape.settings import TapeSettings


def main() -> int:
    """Entry point of `atmosphere-tape`."""
    return run(serve, TapeSettings, service="tape")


if __name__ == "__main__":
    sys.exit(main())
