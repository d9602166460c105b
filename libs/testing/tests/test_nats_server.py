import socket
from pathlib import Path

import pytest

from atmosphere.testing import NatsServer, NatsServerError


def test_restart_keeps_the_port_and_the_store(tmp_path: Path) -> None:
    server = NatsServer(tmp_path).start()
    try:
        port = server.port
        assert server.running
        server.kill()
        assert not server.running
        server.start()
        assert server.port == port
        with socket.create_connection(("127.0.0.1", port), timeout=2) as sock:
            assert sock.recv(4) == b"INFO"
        assert (tmp_path / "jetstream").is_dir()
    finally:
        server.stop()


def test_a_failing_start_reports_the_log(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        server = NatsServer(tmp_path)
        server.port = busy.getsockname()[1]
        with pytest.raises(NatsServerError, match="exited"):
            server.start()


def test_url_before_start_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(NatsServerError, match="not been started"):
        _ = NatsServer(tmp_path).url
