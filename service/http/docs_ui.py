"""`docs_router(openapi_url, title)`: the Swagger UI page at /docs, with its JavaScript, CSS and
favicon served from the package (service/http/static/swagger-ui/, see its README.md) instead of
FastAPI's default CDN: the service runs offline, and a page that pulls scripts from a third-party
host without integrity checks would run whatever that host serves.

The app turns its own docs off and includes this router instead:
`FastAPI(..., docs_url=None, redoc_url=None)`, then `app.include_router(docs_router(...))`.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter, Request
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import HTMLResponse

from service.http.assets import add_asset_route

ASSETS_DIR = Path(__file__).resolve().parent / "static" / "swagger-ui"

# The only files /docs/assets/ serves, with their media types (service/http/assets.py says why
# an allow-list); the README and licences stay unserved.
ASSETS: dict[str, str] = {
    "swagger-ui-bundle.js": "text/javascript; charset=utf-8",
    "swagger-ui.css": "text/css; charset=utf-8",
    "favicon-32x32.png": "image/png",
}

# The folder's README pins the version and updates replace the files in place; a day bounds how
# long a browser keeps the previous version after an update, while sparing it 1.9 MB a visit.
ASSET_CACHE_CONTROL = "public, max-age=86400"

DOCS_PATH = "/docs"
ASSETS_PATH = f"{DOCS_PATH}/assets"


def docs_router(openapi_url: str, title: str) -> APIRouter:
    """The /docs page and its assets, for an app whose schema is at `openapi_url` (normally
    `app.openapi_url`) and whose page title starts with `title` (normally `app.title`).

    Raises FileNotFoundError when a vendored asset is missing, so a wheel or image built without
    the package data fails when the app is built rather than with a blank /docs page."""
    router = APIRouter()

    @router.get(DOCS_PATH, include_in_schema=False)
    async def swagger_ui(request: Request) -> HTMLResponse:
        # Behind a proxy that mounts the app under a prefix (uvicorn --root-path), the browser
        # needs the prefix on every URL: the same rule FastAPI's own /docs follows.
        root = str(request.scope.get("root_path", "")).rstrip("/")
        return get_swagger_ui_html(
            openapi_url=root + openapi_url,
            title=f"{title} - Swagger UI",
            swagger_js_url=f"{root}{ASSETS_PATH}/swagger-ui-bundle.js",
            swagger_css_url=f"{root}{ASSETS_PATH}/swagger-ui.css",
            swagger_favicon_url=f"{root}{ASSETS_PATH}/favicon-32x32.png",
            # No OAuth2 flows in this API (it takes API keys and bearer tokens), so no
            # /docs/oauth2-redirect page either.
            oauth2_redirect_url=None,
            # Swagger UI would otherwise send the schema to validator.swagger.io for a badge.
            swagger_ui_parameters={"validatorUrl": None},
        )

    add_asset_route(router, ASSETS_PATH, ASSETS_DIR, ASSETS, ASSET_CACHE_CONTROL)
    return router
