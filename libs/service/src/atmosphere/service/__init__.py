"""What every Atmosphere service process shares: its lifecycle, health and info responders, and who is calling."""

from atmosphere.service._app import EXIT_APP_UNLOADABLE, AppLoadError, load_service_app
from atmosphere.service._auth import (
    ANONYMOUS,
    Authenticator,
    AuthError,
    Caller,
    conversation_user_key,
    presented_token,
    scoped_conversation,
    user_key,
)
from atmosphere.service._health import Health, health_router
from atmosphere.service._probes import serve_probes
from atmosphere.service._run import EXIT_INVALID_SETTINGS, loop_factory, run
from atmosphere.service._runtime import ServiceRuntime, layout_from, open_service
from atmosphere.service._slots import StreamLimitError, StreamSlot, StreamSlots, client_key

__all__ = [
    "ANONYMOUS",
    "EXIT_APP_UNLOADABLE",
    "EXIT_INVALID_SETTINGS",
    "AppLoadError",
    "AuthError",
    "Authenticator",
    "Caller",
    "Health",
    "ServiceRuntime",
    "StreamLimitError",
    "StreamSlot",
    "StreamSlots",
    "client_key",
    "conversation_user_key",
    "health_router",
    "layout_from",
    "load_service_app",
    "loop_factory",
    "open_service",
    "presented_token",
    "run",
    "scoped_conversation",
    "serve_probes",
    "user_key",
]
