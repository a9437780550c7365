"""Input an attacker (or a broken client) sends, in process: every answer is a clear 4xx from the
one error table, never a 500; the key is checked before the body is looked at; cheap limits come
before splitting and tokenizing."""

from __future__ import annotations

import asyncio
import json
import logging
import subprocess
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from service.http.app import create_app
from service.http.middleware import LargeBodyGate
from service.http.server import RedactApiKeys
from service.inference.engine import Engine
from service.scheduling.runtime import PREPARATION_LINE
from tests.service.helpers import REPO, FakeModel, fast_settings, running

EN_DE = {"source": "en", "target": "de"}
LT = "/libretranslate"
JSON = {"content-type": "application/json"}


def raw(body: object) -> bytes:
    """JSON with lone surrogates escaped (\\ud800), as a client's JSON library writes them."""
    return json.dumps(body).encode()


def nested(depth: int) -> bytes:
    return b'{"q": ' + b"[" * depth + b"]" * depth + b', "source": "en", "target": "de"}'


@pytest.mark.anyio
async def test_lone_surrogates_are_refused_not_a_500(client: httpx.AsyncClient) -> None:
    for body in (
        {"text": "\ud800 dog", **EN_DE},
        {"text": ["fine", "\udfff"], **EN_DE},
        {"text": "A dog.", "source": "\ud800", "target": "de"},
        {"text": "A dog.", **EN_DE, "\ud800": 1},
    ):
        response = await client.post("/translate", content=raw(body), headers=JSON)
        assert response.status_code == 422, response.text
        error = response.json()["error"]
        assert error["type"] == "invalid_request"
        assert "lone surrogate" in error["message"]
        assert "\\ud8" in error["message"] or "\\udfff" in error["message"]
    response = await client.post(
        f"{LT}/translate", content=raw({"q": "\ud800", **EN_DE}), headers=JSON
    )
    assert response.status_code == 400 and "lone surrogate" in response.json()["error"]
    # A form field percent-encoding a surrogate's UTF-8 bytes (not UTF-8 either).
    response = await client.post(
        f"{LT}/translate",
        content=b"q=%ED%A0%80&source=en&target=de",
        headers={"content-type": "application/x-www-form-urlencoded"},
    )
    assert response.status_code in (200, 400), response.text


@pytest.mark.anyio
async def test_deep_nesting_is_refused_cheaply(client: httpx.AsyncClient) -> None:
    for path, status in ((f"{LT}/translate", 400), ("/translate", 422)):
        response = await client.post(path, content=nested(100_000), headers=JSON)
        assert response.status_code == status, response.text
        assert "nested too deeply" in response.text
    # Shallow nesting that the parser takes is refused by the schema.
    response = await client.post("/translate", content=nested(50), headers=JSON)
    assert response.status_code == 422


@pytest.mark.anyio
async def test_not_json_is_a_clear_error(client: httpx.AsyncClient) -> None:
    for content, phrase in (
        (b"\xff\xfe{}", "not valid JSON"),
        # UTF-16 (which json.loads would take from bytes) is not UTF-8.
        ('{"text": "A dog.", "source": "en", "target": "de"}'.encode("utf-16"), "not valid JSON"),
        (b'{"text": NaN, "source": "en", "target": "de"}', "NaN is not JSON"),
        (b"[1]", "must be an object"),
        (b"", "not valid JSON"),
    ):
        response = await client.post("/translate", content=content, headers=JSON)
        assert response.status_code == 422, response.text
        assert phrase in response.json()["error"]["message"]
    with_bom = '\ufeff{"text": "A dog.", "source": "en", "target": "de"}'.encode()
    response = await client.post("/translate", content=with_bom, headers=JSON)
    assert response.status_code == 200, response.text  # UTF-8 may start with its BOM


