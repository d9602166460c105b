"""A real `nats-server` process for tests: random port, JetStream on, restartable in place."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

from atmosphere.cli.nats_server import find_binary, server_args


class NatsServerError(RuntimeError):
    """The server did not start; the message carries the tail of its log."""


class NatsServer:
    """One `nats-server` with JetStream, storing under `store_dir`.

    The first `start()` lets the kernel choose the port; later starts (after `stop()` or
    `kill()`) reuse that port and the same store, so clients reconnect to the "same" broker
    and durable streams survive.
    """

    def __init__(self, store_dir: Path, *, startup_timeout: float = 10.0, extra_args: Sequence[str] = ()) -> None:
        """Prepare (not start) a server storing under `store_dir`.

        `extra_args` are added to the command line, e.g. `("-c", "limits.conf")` for settings
        that only a configuration file sets (such as a lower `max_payload`).
        """
        self.store_dir = store_dir
        self.port: int | None = None
        self._startup_timeout = startup_timeout
        self._extra_args = tuple(extra_args)
        self._process: subprocess.Popen[bytes] | None = None
        self.log_path = store_dir / "nats-server.log"

    @property
    def url(self) -> str:
        """The client URL (after `start()`)."""
        if self.port is None:
            msg = "the server has not been started"
            raise NatsServerError(msg)
        return f"nats://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        """The server's process id (after `start()`)."""
        if self._process is None:
            msg = "the server is not running"
            raise NatsServerError(msg)
        return self._process.pid

    @property
    def running(self) -> bool:
        """Whether the process is alive."""
        return self._process is not None and self._process.poll() is None

    def start(self) -> NatsServer:
        """Start the server and wait until it accepts clients."""
        self.store_dir.mkdir(parents=True, exist_ok=True)
        for stale in self.store_dir.glob("*.ports"):
            stale.unlink()
        args = [
            *server_args(port=self.port if self.port is not None else -1, store_dir=self.store_dir),
            *self._extra_args,
        ]
        with self.log_path.open("ab") as log:
            self._process = subprocess.Popen(  # noqa: S603 - our own binary and arguments
                [str(find_binary()), *args], stdout=log, stderr=subprocess.STDOUT
            )
        self.port = self._wait_for_port()
        return self

    def _wait_for_port(self) -> int:
        assert self._process is not None
        ports_file = self.store_dir / f"nats-server_{self._process.pid}.ports"
        deadline = time.monotonic() + self._startup_timeout
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise NatsServerError(f"nats-server exited with {self._process.returncode}:\n{self.log_tail()}")
            try:
                url = json.loads(ports_file.read_text())["nats"][0]
                return int(url.rsplit(":", 1)[1])
            except (FileNotFoundError, json.JSONDecodeError, KeyError, IndexError):
                time.sleep(0.02)
        self.stop()
        raise NatsServerError(f"nats-server did not start in {self._startup_timeout:g}s:\n{self.log_tail()}")

    def stop(self) -> None:
        """Stop gracefully (SIGTERM, then SIGKILL after 5 s)."""
        if self._process is None:
            return
        if self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(5)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
        self._process = None

    def kill(self) -> None:
        """Kill abruptly (SIGKILL), as a crash would."""
        if self._process is not None and self._process.poll() is None:
            self._process.kill()
            self._process.wait()
        self._process = None

    def restart(self) -> None:
        """Stop and start again on the same port with the same store."""
        self.stop()
        self.start()

    def log_tail(self, lines: int = 30) -> str:
        """The last lines of the server log (for failure messages)."""
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except FileNotFoundError:
            return "(no log)"
