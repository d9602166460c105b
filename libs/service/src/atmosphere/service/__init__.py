"""What every Atmosphere service process shares: its lifecycle, health and info responders."""

from atmosphere.service._health import Health, health_router
from atmosphere.service._probes import serve_probes
from atmosphere.service._run import loop_factory, run
from atmosphere.service._runtime import ServiceRuntime, open_service

__all__ = ["Health", "ServiceRuntime", "health_router", "loop_factory", "open_service", "run", "serve_probes"]