@pytest.mark.anyio
async def test_the_key_is_checked_before_the_body(fake: FakeModel) -> None:
    app = create_app(fast_settings(api_keys=["k1"]), models=[fake])
    async with running(app) as client:
        for content in (nested(100_000), b"{nope", raw({"text": 3, "beam_size": "8"})):
            native = await client.post("/translate", content=content, headers=JSON)
            assert native.status_code == 401, native.text
            assert native.headers["www-authenticate"].startswith("Bearer")
            libre = await client.post(f"{LT}/translate", content=content, headers=JSON)
            assert libre.status_code == 403, libre.text
            assert "www-authenticate" not in libre.headers
        # With the key, the same bodies get their own errors.
        keyed = await client.post(
            "/translate", content=nested(100_000), headers={**JSON, "X-API-Key": "k1"}
        )
        assert keyed.status_code == 422


@pytest.mark.anyio
async def test_a_non_ascii_key_works_in_a_header_as_in_a_body(fake: FakeModel) -> None:
    key = "schlüssel-ключ"
    app = create_app(fast_settings(api_keys=[key]), models=[fake])
    async with running(app) as client:
        body = {"q": "A dog.", **EN_DE}
        in_body = await client.post(f"{LT}/translate", json={**body, "api_key": key})
        assert in_body.status_code == 200, in_body.text
        in_header = await client.post(
            f"{LT}/translate", json=body, headers={"X-API-Key": key.encode()}
        )
        assert in_header.status_code == 200, in_header.text
        bearer = await client.post(
            "/translate",
            json={"text": "A dog.", **EN_DE},
            headers={"Authorization": b"Bearer " + key.encode()},
        )
        assert bearer.status_code == 200, bearer.text
        wrong = await client.post(
            "/translate", json={"text": "A dog.", **EN_DE}, headers={"X-API-Key": b"\xff"}
        )
        assert wrong.status_code == 401


@pytest.mark.anyio
async def test_types_are_strict(client: httpx.AsyncClient, fake: FakeModel) -> None:
    for field, value in (
        ("beam_size", "8"),
        ("beam_size", True),
        ("beam_size", 2.0),
        ("return_scores", 1),
        ("num_hypotheses", "1"),
    ):
        response = await client.post("/translate", json={"text": "A dog.", **EN_DE, field: value})
        assert response.status_code == 422, (field, value)
        assert response.json()["error"]["message"].startswith(field)
    ok = await client.post("/translate", json={"text": "A.", **EN_DE, "length_penalty": 1})
    assert ok.status_code == 200  # an integer is a number
    # LibreTranslate reads int(alternatives), from JSON too: "1" is a number (test_api.py),
    # "1.5" is not; and form fields are text by nature.
    libre = await client.post(f"{LT}/translate", json={"q": "A.", **EN_DE, "alternatives": "1.5"})
    assert libre.status_code == 400
    form = await client.post(f"{LT}/translate", data={"q": "A.", **EN_DE, "alternatives": "1"})
    assert form.status_code == 200, form.text
    assert not fake.calls or all(options.beam_size >= 1 for _, options in fake.calls)


@pytest.mark.anyio
async def test_character_limits_come_before_any_work(fake: FakeModel) -> None:
    settings = fast_settings(max_characters=1000, max_segment_characters=100)
    async with running(create_app(settings, models=[fake])) as client:
        encoded = len(fake.encoded_for)  # the warm-up's
        texts = ["A. " * 200, "B. " * 200]
        response = await client.post("/translate", json={"text": texts, **EN_DE})
        assert response.status_code == 422
        error = response.json()["error"]
        assert error["type"] == "input_too_long"
        assert "1200 characters in one request; the limit is 1000" in error["message"]
        response = await client.post(
            "/translate", json={"text": ["A dog.", "word " * 30 + "end."], **EN_DE}
        )
        assert response.status_code == 422
        assert "text 1, sentence 0: 154 characters" in response.json()["error"]["message"]
        libre = await client.post(f"{LT}/translate", json={"q": "x" * 1001, **EN_DE})
        assert libre.status_code == 400 and "1001 characters" in libre.json()["error"]
        assert len(fake.encoded_for) == encoded  # nothing was tokenized


