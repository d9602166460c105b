"""The `atmosphere` command."""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import sys
from pathlib import Path

from atmosphere.cli.credentials import add_credentials_command, run_credentials
from atmosphere.cli.dev import DevOptions, run_dev
from atmosphere.cli.new import NewProjectError, new_project
from atmosphere.cli.tape import add_tape_commands, run_tape

DEFAULT_APP = "examples.assistant:app"


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
        "--app-dir",
        type=Path,
        default=Path(os.environ.get("ATMOSPHERE_APP_DIR") or "."),
        help="directory put first on sys.path to import the app (default: $ATMOSPHERE_APP_DIR or the current one)",
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
    dev.add_argument("--grpc-port", type=int, default=50051, help="port of the gRPC DispatchService")
    dev.add_argument("--model-port", type=int, default=8090, help="port of the local model (when it runs)")
    dev.add_argument(
        "--no-model", action="store_true", help="do not start the local model even when LLM_BASE_URL is unset"
    )
    dev.add_argument(
        "--cluster",
        type=int,
        choices=(1, 3, 5),
        default=1,
        help="nats-server nodes: more than 1 runs a JetStream cluster (3 replicas of every stream) and two "
        "replicas of every service; node i listens on --nats-port + i (default: %(default)s)",
    )
    dev.add_argument(
        "--auth",
        action="store_true",
        help="log every service in as its own NATS user with its subject permissions (fresh credentials "
        "under the home's nats-credentials/ each start; observer.env for outside readers)",
    )
    dev.add_argument("--nats-cluster-port", type=int, default=6222, help="route port of the first cluster node")
    dev.add_argument("--nats-monitor-port", type=int, default=8222, help="monitoring port of the first cluster node")
    new = commands.add_parser("new", help="write a starter project: one agent, its test, a README")
    new.add_argument("directory", type=Path, help="where to write it (created when missing)")
    new.add_argument("--package", help="the Python package of the agents (default: from the directory name)")
    add_tape_commands(commands)
    add_credentials_command(commands)
    return parser


def _new(args: argparse.Namespace) -> int:
    try:
        written = new_project(args.directory, package=args.package)
    except NewProjectError as exc:
        print(f"Error: {exc}", file=sys.stderr)
        return 1
    for path in written:
        print(f"wrote {path}")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point of `atmosphere`."""
    args = _parser().parse_args(argv)
    if args.command == "new":
        return _new(args)
    if args.command == "tape":
        return run_tape(args)
    if args.command == "bus-credentials":
        return run_credentials(args)
    options = DevOptions(
        app=args.app,
        app_dir=args.app_dir.resolve(),
        home=args.home.resolve(),
        host=args.host,
        nats_port=args.nats_port,
        http_port=args.http_port,
        probe_base_port=args.probe_base_port,
        grpc_port=args.grpc_port,
        model_port=args.model_port,
        cluster=args.cluster,
        nats_cluster_port=args.nats_cluster_port,
        nats_monitor_port=args.nats_monitor_port,
        auth=args.auth,
        llm_base_url=os.environ.get("LLM_BASE_URL", ""),
        no_model=args.no_model,
        openai_enabled=os.environ.get("ATMOSPHERE_AI_OPENAI_ENABLED", "true").strip().lower()
        not in ("false", "0", "no", "off"),
        # A token made per run unless one is given: admin reads are never open by accident.
        admin_token=os.environ.get("ATMOSPHERE_ADMIN_TOKEN") or secrets.token_urlsafe(18),
    )
    return asyncio.run(run_dev(options))


if __name__ == "__main__":
    sys.exit(main())
