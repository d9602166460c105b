"""Ingress's own series, and `/metrics` on its HTTP port (behind the admin token when one is set).

The worker services answer `/metrics` on their probe port, which stays inside the cluster;
ingress has only its public port, so a scrape presents `Authorization: Bearer <admin token>`
whenever `ATMOSPHERE_ADMIN_TOKEN` is set (open otherwise, like the probes).
"""

from __future__ import annotations

import hmac

from fastapi import APIRouter, Request, Response
from prometheus_client import Gauge

from atmosphere.ingress.errors import AdminUnauthorizedError
from atmosphere.ingress.http import state_of
from atmosphere.ingress.state import IngressState
from atmosphere.service import presented_token
from atmosphere.service.telemetry import metrics

OPEN_WEBSOCKETS = Gauge("atmosphere_ingress_websockets", "WebSocket connections open now")
RUN_STREAMS = Gauge(
    "atmosphere_ingress_run_streams",
    "Run streams followed now: WebSocket runs and resumes, SSE streams, long-poll waits",
)

router = APIRouter()


def observe(state: IngressState) -> None:
    """Read the process's gauges from `state` at each scrape (nothing counted on the stream path)."""
    RUN_STREAMS.set_function(state.streams.in_use)


@router.get(
    "/metrics",
    summary="Prometheus metrics of this ingress process",
    response_class=Response,
    responses={
        200: {"content": {metrics.CONTENT_TYPE: {}}},
        401: {"description": "the admin token is set and missing"},
    },
)
async def prometheus_metrics(request: Request) -> Response:
    """Every series of this process in Prometheus's text format."""
    token = state_of(request).admin_gate.token
    if token:
        presented, _ = presented_token(request.headers, {})
        if not presented or not hmac.compare_digest(presented.encode(), token.encode()):
            msg = "Metrics need 'Authorization: Bearer <admin token>'"
            raise AdminUnauthorizedError(msg)
    return Response(metrics.render(), media_type=metrics.CONTENT_TYPE)
