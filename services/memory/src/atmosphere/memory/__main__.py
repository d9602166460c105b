"""`python -m atmosphere.memory`: read settings once and run until SIGTERM/SIGINT."""

import sys

from atmosphere.memory.app import serve
from atmosphere.memory.settings import MemorySettings
from atmosphere.service import run


def main() -> int:
    """Entry point of `atmosphere-memory`."""
    return run(serve, MemorySettings, service="memory")


if __name__ == "__main__":
    sys.exit(main())
