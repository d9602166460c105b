"""The `atmosphere` command."""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

from atmosphere.cli.credentials import add_credentials_command, run_credentials
from atmosphere.cli.dev import DevOptions, run_dev
from atmosphere.cli.dev_layout import MAX_PORT, port_conflicts
from atmosphere.cli.new import NewProjectError, new_project, next_steps, package_name
from atmosphere.cli.provision import add_provision_command, run_provision
from atmosphere.cli.tape import add_tape_commands, run_tape
from atmosphere.sdk.runtime import RUNTIME_NAME

DEFAULT_APP = "examples.assistant:app"


class _DefaultsFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Every option's help ends with its default, unless the help says it in words already."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        # A flag's default is its absence, a required option has none, and `None` tells nothing.
        if "default" in text.lower() or action.nargs == 0 or action.required or action.default is None:
            return action.help
        return super()._get_help_string(action)


class _Parser(argparse.ArgumentParser):
    """A parser whose subcommands' parsers (made elsewhere, e.g. `tape`) show defaults too."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", _DefaultsFormatter)
        super().__init__(*args, **kwargs)


def _port(text: str) -> int:
    try:
        port = int(text)
    except ValueError:
        port = 0
    if not 1 <= port <= MAX_PORT:
        msg = f"{text!r} is not a port number from 1 to {MAX_PORT}"
        raise argparse.ArgumentTypeError(msg)
    return port


def _pool_python(text: str) -> tuple[str, str]:
    """`RUNTIME=PYTHON`: the interpreter of one runtime's pool (an environment of its own)."""
    runtime, _, python = text.partition("=")
    if not RUNTIME_NAME.fullmatch(runtime) or not python:
        msg = f"{text!r} must look like RUNTIME=PYTHON (e.g. crewai=.venvs/pinned/bin/python)"
        raise argparse.ArgumentTypeError(msg)
    path = Path(python).expanduser()
    if not path.is_file() or not os.access(path, os.X_OK):
        msg = f"{python!r} (the interpreter of the {runtime} pool) is not an executable file"
        raise argparse.ArgumentTypeError(msg)
    return runtime, str(path.absolute())


def _app_reference(text: str) -> str:
    module, _, attribute = text.partition(":")
    if not module.strip() or not attribute.strip():
        msg = f"{text!r} must look like module:attribute (e.g. {DEFAULT_APP})"
        raise argparse.ArgumentTypeError(msg)
    return text


def _app_dir(text: str) -> Path:
    path = Path(text)
    if not path.is_dir():
        msg = f"{text} is not a directory"
        raise argparse.ArgumentTypeError(msg)
    return path


def _home(text: str) -> Path:
    path = Path(text)
    if path.exists() and not path.is_dir():
        msg = f"{text} exists and is not a directory"
        raise argparse.ArgumentTypeError(msg)
    return path


def _version() -> str:
    try:
        return metadata.version("atmosphere-ai-cli")
    except metadata.PackageNotFoundError:
        return "0+unknown"


