"""`atmosphere provision`: make the JetStream layout (streams, buckets, the run queue's consumers), then exit.

What no service's own login may do (`atmosphere.bus.permissions`): run it with the provisioner's
login before the services start, or beside them (they wait for it), e.g.

    set -a; . creds/provisioner.env; set +a; atmosphere provision

It reads the services' environment (`ATMOSPHERE_NATS__*`, `ATMOSPHERE_JETSTREAM__*`, and
dispatch's `ATMOSPHERE_DISPATCH__RUN_ACK_WAIT`, `__MAX_RUN_DELIVERIES`, `__MAX_CONCURRENT_RUNS`,
which shape the run queue's consumers). The same step is `python -m atmosphere.dispatch.provision`
in dispatch's image (a Kubernetes Job, compose's `provision` service); `atmosphere dev` runs it
before the services.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from typing import Any


def add_provision_command(commands: Any) -> None:
    """Register `provision` under `commands` (the top-level subparsers)."""
    commands.add_parser(
        "provision",
        help="make the JetStream layout with the provisioner's login, then exit",
        description=(
            "Create or update every stream, key-value bucket, object bucket and the run queue's consumers, "
            "stamped as provisioned by the login (ATMOSPHERE_NATS__USER, e.g. from provisioner.env of "
            "`atmosphere bus-credentials`). Reads the services' settings from the environment, dispatch's "
            "ATMOSPHERE_DISPATCH__* among them (the run queue's consumers take them). Exit 0 when provisioned, "
            "1 when JetStream refused it, 2 when NATS cannot be reached, 78 when a setting is invalid."
        ),
    )


PROVISION_MODULE = "atmosphere.dispatch.provision"
"""Dispatch's provisioning step: the run queue's consumers take dispatch's settings, so it lives
there; run as a process, since a library of the platform never imports a service."""


def run_provision(_args: argparse.Namespace) -> int:
    """Provision as the environment says (dispatch's step, in this interpreter); its exit status."""
    return subprocess.run([sys.executable, "-m", PROVISION_MODULE], check=False).returncode  # noqa: S603