@pytest.mark.anyio
async def test_large_requests_wait_in_a_short_line() -> None:
    """Requests over the inline size are prepared by one thread; while it is busy, a short
    line waits and the next is told to come back (429), instead of queueing without bound."""

    class SlowEncoder(FakeModel):
        """Holds the preparation thread (the only caller with many sentences) until opened."""

        def __init__(self) -> None:
            super().__init__()
            self.open = threading.Event()

        def encode(
            self, texts: Sequence[str], target: str | None = None, source: str | None = None
        ) -> list[list[int]]:
            if len(texts) >= 40:
                assert self.open.wait(10)
            return super().encode(texts, target, source)

    model = SlowEncoder()
    async with running(create_app(fast_settings(), models=[model])) as client:
        large = {"text": "A brown dog runs across the big green field today. " * 40, **EN_DE}
        first = asyncio.ensure_future(client.post("/translate", json=large))
        waiting = [
            asyncio.ensure_future(client.post("/translate", json=large))
            for _ in range(PREPARATION_LINE - 1)
        ]
        await asyncio.sleep(0.3)
        refused = await client.post("/translate", json=large)
        assert refused.status_code == 429, refused.text
        assert refused.json()["error"]["type"] == "queue_full" and "retry-after" in refused.headers
        small = await asyncio.wait_for(
            client.post("/translate", json={"text": "A dog.", **EN_DE}), 5
        )
        assert small.status_code == 200  # short texts are not in that line
        model.open.set()
        answers = await asyncio.gather(first, *waiting)
        assert [a.status_code for a in answers] == [200] * PREPARATION_LINE


def test_control_characters_alone_translate_to_nothing(eos_engine: Engine) -> None:
    assert eos_engine.encode(["\x01\x02\x1b\x7f\x9f", "\x00"]) == [[], []]
    assert eos_engine.encode(["A\x00 dog\x1b."]) == eos_engine.encode(["A dog."])
    with TestClient(create_app(fast_settings(), models=[eos_engine])) as client:
        response = client.post("/translate", json={"text": "\x01\x02\x03", **EN_DE})
        assert response.status_code == 200
        assert response.json()["translations"][0]["text"] == ""


def test_hostile_strings_never_get_a_500(eos_engine: Engine) -> None:
    """Any code point (lone surrogates and control characters included) in any string field
    of either API, with any JSON value where a field belongs: 200 or the API's 4xx."""
    # Surrogates and controls are rare among all code points: drawn often on purpose.
    hostile = st.sampled_from("\ud800\udbff\udc00\udfff\x00\x01\x1b\x7f\x85\u2028")
    any_text = st.text(st.characters(codec=None, exclude_categories=()) | hostile, max_size=30)
    json_values = st.recursive(
        st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | any_text,
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(any_text, inner, max_size=3),
        max_leaves=8,
    )
    fields = ["text", "source", "target", "beam_size", "num_hypotheses", "length_penalty"]
    with TestClient(create_app(fast_settings(), models=[eos_engine])) as client:

        @settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
        @given(
            text=any_text,
            field=st.sampled_from(fields),
            value=json_values,
            libretranslate=st.booleans(),
        )
        def check(text: str, field: str, value: object, libretranslate: bool) -> None:
            if libretranslate:
                body: dict[str, object] = {"q": text, **EN_DE}
                body[{"text": "q"}.get(field, field)] = value
                response = client.post(f"{LT}/translate", content=raw(body), headers=JSON)
                assert response.status_code in (200, 400), response.text
            else:
                body = {"text": text, **EN_DE, field: value}
                response = client.post("/translate", content=raw(body), headers=JSON)
                assert response.status_code in (200, 422), response.text

        check()


def test_headers_and_no_redirect(fake: FakeModel) -> None:
    with TestClient(create_app(fast_settings(), models=[fake])) as client:
        response = client.get("/health")
        assert response.headers["x-content-type-options"] == "nosniff"
        slash = client.post(
            "/translate/?api_key=secret",
            json={"text": "A.", **EN_DE},
            headers={"host": "evil.example"},
            follow_redirects=False,
        )
        assert slash.status_code == 404 and "location" not in slash.headers
        assert slash.headers["x-content-type-options"] == "nosniff"


