"""`web_router()`: the web page at / and its files under /web/ (service/http/static/web/: plain
HTML, CSS and JavaScript modules, no build step and no CDN, because the service often runs
offline). The page calls the API on the same origin, as any client does: POST /translate,
GET /languages, GET /status, and the document routes (POST /documents, its status and result).

The page is the one HTML document the service serves, so its answer carries the browser-side
rules: a Content-Security-Policy that runs only the page's own files (no inline script or style,
no eval), requires Trusted Types (no string ever becomes HTML: translations are untrusted
text), lets it connect to its own origin only, and keeps it out of frames.

`MT_WEB_UI=false` leaves this router out: / and /web/ are then 404.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter
from fastapi.responses import FileResponse

from service.http.assets import add_asset_route, require_files

ASSETS_DIR = Path(__file__).resolve().parent / "static" / "web"
PAGE_FILE = "index.html"
PAGE_PATH = "/"
ASSETS_PATH = "/web"

_JS = "text/javascript; charset=utf-8"
# The only files /web/ serves, with their media types (a module script must be JavaScript).
ASSETS: dict[str, str] = {
    "app.js": _JS,
    "api.js": _JS,
    "dom.js": _JS,
    "documents.js": _JS,
    "heatmap.js": _JS,
    "status.js": _JS,
    "style.css": "text/css; charset=utf-8",
    "favicon.svg": "image/svg+xml",
}

# The files change with the code and their names do not: a browser revalidates them (ETag) on
# every load rather than run a stale script against a newer API.
ASSET_CACHE_CONTROL = "no-cache"

CONTENT_SECURITY_POLICY = "; ".join(
    (
        "default-src 'none'",
        "script-src 'self'",
        "style-src 'self'",
        "img-src 'self'",
        "connect-src 'self'",
        "base-uri 'none'",
        "form-action 'none'",
        "frame-ancestors 'none'",
        "require-trusted-types-for 'script'",
        "trusted-types 'none'",
    )
)

# X-Content-Type-Options comes with every answer (service.http.middleware).
PAGE_HEADERS = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",  # frame-ancestors for browsers that predate it
    "Cache-Control": ASSET_CACHE_CONTROL,
}


def web_router() -> APIRouter:
    """The page and its files. Raises FileNotFoundError when one is missing from the package,
    so a wheel or image built without them fails when the app is built."""
    require_files(ASSETS_DIR, [PAGE_FILE], "the web page")
    router = APIRouter()

    @router.api_route(PAGE_PATH, methods=["GET", "HEAD"], include_in_schema=False)
    async def page() -> FileResponse:
        return FileResponse(
            ASSETS_DIR / PAGE_FILE, media_type="text/html; charset=utf-8", headers=PAGE_HEADERS
        )

    add_asset_route(router, ASSETS_PATH, ASSETS_DIR, ASSETS, ASSET_CACHE_CONTROL)
    return router
