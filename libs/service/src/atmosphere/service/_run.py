"""Running a service as a process: logging, signals, exit codes."""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
from collections.abc import Awaitable, Callable
from typing import TypeVar

from atmosphere.bus import ConnectError, ConnectionLostError, LayoutNotProvisionedError
from atmosphere.config import (
    SETTINGS_ERRORS,
    InvalidSettingsError,
    ServiceSettings,
    configure_logging,
    invalid_settings,
    secret_values,
)
from atmosphere.service._app import EXIT_APP_UNLOADABLE, AppLoadError
from atmosphere.service._health import process_instance
from atmosphere.service.log_context import log_context
from atmosphere.service.telemetry import configure_tracing, shutdown_tracing

S = TypeVar("S", bound=ServiceSettings)

log = logging.getLogger("atmosphere.service")

EXIT_INVALID_SETTINGS = 78
"""The exit code of a service whose settings are invalid (`EX_CONFIG` of sysexits.h).

Like `EXIT_APP_UNLOADABLE`, a restart reads the same environment and fails the same way, so a
supervisor that sees it stops instead of restarting; unlike exit 2 (NATS cannot be reached),
which a restart may well cure.
"""


EXIT_NOT_PROVISIONED = 5
"""The exit code of a service with a login that did not find the JetStream layout in time: the
provisioner has not run (yet). A supervisor restarts it; the error names what is missing."""


def loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """Uvloop when it is installed (every hop of a token costs less), else asyncio's own."""
    try:
        import uvloop  # noqa: PLC0415 - optional: not on every platform
    except ImportError:
        return None
    return uvloop.new_event_loop


def run(  # noqa: PLR0911 - one exit code per way to end, as the docstring lists them
    serve: Callable[..., Awaitable[None]], load_settings: Callable[[], S], *, service: str
) -> int:
    """Read the settings once, then run `serve(settings, stop=...)` until SIGTERM or SIGINT.

    The first signal sets `stop`, so the service drains and exits cleanly; a second signal
    cancels it outright. Returns the process exit code: 0 after a clean stop, 2 when NATS
    cannot be reached, 3 when the NATS connection closed for good and 5 (`EXIT_NOT_PROVISIONED`)
    when a service with a login did not find the JetStream layout (a supervisor restarts the
    process), 4 (`EXIT_APP_UNLOADABLE`) when the app cannot be imported and 78
    (`EXIT_INVALID_SETTINGS`) when the settings are invalid (a supervisor must not restart
    it), 130 when cancelled.
    """
    try:
        settings = load_settings()
    except SETTINGS_ERRORS as exc:
        _report_invalid_settings(service, exc, load_settings)
        return EXIT_INVALID_SETTINGS
    _log_as(service, settings)
    configure_tracing(service, instance=process_instance())

    async def main() -> None:
        stop = asyncio.Event()
        task = asyncio.current_task()
        loop = asyncio.get_running_loop()

        def on_signal() -> None:
            if stop.is_set() and task is not None:
                log.warning("second signal: cancelling %s", service)
                task.cancel()
            stop.set()

        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, on_signal)
        await serve(settings, stop=stop)

    try:
        with asyncio.Runner(loop_factory=loop_factory()) as runner:
            runner.run(main())
    except AppLoadError as exc:
        log.error("%s: %s", service, exc, exc_info=exc.__cause__)
        return EXIT_APP_UNLOADABLE
    except ConnectError as exc:
        log.error("%s", exc)
        return 2
    except ConnectionLostError as exc:
        log.error("%s", exc)
        return 3
    except LayoutNotProvisionedError as exc:
        # One line naming what is missing, no traceback: a restart may cure it.
        log.error("%s: %s", service, exc)
        return EXIT_NOT_PROVISIONED
    except asyncio.CancelledError:
        return 130
    finally:
        shutdown_tracing()  # the spans still buffered go out before the process does
    log.info("%s stopped", service)
    return 0


def _log_as(service: str, settings: ServiceSettings) -> None:
    """Log to stderr, every line naming this process (and the run and span of the code logging it).

    The service's own secrets are cut out of every line, whatever logged them.
    """
    secrets = secret_values(settings)
    configure_logging(settings.log, service=service, replica=process_instance(), context=log_context, redact=secrets)


def _report_invalid_settings(
    service: str, error: InvalidSettingsError, load_settings: Callable[[], ServiceSettings]
) -> None:
    # Never `str(error)`: pydantic repeats every rejected input, and the input may be a token.
    settings = load_settings if isinstance(load_settings, type) else None
    problems = "".join(f"\n  {line}" for line in invalid_settings(error, settings))
    message = f"{service}: invalid settings; fix these variables and start it again:{problems}"
    print(message, file=sys.stderr)  # noqa: T201 - before logging exists
