"""The `atmosphere` command."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from pathlib import Path

from atmosphere.cli.dev import DevOptions, run_dev

DEFAULT_APP = "examples.echo:app"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="atmosphere", description="Atmosphere for Python")
    commands = parser.add_subparsers(dest="command", required=True)
    dev = commands.add_parser("dev", help="run nats-server and every service locally")
    dev.add_argument(
        "--app",
        default=os.environ.get("ATMOSPHERE_APP", DEFAULT_APP),
        help="module:attribute of the App to serve (default: $ATMOSPHERE_APP or %(default)s)",
    )
    dev.add_argument(
        "--home",
        type=Path,
        default=Path(".atmosphere"),
        help="where the broker and services keep their data (default: %(default)s)",
    )
    dev.add_argument("--host", default="127.0.0.1", help="interface to listen on (default: %(default)s)")
    dev.add_argument("--nats-port", type=int, default=4222)
    dev.add_argument("--http-port", type=int, default=8080)
    dev.add_argument(
        "--probe-base-port",
        type=int,
        default=8181,
        help="first of five consecutive probe ports for the worker services",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of `atmosphere`."""
    args = _parser().parse_args(argv)
    options = DevOptions(
        app=args.app,
        home=args.home.resolve(),
        host=args.host,
        nats_port=args.nats_port,
        http_port=args.http_port,
        probe_base_port=args.probe_base_port,
    )
    return asyncio.run(run_dev(options))


if __name__ == "__main__":
    sys.exit(main())