def test_query_string_keys_are_redacted_in_the_access_log() -> None:
    record = logging.LogRecord(
        "uvicorn.access",
        logging.INFO,
        __file__,
        1,
        '%s - "%s %s HTTP/%s" %d',
        (
            "1.2.3.4:5",
            "POST",
            "/lt/translate?q=x&API_KEY=s3cret&b=1&api%5Fkey=other&%61pi_key=third&auth_key=dl",
            "1.1",
            200,
        ),
        None,
    )
    assert RedactApiKeys().filter(record)
    line = record.getMessage()
    assert "s3cret" not in line and "API_KEY=***&b=1" in line and "?q=x" in line
    assert "other" not in line and "api%5Fkey=***" in line
    assert "third" not in line and "%61pi_key=***" in line  # a key by its decoded name
    assert "dl" not in line and "auth_key=***" in line  # DeepL's


def test_the_cli_names_a_bad_byte_instead_of_a_traceback(eos_bundle: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "service.translate", "--bundle", str(eos_bundle)],
        input=b"A dog.\nA \xff cat.\n",
        capture_output=True,
        cwd=REPO,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    stderr = done.stderr.decode()
    assert "not UTF-8: line 2, byte 3" in stderr and "Traceback" not in stderr
    assert done.stdout == b""


@pytest.mark.anyio
async def test_large_bodies_take_turns_and_small_ones_pass() -> None:
    inside: list[str] = []  # the requests whose body is being handled, in order
    log: list[tuple[str, str]] = []

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        name = dict(scope["headers"])[b"x-name"].decode()
        inside.append(name)
        log.append(("in", name))
        assert len([n for n in inside if n.startswith("large")]) <= 1, inside  # one at a time
        while (await receive()).get("more_body"):
            pass
        await asyncio.sleep(0.02)  # parsing, checking
        inside.remove(name)
        log.append(("out", name))
        await send({"type": "http.response.start", "status": 422, "headers": []})
        await send({"type": "http.response.body", "body": b"no"})

    gate = LargeBodyGate(app, threshold=100, hold_s=0.05)
    transport = httpx.ASGITransport(app=gate)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:

        async def post(name: str, size: int) -> int:
            response = await client.post("/", content=b"x" * size, headers={"x-name": name})
            return response.status_code

        start = asyncio.get_running_loop().time()
        statuses = await asyncio.gather(*(post(f"large{i}", 1000) for i in range(3)))
        elapsed = asyncio.get_running_loop().time() - start
        assert statuses == [422] * 3
        # Each held ~20 ms, then the next waited as long again: about 5 x 20 ms in all.
        assert elapsed >= 0.09
        assert [event for event, _ in log] == ["in", "out"] * 3
        log.clear()
        large = asyncio.ensure_future(post("large", 1000))
        assert await post("small", 10) == 422
        assert not large.done()  # the small one was not held behind the large one
        assert await large == 422


@pytest.mark.anyio
async def test_a_trickled_large_body_holds_the_others_briefly() -> None:
    entered: list[str] = []

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        entered.append(scope["path"])
        await receive()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    gate = LargeBodyGate(app, threshold=10, hold_s=0.05)
    scope = {"type": "http", "headers": [(b"content-length", b"1000")]}
    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    async def trickle() -> dict[str, Any]:
        await asyncio.sleep(1.0)  # the body's next bytes are slow to come
        return {"type": "http.request", "body": b"x" * 1000, "more_body": False}

    async def at_once() -> dict[str, Any]:
        return {"type": "http.request", "body": b"x" * 1000, "more_body": False}

    slow = asyncio.ensure_future(gate({**scope, "path": "/slow"}, trickle, send))
    await asyncio.sleep(0.01)
    fast = asyncio.ensure_future(gate({**scope, "path": "/fast"}, at_once, send))
    await asyncio.wait_for(asyncio.shield(fast), 0.5)  # in after about 2 x hold_s, not 1 s
    assert entered == ["/slow", "/fast"] and not slow.done()
    await slow
    chunked = {"type": "http", "path": "/c", "headers": [(b"transfer-encoding", b"chunked")]}
    assert gate._large(chunked) and not gate._large({**scope, "headers": []})
