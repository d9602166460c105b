"""`/docs`: Swagger UI over `/openapi.json`, every asset served by ingress itself.

FastAPI's default page loads Swagger UI from a CDN, which an offline or locked-down
deployment cannot reach (and which a browser then trusts with the page). The files come
from the `swagger-ui-bundle-v2` distribution (Swagger UI's own release, Apache-2.0).
"""

from __future__ import annotations

from pathlib import Path

import swagger_ui_bundle  # type: ignore[import-untyped]  # the distribution ships no py.typed
from fastapi import APIRouter
from fastapi.openapi.docs import get_swagger_ui_html, get_swagger_ui_oauth2_redirect_html
from fastapi.responses import FileResponse, HTMLResponse

from atmosphere.ingress.errors import PathNotFoundError

DOCS_PATH = "/docs"
ASSETS_PATH = f"{DOCS_PATH}/assets"
OAUTH2_REDIRECT_PATH = f"{DOCS_PATH}/oauth2-redirect"
ASSETS = {
    "swagger-ui-bundle.js": "text/javascript; charset=utf-8",
    "swagger-ui.css": "text/css; charset=utf-8",
    "favicon-32x32.png": "image/png",
}
"""The only files served: a named list, never a directory (the bundle's sample page points elsewhere)."""
ASSET_CACHE = "public, max-age=86400"

router = APIRouter(include_in_schema=False)


def _asset_dir() -> Path:
    return Path(str(swagger_ui_bundle.swagger_ui_path))


@router.get(DOCS_PATH)
async def swagger_ui() -> HTMLResponse:
    """The Swagger UI page; its script, style and icon come from `/docs/assets/`."""
    return get_swagger_ui_html(
        openapi_url="/openapi.json",
        title="Atmosphere ingress - API",
        swagger_js_url=f"{ASSETS_PATH}/swagger-ui-bundle.js",
        swagger_css_url=f"{ASSETS_PATH}/swagger-ui.css",
        swagger_favicon_url=f"{ASSETS_PATH}/favicon-32x32.png",
        oauth2_redirect_url=OAUTH2_REDIRECT_PATH,
        # Swagger UI would otherwise ask an online validator about the document.
        swagger_ui_parameters={"validatorUrl": None},
    )


@router.get(OAUTH2_REDIRECT_PATH)
async def swagger_ui_redirect() -> HTMLResponse:
    """Swagger UI's OAuth2 redirect page (inline script, nothing loaded from elsewhere)."""
    return get_swagger_ui_oauth2_redirect_html()


@router.get(f"{ASSETS_PATH}/{{name}}", response_model=None)
async def swagger_asset(name: str) -> FileResponse:
    """One of Swagger UI's files."""
    media_type = ASSETS.get(name)
    if media_type is None:
        raise PathNotFoundError(f"No such asset: {name[:64]}")
    return FileResponse(_asset_dir() / name, media_type=media_type, headers={"Cache-Control": ASSET_CACHE})
