"""`atmosphere bus-credentials`: a NATS login per service, with its subject permissions, as files.

`atmosphere bus-credentials --out DIR` writes `DIR/nats-auth.conf` (the server's side: every
role's user, password and permissions, from `atmosphere.bus.permissions`) and `DIR/<role>.env`
(each service's `ATMOSPHERE_NATS__USER` and `ATMOSPHERE_NATS__PASSWORD`; `observer.env` for
outside readers of run events such as `atmosphere tape follow`; `provisioner.env` for
`atmosphere provision`, the one login that makes the JetStream layout). Every file is 0600;
every run makes fresh passwords. `atmosphere dev` makes its own with `dev_credentials`.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from atmosphere.bus import subjects
from atmosphere.bus.permissions import CredentialFiles, Role, write_credentials

DEV_CREDENTIALS_DIR = "nats-credentials"
"""Where under its home `atmosphere dev` keeps the credentials it made."""


@dataclass(frozen=True, slots=True)
class DevCredentials:
    """The credentials of one `atmosphere dev` stack: the server's file and each process's variables."""

    server_config: Path
    """A nats-server configuration with every role's user (pass it with `-c`, or `include` it)."""
    env: Mapping[str, Mapping[str, str]]
    """Per role (each service by its name, `observer` and `provisioner`): the variables its process starts with."""
    directory: Path
    """Where the files are (`<role>.env` beside the server's)."""


def dev_credentials(home: Path, namespace: str = "") -> DevCredentials:
    """Fresh credentials for a dev stack in `namespace`, written under `home/nats-credentials`.

    Made anew on every call: the broker and the services start together with them.
    """
    files = write_credentials(home / DEV_CREDENTIALS_DIR, namespace=namespace)
    return DevCredentials(
        server_config=files.server_config,
        env={str(role): credential.env() for role, credential in files.credentials.items()},
        directory=files.server_config.parent,
    )


def add_credentials_command(commands: Any) -> None:
    """Register `bus-credentials` under `commands` (the top-level subparsers)."""
    parser = commands.add_parser(
        "bus-credentials",
        help="write a NATS login per service, with its subject permissions",
        description=(
            "Write DIR/nats-auth.conf, the nats-server configuration with one user per service and its "
            "subject permissions, and DIR/<role>.env with the ATMOSPHERE_NATS__USER and "
            "ATMOSPHERE_NATS__PASSWORD of each service (and of 'observer', for outside readers of run "
            "events, and 'provisioner', for `atmosphere provision`: the only login that makes the JetStream "
            "layout). Every file is readable by its owner only; every run makes new passwords."
        ),
    )
    parser.add_argument("--out", type=Path, required=True, metavar="DIR", help="directory to write the files into")
    parser.add_argument(
        "--namespace",
        type=_namespace,
        default=os.environ.get("ATMOSPHERE_NATS__NAMESPACE", ""),
        help="the stack's bus namespace (default: $ATMOSPHERE_NATS__NAMESPACE, or none)",
    )


def run_credentials(args: argparse.Namespace) -> int:
    """Write the credentials `args` asks for; the exit status."""
    try:
        files = write_credentials(args.out, namespace=args.namespace)
    except OSError as exc:
        print(f"error: cannot write the credentials into {args.out}: {exc}", file=sys.stderr)
        return 1
    print(_summary(files))
    return 0


def _summary(files: CredentialFiles) -> str:
    lines = [f"wrote {files.server_config}  (nats-server -c it, or include it in the server's configuration)"]
    purposes = {
        Role.OBSERVER: "outside readers of run events",
        Role.PROVISIONER: "`atmosphere provision`, which makes the JetStream layout",
    }
    for role, path in files.env_files.items():
        lines.append(f"wrote {path}  (the environment of {purposes.get(role, f'the {role} service')})")
    return "\n".join(lines)


def _namespace(value: str) -> str:
    try:
        return subjects.validate_namespace(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc
