"""/docs from the package (service/http/docs_ui.py): the page names only local URLs, each of them is
served with its media type and a day's caching, nothing outside the allow-list is served, and
/openapi.json is untouched. Once on a small app wired the way service/http/app.py wires it, once on
the service itself."""

from __future__ import annotations

import re
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from service.http import docs_ui
from service.http.app import create_app
from service.http.docs_ui import docs_router
from tests.service.helpers import FakeModel, fast_settings, referenced_urls

# What each asset must be served as, and the least it can weigh (the bundle is ~1.7 MB, the CSS
# ~190 kB: a few bytes would mean an empty or truncated file).
EXPECTED = {
    ".js": ("text/javascript", 500_000),
    ".css": ("text/css", 50_000),
    ".png": ("image/png", 100),
}


def small_app() -> FastAPI:
    """An app wired as service/http/app.py wires its docs, with one route to document."""
    app = FastAPI(title="docs-test", docs_url=None, redoc_url=None)

    @app.get("/ping")
    def ping() -> dict[str, str]:
        return {"ping": "pong"}

    app.include_router(docs_router(app.openapi_url or "/openapi.json", app.title))
    return app


@pytest.fixture(scope="module")
def client() -> Iterator[TestClient]:
    with TestClient(small_app()) as client:
        yield client


def check_docs(client: TestClient, *, root: str = "") -> None:
    """/docs, what it references, and /openapi.json, as a browser offline would need them."""
    page = client.get("/docs")
    assert page.status_code == 200
    assert page.headers["content-type"].startswith("text/html")
    assert "cdn.jsdelivr.net" not in page.text and "://" not in page.text
    assert f"url: '{root}/openapi.json'" in page.text

    urls = referenced_urls(page.text)
    assert sorted(urls) == sorted(
        f"{root}/docs/assets/{name}"
        for name in ("swagger-ui-bundle.js", "swagger-ui.css", "favicon-32x32.png")
    )
    for url in urls:
        parts = urllib.parse.urlsplit(url)
        assert not parts.scheme and not parts.netloc, url
        assert parts.path.startswith(f"{root}/docs/assets/"), url
        asset = client.get(parts.path.removeprefix(root))
        assert asset.status_code == 200, url
        media_type, least = EXPECTED[Path(parts.path).suffix]
        assert asset.headers["content-type"].split(";")[0] == media_type, url
        assert len(asset.content) >= least, url
        assert asset.headers["cache-control"] == "public, max-age=86400"
        if media_type == "image/png":
            assert asset.content.startswith(b"\x89PNG\r\n\x1a\n")
        if media_type == "text/javascript":
            assert b"SwaggerUIBundle" in asset.content

    schema = client.get("/openapi.json")
    assert schema.status_code == 200
    paths = schema.json()["paths"]
    assert paths and not any(path.startswith("/docs") for path in paths)
    # ReDoc's page would load its script from a CDN too: it is turned off.
    assert client.get("/redoc").status_code == 404


def test_the_docs_page_and_its_assets_are_local(client: TestClient) -> None:
    check_docs(client)
    assert "/ping" in client.get("/openapi.json").json()["paths"]


def test_the_page_only_points_at_the_vendored_version(client: TestClient) -> None:
    # The README names what was vendored; the bundle carries its own version.
    readme = (docs_ui.ASSETS_DIR / "README.md").read_text()
    match = re.search(r"`swagger-ui-dist`.*\*\*(5\.\d+\.\d+)\*\*", readme)
    assert match, "the README names the vendored version"
    bundle = client.get("/docs/assets/swagger-ui-bundle.js").content
    assert f'PACKAGE_VERSION:"{match[1]}"'.encode() in bundle


def test_urls_carry_the_root_path_behind_a_proxy() -> None:
    with TestClient(small_app(), root_path="/mt") as client:
        check_docs(client, root="/mt")


@pytest.mark.parametrize(
    "name",
    [
        "nope.js",
        "swagger-ui.js",  # in the npm package, not vendored
        "swagger-ui.css.map",
        "LICENSE",
        "NOTICE",
        "README.md",
        "swagger-ui-bundle.js.LICENSE.txt",
        "SWAGGER-UI.CSS",
        "swagger-ui.css%00",
        "..%2Fpyproject.toml",
        "..%2F..%2F..%2Fpyproject.toml",
        "%2e%2e%2f%2e%2e%2fpyproject.toml",
        "..%5C..%5Cpyproject.toml",
        "%2e%2e",
        "docs_ui.py",
        "..%2Fdocs_ui.py",
    ],
)
def test_nothing_outside_the_allow_list_is_served(client: TestClient, name: str) -> None:
    response = client.get(f"/docs/assets/{name}")
    assert response.status_code == 404, name
    assert b"[project]" not in response.content and b"import" not in response.content


def test_a_build_without_the_assets_fails_when_the_app_is_built(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(docs_ui, "ASSETS_DIR", tmp_path)
    with pytest.raises(FileNotFoundError, match=r"swagger-ui-bundle\.js"):
        docs_router("/openapi.json", "t")


def test_the_service_serves_its_docs_offline() -> None:
    # Passes once service/http/app.py builds FastAPI(..., docs_url=None, redoc_url=None) and
    # includes docs_router(app.openapi_url, app.title); FastAPI's own /docs points at a CDN.
    app = create_app(fast_settings(), models=[FakeModel()])
    with TestClient(app) as client:
        check_docs(client)
        assert "/translate" in client.get("/openapi.json").json()["paths"]