def _add_dev_command(commands: Any) -> argparse.ArgumentParser:
    dev: argparse.ArgumentParser = commands.add_parser("dev", help="run nats-server and every service locally")
    dev.add_argument(
        "--app",
        type=_app_reference,
        default=os.environ.get("ATMOSPHERE_APP", DEFAULT_APP),
        help="module:attribute of the App to serve (default: $ATMOSPHERE_APP or %(default)s)",
    )
    dev.add_argument(
        "--app-dir",
        type=_app_dir,
        # A string, so that argparse checks it (as `type`) like a given one.
        default=os.environ.get("ATMOSPHERE_APP_DIR") or ".",
        help="directory put first on sys.path to import the app (default: $ATMOSPHERE_APP_DIR or the current one)",
    )
    dev.add_argument("--home", type=_home, default=".atmosphere", help="where the broker and services keep their data")
    dev.add_argument("--host", default="127.0.0.1", help="interface to listen on")
    dev.add_argument(
        "--nats-port", type=_port, default=4222, help="NATS client port (of the first node; node i: this + i)"
    )
    dev.add_argument("--http-port", type=_port, default=8080, help="ingress's HTTP and WebSocket port")
    dev.add_argument(
        "--probe-base-port",
        type=_port,
        default=8181,
        help="first of the consecutive /readyz probe ports of the worker services (five; ten with --cluster)",
    )
    dev.add_argument("--grpc-port", type=_port, default=50051, help="port of the gRPC DispatchService")
    dev.add_argument("--model-port", type=_port, default=8090, help="port of the local model (when it runs)")
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
    _add_pool_arguments(dev)
    dev.add_argument(
        "--nats-cluster-port", type=_port, default=6222, help="route port of the first cluster node (--cluster)"
    )
    dev.add_argument(
        "--nats-monitor-port", type=_port, default=8222, help="monitoring port of the first cluster node (--cluster)"
    )
    return dev


def _add_pool_arguments(dev: argparse.ArgumentParser) -> None:
    """How `atmosphere dev` runs the runtime pools the app pins agents to."""
    dev.add_argument(
        "--pool-python",
        type=_pool_python,
        action="append",
        default=[],
        metavar="RUNTIME=PYTHON",
        help="run that runtime's pool on another interpreter, one whose environment has its adapter "
        "(e.g. crewai=.venvs/pinned/bin/python); repeat for several",
    )


def _parsers() -> tuple[argparse.ArgumentParser, argparse.ArgumentParser]:
    """The `atmosphere` parser, and its `dev` subcommand's (whose usage a bad port combination shows)."""
    parser = _Parser(prog="atmosphere", description="Atmosphere for Python")
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    commands = parser.add_subparsers(dest="command", required=True)
    dev = _add_dev_command(commands)
    new = commands.add_parser(
        "new", help="write a starter project: one agent, its test, a README, its image and deployment"
    )
    new.add_argument("directory", type=Path, help="where to write it (created when missing)")
    new.add_argument("--package", help="the Python package of the agents (default: from the directory name)")
    new.add_argument(
        "--image",
        help="the project's image, which compose and kustomize run (default: <directory name>:0.1.0), "
        "e.g. registry.example.com/team/my-agents:1.2.3",
    )
    add_tape_commands(commands)
    add_credentials_command(commands)
    add_provision_command(commands)
    return parser, dev


def _parser() -> argparse.ArgumentParser:
    return _parsers()[0]


def _new(args: argparse.Namespace) -> int:
    try:
        written = new_project(args.directory, package=args.package, image=args.image)
    except NewProjectError as exc:
        print(f"Error: {exc}", file=sys.stderr)
        return 1
    for path in written:
        print(f"wrote {path}")
    print(next_steps(args.directory, package_name(args.directory, args.package)))
    return 0


def _dev_options(args: argparse.Namespace) -> DevOptions:
    return DevOptions(
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
        admin_token_given=bool(os.environ.get("ATMOSPHERE_ADMIN_TOKEN")),
        default_runtime=os.environ.get("ATMOSPHERE_DISPATCH__RUNTIME") or "built-in",
        pool_python=tuple(args.pool_python),
    )


def main(argv: list[str] | None = None) -> int:
    """Entry point of `atmosphere`."""
    parser, dev_parser = _parsers()
    args = parser.parse_args(argv)
    if args.command == "new":
        return _new(args)
    if args.command == "tape":
        return run_tape(args)
    if args.command == "bus-credentials":
        return run_credentials(args)
    if args.command == "provision":
        return run_provision(args)
    options = _dev_options(args)
    if conflicts := port_conflicts(options):
        # The flags' combination is the mistake: a usage error, like a port out of range.
        dev_parser.error("; ".join(conflicts))
    return asyncio.run(run_dev(options))


if __name__ == "__main__":
    sys.exit(main())
