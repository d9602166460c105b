"""`python -m atmosphere.governance`: read settings once and run until SIGTERM/SIGINT."""

import sys

from atmosphere.governance.app import serve
from atmosphere.governance.settings import GovernanceSettings
from atmosphere.service import run


def main() -> int:
    """Entry point of `atmosphere-governance`."""
    return run(serve, GovernanceSettings, service="governance")


if __name__ == "__main__":
    sys.exit(main())
