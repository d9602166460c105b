"""`/atmosphere/console/`: the console, a single page served by ingress itself.

The page is plain HTML, CSS and one JavaScript module, shipped in this distribution
(`console_page/`), so it works offline and behind a locked-down network: nothing is loaded from
anywhere but this origin, and the Content-Security-Policy says so to the browser too. It holds no
secret and no data: everything it shows comes from the public API with the token the person
types in (`/api/me`, `/api/agents`, `/api/runs`, the agent WebSocket, and `/api/admin/*` with an
admin token), so it can see exactly what that token can and nothing more.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter
from fastapi.responses import FileResponse, RedirectResponse

from atmosphere.ingress.errors import PathNotFoundError

CONSOLE_PATH = "/atmosphere/console"
PAGE_DIR = Path(__file__).parent / "console_page"
ASSETS = {
    "console.js": "text/javascript; charset=utf-8",
    "console.css": "text/css; charset=utf-8",
    "favicon.svg": "image/svg+xml",
}
"""The only files served besides the page: a named list, never a directory."""

POLICY = "; ".join(
    (
        "default-src 'none'",
        "script-src 'self'",
        "style-src 'self'",
        # Images a run returns (a code_exec plot) arrive as base64 in its frames: data: and blob:.
        "img-src 'self' data: blob:",
        # 'self' covers ws:/wss: to this host in every current browser; the API and the agents'
        # WebSockets are all on this origin.
        "connect-src 'self'",
        "manifest-src 'self'",
        "base-uri 'none'",
        "form-action 'none'",
        "frame-ancestors 'none'",
    )
)
HEADERS = {
    "Content-Security-Policy": POLICY,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    # The page and its script change together on an upgrade: revalidate both (cheap: ETag).
    "Cache-Control": "no-cache",
}

router = APIRouter(include_in_schema=False)


@router.get(CONSOLE_PATH)
async def console_redirect() -> RedirectResponse:
    """Without the trailing slash the page's relative asset links would resolve one level up."""
    return RedirectResponse(f"{CONSOLE_PATH}/", status_code=308)


@router.get(f"{CONSOLE_PATH}/")
async def console_page() -> FileResponse:
    """The console's page."""
    return FileResponse(PAGE_DIR / "index.html", media_type="text/html; charset=utf-8", headers=HEADERS)


@router.get(f"{CONSOLE_PATH}/{{name}}", response_model=None)
async def console_asset(name: str) -> FileResponse:
    """One of the console's files."""
    media_type = ASSETS.get(name)
    if media_type is None:
        raise PathNotFoundError(f"No such console file: {name[:64]}")
    return FileResponse(PAGE_DIR / name, media_type=media_type, headers=HEADERS)
