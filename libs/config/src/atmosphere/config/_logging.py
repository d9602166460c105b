"""Logging setup: plain text for people, JSON lines for collectors."""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime

from atmosphere.config._settings import LogSettings


class _JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "ts": datetime.fromtimestamp(record.created, tz=UTC).isoformat(),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry)


def configure_logging(settings: LogSettings, *, service: str) -> None:
    """Send the root logger to stderr at `settings.level`."""
    handler = logging.StreamHandler(sys.stderr)
    if settings.json_format:
        handler.setFormatter(_JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter(f"%(asctime)s %(levelname)-7s {service} %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(settings.level)
    # nats-py logs every reconnect attempt at ERROR; our bus logs the meaningful ones.
    logging.getLogger("nats").setLevel(logging.CRITICAL)
