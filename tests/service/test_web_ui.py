"""The web page at / (service/http/web_ui.py) without a browser, over the fake engine: its
security headers, that it names only its own files and each is served with its media type,
that nothing outside the allow-list is served, that every control has a label, and that
MT_WEB_UI=false turns it off. tests/service/test_web_browser.py drives it in Chromium."""

from __future__ import annotations

import re
import urllib.parse
from collections.abc import Iterator
from html.parser import HTMLParser
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from service.http import web_ui
from service.http.app import create_app
from service.http.web_ui import web_router
from tests.service.helpers import FakeModel, fast_settings, referenced_urls

MEDIA_TYPES = {".js": "text/javascript", ".css": "text/css", ".svg": "image/svg+xml"}


@pytest.fixture(scope="module")
def client() -> Iterator[TestClient]:
    with TestClient(create_app(fast_settings(), models=[FakeModel()])) as client:
        yield client


def test_the_page_is_served_with_its_security_headers(client: TestClient) -> None:
    page = client.get("/")
    assert page.status_code == 200
    assert page.headers["content-type"] == "text/html; charset=utf-8"
    assert page.headers["x-content-type-options"] == "nosniff"
    assert page.headers["x-frame-options"] == "DENY"
    assert page.headers["referrer-policy"] == "no-referrer"
    policy = dict(
        (directive.split(" ", 1) + [""])[:2]
        for directive in page.headers["content-security-policy"].split("; ")
    )
    assert policy["default-src"] == "'none'"
    assert policy["script-src"] == policy["style-src"] == policy["connect-src"] == "'self'"
    assert policy["frame-ancestors"] == "'none'"
    assert policy["require-trusted-types-for"] == "'script'"
    assert "unsafe" not in page.headers["content-security-policy"]  # no eval, no inline
    assert client.head("/").status_code == 200


def test_the_page_names_only_its_own_files_each_with_its_media_type(client: TestClient) -> None:
    page = client.get("/").text
    # Nothing inline for the policy to refuse, and nothing from elsewhere.
    assert not re.search(r"<script(?![^>]*\bsrc=)", page), "an inline script"
    assert "<style" not in page and " style=" not in page
    assert not re.search(r"\son\w+=", page), "an inline event handler"
    urls = [url for url in referenced_urls(page) if url != "docs"]
    assert sorted(urls) == ["web/app.js", "web/favicon.svg", "web/style.css"]
    # The modules app.js imports, and theirs.
    modules = {"app.js"}
    pending = ["app.js"]
    while pending:
        source = client.get(f"/web/{pending.pop()}").text
        for name in re.findall(r'from "\./([\w.]+)"', source):
            if name not in modules:
                modules.add(name)
                pending.append(name)
    names = {urllib.parse.urlsplit(url).path.removeprefix("web/") for url in urls} | modules
    assert names == set(web_ui.ASSETS), "every listed file is used, every used one listed"
    for name in names:
        response = client.get(f"/web/{name}")
        assert response.status_code == 200, name
        media_type = response.headers["content-type"].split(";")[0]
        assert media_type == MEDIA_TYPES[Path(name).suffix], name
        assert response.headers["cache-control"] == "no-cache"
        assert response.headers["x-content-type-options"] == "nosniff"


def test_the_scripts_never_write_html_or_evaluate_strings(client: TestClient) -> None:
    # The browser's Trusted Types would stop these; this test names the file.
    sinks = re.compile(
        r"\.(inner|outer)HTML\s*=|insertAdjacentHTML|document\.write|\beval\(|Function\("
    )
    for name in (name for name in web_ui.ASSETS if name.endswith(".js")):
        found = sinks.search(client.get(f"/web/{name}").text)
        assert found is None, f"{name} uses {found and found.group()}"


class Controls(HTMLParser):
    """The page's form controls, and which ids its labels name."""

    def __init__(self) -> None:
        super().__init__()
        self.controls: list[dict[str, str | None]] = []
        self.labelled: set[str] = set()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        attributes = dict(attrs)
        if tag in ("input", "select", "textarea", "button"):
            self.controls.append({"tag": tag, **attributes})
        if tag == "label" and attributes.get("for"):
            self.labelled.add(str(attributes["for"]))


def test_every_control_has_a_label(client: TestClient) -> None:
    parser = Controls()
    parser.feed(client.get("/").text)
    unnamed = [
        control
        for control in parser.controls
        if control["tag"] != "button"
        and control.get("id") not in parser.labelled
        and not control.get("aria-label")
    ]
    assert parser.controls and not unnamed
    # Buttons are named by their text, or by aria-label when they show a symbol.
    assert all(c.get("aria-label") for c in parser.controls if c.get("class") == "icon")


@pytest.mark.parametrize(
    "name",
    [
        "index.html",  # served at /, not here
        "nope.js",
        "APP.JS",
        "app.js%00",
        "..%2Fweb_ui.py",
        "..%2F..%2F..%2Fpyproject.toml",
        "%2e%2e%2f%2e%2e%2fapp.py",
        "..%5C..%5Cpyproject.toml",
        "%2e%2e",
    ],
)
def test_nothing_outside_the_allow_list_is_served(client: TestClient, name: str) -> None:
    response = client.get(f"/web/{name}")
    assert response.status_code == 404, name
    assert b"[project]" not in response.content and b"import" not in response.content


def test_the_setting_turns_the_page_off() -> None:
    app = create_app(fast_settings(web_ui=False), models=[FakeModel()])
    with TestClient(app) as client:
        assert client.get("/").status_code == 404
        assert client.get("/web/app.js").status_code == 404
        assert client.get("/status").status_code == 200  # the API stays


def test_the_page_is_labelled_in_the_metrics(client: TestClient) -> None:
    client.get("/")
    assert 'mt_http_requests_total{route="/",status="200"}' in client.get("/metrics").text


def test_a_build_without_the_page_fails_when_the_app_is_built(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(web_ui, "ASSETS_DIR", tmp_path)
    with pytest.raises(FileNotFoundError, match=r"index\.html"):
        web_router()
    (tmp_path / web_ui.PAGE_FILE).write_text("<!doctype html>")
    with pytest.raises(FileNotFoundError, match=r"app\.js"):
        web_router()
