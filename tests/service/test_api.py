"""The HTTP room over a fake engine, in process: happy paths, every row of the error table,
batching across requests, disconnects, draining, API keys, CORS and /metrics."""

from __future__ import annotations

import asyncio
import json
import threading
import urllib.parse
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from fastapi.routing import APIRoute
from prometheus_client.parser import text_string_to_metric_families

from service.errors import ErrorType
from service.http import documents, routes
from service.http.app import create_app
from service.http.deepl import InProcessUsage, deepl_router
from service.http.errors import ERROR_TABLE
from service.http.libretranslate import libretranslate_router
from service.metrics import Metrics
from service.scheduling.runtime import Runtime
from tests.service.helpers import FakeModel, async_wait_for, fast_settings, running

pytestmark = pytest.mark.anyio

EN_DE = {"source": "en", "target": "de"}
LT = "/libretranslate"


def error_of(response: httpx.Response) -> dict[str, str]:
    error: dict[str, str] = response.json()["error"]
    assert set(error) == {"type", "message"}
    assert ERROR_TABLE[ErrorType(error["type"])].status == response.status_code
    return error


def runtime_of(app: FastAPI) -> Runtime:
    runtime: Runtime = app.state.runtime
    return runtime


# --- Happy paths -------------------------------------------------------------------------------


async def test_translate_one_text_keeps_its_layout(client: httpx.AsyncClient) -> None:
    text = "A dog runs. A cat sleeps!\n\n  New paragraph\nLast line  "
    response = await client.post("/translate", json={"text": text, **EN_DE})
    assert response.status_code == 200
    body = response.json()
    assert body["model"] == "fake-en-de" and body["source"] == "en" and body["target"] == "de"
    [translation] = body["translations"]
    assert translation["text"] == text.upper()
    assert [s["finish_reason"] for s in translation["segments"]] == ["eos"] * 4
    assert "score" not in translation and "alternatives" not in translation


async def test_translate_a_list_in_order_with_scores_and_alternatives(
    client: httpx.AsyncClient, fake: FakeModel
) -> None:
    response = await client.post(
        "/translate",
        json={
            "text": ["One. Two.", "Three"],
            **EN_DE,
            "beam_size": 3,
            "num_hypotheses": 3,
            "length_penalty": 0.6,
            "max_decoding_length": 1000,
            "return_scores": True,
        },
    )
    assert response.status_code == 200
    first, second = response.json()["translations"]
    assert first["text"] == "ONE. TWO." and second["text"] == "THREE"
    assert first["alternatives"] == [
        {"text": "ONE.~ TWO.~", "score": -1.0},
        {"text": "ONE.~~ TWO.~~", "score": -2.0},
    ]
    assert first["score"] == 0.0 and first["segments"][0]["score"] == 0.0
    options = fake.calls[-1][1]
    assert (options.beam_size, options.num_hypotheses, options.length_penalty) == (3, 3, 0.6)
    assert options.max_decoding_length == fake.max_input_tokens  # capped by the model


async def test_empty_and_blank_texts_never_reach_the_model(
    client: httpx.AsyncClient, fake: FakeModel
) -> None:
    calls = len(fake.calls)  # the warm-up
    response = await client.post("/translate", json={"text": ["", "  \n\t ", "\n\n"], **EN_DE})
    assert response.status_code == 200
    assert [t["text"] for t in response.json()["translations"]] == ["", "", ""]
    assert len(fake.calls) == calls
    response = await client.post("/translate", json={"text": [], **EN_DE})
    assert response.json()["translations"] == []


async def test_settings_give_the_defaults(fake: FakeModel) -> None:
    settings = fast_settings(
        default_beam_size=2,
        default_length_penalty=0.5,
        default_no_repeat_ngram_size=3,
        max_length_a=1.5,
        max_length_b=4,
    )
    async with running(create_app(settings, models=[fake])) as client:
        await client.post("/translate", json={"text": "x", **EN_DE})
        options = fake.calls[-1][1]
        assert (options.beam_size, options.length_penalty, options.num_hypotheses) == (2, 0.5, 1)
        assert (options.no_repeat_ngram_size, options.max_length_a, options.max_length_b) == (
            3,
            1.5,
            4,
        )
        # A request may set the n-gram size, not the relative limit (no such field: 422).
        body = {"text": "x", "no_repeat_ngram_size": 0, **EN_DE}
        assert (await client.post("/translate", json=body)).status_code == 200
        options = fake.calls[-1][1]
        assert (options.no_repeat_ngram_size, options.max_length_a) == (0, 1.5)
        for bad in ({"no_repeat_ngram_size": -1}, {"max_length_a": 100}):
            response = await client.post("/translate", json={"text": "x", **bad, **EN_DE})
            assert response.status_code == 422


async def test_languages_health_ready(client: httpx.AsyncClient) -> None:
    assert (await client.get("/languages")).json() == [
        {"source": "en", "target": "de", "model": "fake-en-de"}
    ]
    assert (await client.get("/health")).json() == {"status": "ok"}
    assert (await client.get("/ready")).json() == {"status": "ready"}
    assert (await client.get("/docs")).status_code == 200
    assert "/translate" in (await client.get("/openapi.json")).json()["paths"]


def test_the_translation_routes_solve_no_dependency_and_the_rest_the_caller_in_one(
    fake: FakeModel,
) -> None:
    """FastAPI walks a route's whole dependency tree on every request, the parts it has solved
    already included (some 10 us a walk): the routes that carry translations (ours,
    LibreTranslate's, DeepL's) read the caller themselves, no walk; the others solve the caller
    (runtime, key, stored key) as one dependency over the two key schemes, three walks, not
    nine. Every one of them states both schemes in the OpenAPI document."""

    def walks(dependant: Any) -> int:
        return sum(1 + walks(sub) for sub in dependant.dependencies)

    routers = {
        "": [routes.router, documents.documents_router, deepl_router(InProcessUsage())],
        "/libretranslate": [libretranslate_router],
    }
    served = {
        (prefix + r.path, method): r
        for prefix, each in routers.items()
        for router in each
        for r in router.routes
        if isinstance(r, APIRoute)
        for method in r.methods
    }
    expected = {
        ("/translate", "POST"): 0,
        ("/libretranslate/translate", "POST"): 0,
        ("/v2/translate", "POST"): 0,
        ("/detect", "POST"): 3,
        ("/usage", "GET"): 3,
        ("/documents", "POST"): 4,  # and the document store's
    }
    schema = create_app(fast_settings(), models=[fake]).openapi()
    for (path, method), count in expected.items():
        assert walks(served[path, method].dependant) == count, path
        security = schema["paths"][path][method.lower()]["security"]
        assert security == [{"APIKeyHeader": []}, {"HTTPBearer": []}], path
    schemes = schema["components"]["securitySchemes"]
    assert schemes["APIKeyHeader"] == {"type": "apiKey", "in": "header", "name": "X-API-Key"}
    assert schemes["HTTPBearer"] == {"type": "http", "scheme": "bearer"}


async def test_a_stopped_batcher_worker_fails_liveness(fake: FakeModel) -> None:
    """Nothing answers the model's requests any more (a bug stopped its worker): /health asks
    the orchestrator for a restart instead of passing forever while /ready fails."""
    app = create_app(fast_settings(), models=[fake])
    async with running(app) as client:
        assert (await client.get("/health")).status_code == 200
        runtime: Runtime = app.state.runtime
        [batcher] = runtime.batchers.values()
        worker = batcher._worker
        assert worker is not None
        worker.cancel()
        await async_wait_for(lambda: not batcher.running)
        health = await client.get("/health")
        assert health.status_code == 503 and error_of(health)["type"] == "unavailable"
        assert (await client.get("/ready")).status_code == 503


async def test_several_bundles_are_routed_by_language_pair() -> None:
    en_de, de_en = FakeModel("en", "de"), FakeModel("de", "en")
    async with running(create_app(fast_settings(), models=[en_de, de_en])) as client:
        response = await client.post(
            "/translate", json={"text": "x", "source": "de", "target": "en"}
        )
        assert response.json()["model"] == "fake-de-en"
        assert len((await client.get("/languages")).json()) == 2
    assert len(de_en.calls) == 2 and len(en_de.calls) == 1  # warm-ups + the request


async def test_a_multi_target_model_serves_each_target_through_one_batcher() -> None:
    multi = FakeModel("en", "de", more_targets=("fr",))
    app = create_app(fast_settings(), models=[multi])
    async with running(app) as client:
        assert (await client.get("/languages")).json() == [
            {"source": "en", "target": "de", "model": "fake-en-de"},
            {"source": "en", "target": "fr", "model": "fake-en-de"},
        ]
        for target in ("fr", "de"):
            response = await client.post(
                "/translate", json={"text": "x", "source": "en", "target": target}
            )
            assert response.status_code == 200
        assert list(runtime_of(app).batchers) == ["fake-en-de"]
    assert multi.encoded_for == ["de", "fr", "de"]  # the warm-up, then each request's target


def test_two_models_may_not_share_a_name() -> None:
    a, b = FakeModel("en", "de"), FakeModel("en", "fr")
    b.name = a.name
    with pytest.raises(ValueError, match="two models named fake-en-de"):
        Runtime(fast_settings(), Metrics(), [a, b])


async def test_not_ready_without_lifespan() -> None:
    app = create_app(fast_settings(), models=[FakeModel()])
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        assert (await client.get("/health")).status_code == 200
        response = await client.get("/ready")
        assert response.status_code == 503 and error_of(response)["type"] == "unavailable"
        response = await client.post("/translate", json={"text": "x", **EN_DE})
        assert response.status_code == 503


# --- Error rows --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        ({"text": "x", "source": "en"}, "target"),
        ({"text": 3, **EN_DE}, "text"),
        ({"text": "x", **EN_DE, "beam_size": 0}, "beam_size"),
        ({"text": "x", **EN_DE, "length_penalty": "NaN"}, "length_penalty"),
        ({"text": "x", **EN_DE, "unknown": 1}, "unknown"),
        ({"text": "x", **EN_DE, "beam_size": 2, "num_hypotheses": 3}, "num_hypotheses"),
        ({"text": "x", **EN_DE, "beam_size": 9}, "limit of 8"),
        ({"text": ["x"] * 129, **EN_DE}, "limit is 128"),
    ],
)
async def test_invalid_fields_are_422(
    client: httpx.AsyncClient, body: dict[str, Any], needle: str
) -> None:
    response = await client.post("/translate", json=body)
    assert response.status_code == 422
    error = error_of(response)
    assert error["type"] == "invalid_request" and needle in error["message"]


async def test_malformed_json_is_422(client: httpx.AsyncClient) -> None:
    response = await client.post(
        "/translate", content=b'{"text": ', headers={"content-type": "application/json"}
    )
    assert response.status_code == 422 and "not valid JSON" in error_of(response)["message"]


async def test_an_unknown_language_pair_is_422(client: httpx.AsyncClient) -> None:
    response = await client.post("/translate", json={"text": "x", "source": "en", "target": "fr"})
    assert response.status_code == 422
    error = error_of(response)
    assert error["type"] == "unsupported_language_pair" and "en -> de" in error["message"]


async def test_a_sentence_over_the_model_limit_is_422_naming_the_limit(
    client: httpx.AsyncClient, fake: FakeModel
) -> None:
    calls = len(fake.calls)
    text = "Fine. " + "X" * 250  # 251 tokens with </s>; the fake's limit is 200
    response = await client.post("/translate", json={"text": ["ok", text], **EN_DE})
    assert response.status_code == 422
    error = error_of(response)
    assert error["type"] == "input_too_long"
    assert "text 1, sentence 1: 251 tokens" in error["message"] and "200" in error["message"]
    assert len(fake.calls) == calls  # nothing of the request was decoded


async def test_unknown_path_and_wrong_method(client: httpx.AsyncClient) -> None:
    response = await client.get("/nowhere")
    assert response.status_code == 404 and error_of(response)["type"] == "not_found"
    response = await client.get("/translate")
    assert response.status_code == 405 and error_of(response)["type"] == "method_not_allowed"
    assert response.headers["allow"] == "POST"  # RFC 9110: a 405 says what is allowed


async def test_requests_are_counted_by_their_route_template(
    client: httpx.AsyncClient, fake: FakeModel
) -> None:
    assert (await client.get(f"/models/{fake.name}/card")).status_code == 200
    assert (await client.get("/nowhere")).status_code == 404
    assert (await client.get(f"{LT}/languages")).status_code == 200
    metrics = (await client.get("/metrics")).text
    assert 'mt_http_requests_total{route="/models/{name}/card",status="200"} 1.0' in metrics
    assert 'mt_http_requests_total{route="other",status="404"} 1.0' in metrics
    # Under its prefix, not the native route of the same name.
    assert f'mt_http_requests_total{{route="{LT}/languages",status="200"}} 1.0' in metrics
    assert 'route="/languages"' not in metrics


async def test_a_body_over_the_limit_is_413(fake: FakeModel) -> None:
    async with running(create_app(fast_settings(max_body_bytes=1000), models=[fake])) as client:
        big = json.dumps({"text": "x" * 2000, **EN_DE}).encode()
        response = await client.post(
            "/translate", content=big, headers={"content-type": "application/json"}
        )
        assert response.status_code == 413 and error_of(response)["type"] == "payload_too_large"

        async def chunks() -> AsyncIterator[bytes]:  # no Content-Length: counted as it comes
            for start in range(0, len(big), 100):
                yield big[start : start + 100]

        response = await client.post(
            "/translate", content=chunks(), headers={"content-type": "application/json"}
        )
        assert response.status_code == 413 and "1000 bytes" in error_of(response)["message"]
        response = await client.post(
            "/libretranslate/translate", content=big, headers={"content-type": "application/json"}
        )
        assert response.status_code == 413 and "error" in response.json()


async def test_a_full_queue_is_429_with_retry_after(fake: FakeModel) -> None:
    app = create_app(fast_settings(max_queue_segments=2), models=[fake])
    async with running(app) as client:
        fake.gate, fake.entered = threading.Event(), threading.Event()
        try:
            busy = asyncio.ensure_future(client.post("/translate", json={"text": "a", **EN_DE}))
            await asyncio.to_thread(fake.entered.wait, 5)
            queued = asyncio.ensure_future(
                client.post("/translate", json={"text": "B\nC", **EN_DE})
            )
            await async_wait_for(lambda: runtime_of(app).batchers[fake.name].depth == 2)
            response = await client.post("/translate", json={"text": "d", **EN_DE})
            assert response.status_code == 429
            assert response.headers["retry-after"] == "2"
            assert error_of(response)["type"] == "queue_full"
        finally:
            fake.gate.set()
        assert [(await r).status_code for r in (busy, queued)] == [200, 200]


async def test_a_request_past_its_deadline_is_503_queued_and_504_decoding(
    fake: FakeModel,
) -> None:
    """request_timeout_s bounds the whole request: still queued past it, 503 (retry later);
    being decoded past it, 504 at once, while the batch goes on (its engine call is held
    here), which drops it at its next step (counted)."""
    app = create_app(fast_settings(request_timeout_s=0.05), models=[fake])
    async with running(app) as client:
        fake.gate, fake.entered = threading.Event(), threading.Event()
        try:
            busy = asyncio.ensure_future(client.post("/translate", json={"text": "a", **EN_DE}))
            await asyncio.to_thread(fake.entered.wait, 5)
            late = asyncio.ensure_future(client.post("/translate", json={"text": "b", **EN_DE}))
            decoding = await busy
            assert not fake.gate.is_set()  # answered before its batch ended
            response = await late
        finally:
            fake.gate.set()
        assert decoding.status_code == 504 and "retry-after" not in decoding.headers
        assert error_of(decoding)["type"] == "decoding_timeout"
        assert "request_timeout_s" in error_of(decoding)["message"]
        assert response.status_code == 503 and "retry-after" in response.headers
        assert error_of(response)["type"] == "deadline_exceeded"
        stopped = f'mt_stopped_segments_total{{model="{fake.name}",reason="deadline"}} 1.0'
        for _ in range(200):  # the engine call ends after the gate opens
            if stopped in (await client.get("/metrics")).text:
                break
            await asyncio.sleep(0.01)
        else:
            pytest.fail("the stopped segment was not counted")
        assert (await client.post("/translate", json={"text": "c", **EN_DE})).status_code == 200
        # The same on the LibreTranslate API: its error body, 504, no Retry-After.
        fake.gate, fake.entered = threading.Event(), threading.Event()
        try:
            lt = {"q": "d", "source": "en", "target": "de"}
            decoding = await client.post(f"{LT}/translate", json=lt)
        finally:
            fake.gate.set()
        assert decoding.status_code == 504 and "retry-after" not in decoding.headers
        assert "deadline" in decoding.json()["error"]


async def test_an_engine_failure_is_500_and_the_service_keeps_serving(
    client: httpx.AsyncClient,
) -> None:
    response = await client.post("/translate", json={"text": "FAIL now", **EN_DE})
    assert response.status_code == 500
    error = error_of(response)
    assert error == {"type": "internal", "message": "the translation engine failed"}
    assert "Traceback" not in response.text and "exploded" not in response.text
    assert (await client.post("/translate", json={"text": "ok", **EN_DE})).status_code == 200
    assert (await client.get("/ready")).status_code == 200


async def test_a_bug_is_500_without_a_stack_trace(
    client: httpx.AsyncClient, fake: FakeModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(texts: object) -> list[list[int]]:
        raise KeyError("internal detail")

    monkeypatch.setattr(fake, "encode", broken)
    response = await client.post("/translate", json={"text": "x", **EN_DE})
    assert response.status_code == 500
    assert error_of(response) == {"type": "internal", "message": "internal server error"}
    assert "internal detail" not in response.text


async def test_api_keys(fake: FakeModel) -> None:
    settings = fast_settings(api_keys=["k-one", "k-two"])
    async with running(create_app(settings, models=[fake])) as client:
        body = {"text": "x", **EN_DE}
        response = await client.post("/translate", json=body)
        assert response.status_code == 401 and error_of(response)["type"] == "unauthorized"
        response = await client.post("/translate", json=body, headers={"X-API-Key": "nope"})
        assert response.status_code == 401
        response = await client.post(
            "/translate", json=body, headers={"X-API-Key": "ключ".encode()}
        )
        assert response.status_code == 401  # non-ASCII keys compare as bytes, no crash
        for headers in ({"X-API-Key": "k-two"}, {"Authorization": "Bearer k-one"}):
            assert (await client.post("/translate", json=body, headers=headers)).status_code == 200
        lt = {"q": "x", **EN_DE}
        response = await client.post("/libretranslate/translate", json=lt)
        assert response.status_code == 403 and "error" in response.json()
        response = await client.post("/libretranslate/translate", json={**lt, "api_key": "k-one"})
        assert response.status_code == 200
        assert (await client.get("/health")).status_code == 200  # probes need no key


async def test_cors(fake: FakeModel) -> None:
    settings = fast_settings(cors_origins=["https://app.example"])
    async with running(create_app(settings, models=[fake])) as client:
        response = await client.options(
            "/translate",
            headers={
                "Origin": "https://app.example",
                "Access-Control-Request-Method": "POST",
                "Access-Control-Request-Headers": "content-type",
            },
        )
        assert response.status_code == 200
        assert response.headers["access-control-allow-origin"] == "https://app.example"
        response = await client.get("/health", headers={"Origin": "https://app.example"})
        assert response.headers["access-control-expose-headers"] == "Retry-After"
        response = await client.get("/health", headers={"Origin": "https://evil.example"})
        assert "access-control-allow-origin" not in response.headers


# --- Batching, disconnects, draining -----------------------------------------------------------


async def test_concurrent_requests_are_decoded_in_one_batch(fake: FakeModel) -> None:
    app = create_app(fast_settings(max_wait_ms=50), models=[fake])
    async with running(app) as client:
        texts = [f"request {i}" for i in range(6)]
        responses = await asyncio.gather(
            *(client.post("/translate", json={"text": t, **EN_DE}) for t in texts)
        )
        assert [r.json()["translations"][0]["text"] for r in responses] == [
            t.upper() for t in texts
        ]
        metrics = (await client.get("/metrics")).text
    assert fake.batch_sizes == [1, 6]  # the warm-up, then every request together
    family = {f.name: f for f in text_string_to_metric_families(metrics)}["mt_batch_size_segments"]
    counts = {s.name: s.value for s in family.samples if not s.labels.get("le")}
    assert counts["mt_batch_size_segments_count"] == 2
    assert counts["mt_batch_size_segments_sum"] == 7


async def test_a_disconnected_client_is_dropped_before_decoding(fake: FakeModel) -> None:
    app = create_app(fast_settings(), models=[fake])
    async with running(app) as client:
        fake.gate, fake.entered = threading.Event(), threading.Event()
        try:
            busy = asyncio.ensure_future(client.post("/translate", json={"text": "a", **EN_DE}))
            await asyncio.to_thread(fake.entered.wait, 5)
            gone = asyncio.Event()
            sent: list[dict[str, Any]] = []
            body = json.dumps({"text": "never decoded", **EN_DE}).encode()
            call = asyncio.ensure_future(
                app(_scope("/translate", body), _receive(body, gone), _collect(sent))
            )
            await async_wait_for(lambda: runtime_of(app).batchers[fake.name].depth == 1)
            gone.set()  # the client hangs up while its sentence waits in the queue
            await call
        finally:
            fake.gate.set()
        assert (await busy).status_code == 200
        assert sent[0]["status"] == 499
        metrics = (await client.get("/metrics")).text
    decoded = [fake.decode(s) for sources, _ in fake.calls for s in sources]
    assert not any("NEVER" in d for d in decoded)
    assert 'mt_dropped_segments_total{reason="cancelled"} 1.0' in metrics


async def test_draining_refuses_new_requests_and_answers_accepted_ones(fake: FakeModel) -> None:
    app = create_app(fast_settings(), models=[fake])
    async with running(app) as client:
        fake.gate, fake.entered = threading.Event(), threading.Event()
        accepted = asyncio.ensure_future(client.post("/translate", json={"text": "a", **EN_DE}))
        await asyncio.to_thread(fake.entered.wait, 5)
        drain = asyncio.ensure_future(runtime_of(app).finish_requests(5.0))
        await asyncio.sleep(0.01)
        assert not drain.done()
        for path, body in (("/translate", {"text": "b"}), (f"{LT}/translate", {"q": "b"})):
            response = await client.post(path, json={**body, **EN_DE})
            assert response.status_code == 503 and response.headers["retry-after"] == "2"
        ready = await client.get("/ready")
        assert ready.status_code == 503 and error_of(ready)["message"] == "shutting down"
        fake.gate.set()
        assert (await accepted).status_code == 200
        assert await drain is True


# --- LibreTranslate surface --------------------------------------------------------------------


async def test_libretranslate_string_and_list(client: httpx.AsyncClient) -> None:
    response = await client.post(f"{LT}/translate", json={"q": "Hello. World", **EN_DE})
    assert response.json() == {"translatedText": "HELLO. WORLD"}
    response = await client.post(
        f"{LT}/translate", json={"q": ["a", "b"], **EN_DE, "format": "text"}
    )
    assert response.json() == {"translatedText": ["A", "B"]}


async def test_libretranslate_auto_source_and_alternatives(client: httpx.AsyncClient) -> None:
    text = "A man is riding a bike."
    response = await client.post(
        f"{LT}/translate", json={"q": text, "source": "auto", "target": "de", "alternatives": 2}
    )
    body = response.json()
    assert body["translatedText"] == text.upper()
    assert body["alternatives"] == [text.upper() + "~", text.upper() + "~~"]
    assert body["detectedLanguage"]["language"] == "en"
    assert 50 < body["detectedLanguage"]["confidence"] <= 100  # the detector's (test_detect.py)
    response = await client.post(
        f"{LT}/translate",
        json={"q": [text, "Two dogs."], "source": "auto", "target": "de", "alternatives": 1},
    )
    body = response.json()
    assert body["translatedText"] == [text.upper(), "TWO DOGS."]
    assert body["alternatives"] == [[text.upper() + "~"], ["TWO DOGS.~"]]
    assert [d["language"] for d in body["detectedLanguage"]] == ["en", "en"]


async def test_libretranslate_form_and_query_bodies(client: httpx.AsyncClient) -> None:
    response = await client.post(f"{LT}/translate", data={"q": "one\r\ntwo", **EN_DE})
    assert response.json() == {"translatedText": "ONE\nTWO"}
    response = await client.post(
        f"{LT}/translate",
        files={"q": (None, "multi"), "source": (None, "en"), "target": (None, "de")},
    )
    assert response.json() == {"translatedText": "MULTI"}
    response = await client.post(f"{LT}/translate", params={"q": "query", **EN_DE})
    assert response.json() == {"translatedText": "QUERY"}
    # UTF-8 in a form body, escaped or as raw bytes (curl -d 'q=läuft'), as werkzeug reads it.
    for body in (
        "q=l%C3%A4uft+%2B+%C3%9F&source=en&target=de",
        "q=läuft %2B ß&source=en&target=de",
    ):
        response = await client.post(
            f"{LT}/translate",
            content=body.encode(),
            headers={"content-type": "application/x-www-form-urlencoded"},
        )
        assert response.json() == {"translatedText": "LÄUFT + SS"}, body


async def test_libretranslate_reads_format_and_alternatives_as_it_does(
    client: httpx.AsyncClient,
) -> None:
    """As LibreTranslate's `if not text_format` and `max(0, int(alternatives))`, in JSON too:
    a null or empty format is text, alternatives may be a string, a negative count is 0."""
    for fields in ({"format": None}, {"format": ""}, {"alternatives": -1}):
        response = await client.post(f"{LT}/translate", json={"q": "A dog.", **EN_DE, **fields})
        assert response.json() == {"translatedText": "A DOG."}, fields
    for fields in ({"format": ""}, {"alternatives": "-1"}):
        response = await client.post(f"{LT}/translate", data={"q": "A dog.", **EN_DE, **fields})
        assert response.json() == {"translatedText": "A DOG."}, fields
    response = await client.post(
        f"{LT}/translate", json={"q": "A dog.", **EN_DE, "alternatives": "1"}
    )
    assert response.json() == {"translatedText": "A DOG.", "alternatives": ["A DOG.~"]}


async def test_text_with_nothing_to_translate_comes_back_as_sent(
    client: httpx.AsyncClient, fake: FakeModel
) -> None:
    """A text or sentence without a letter (emoji, digits, punctuation, a URL) never reaches
    the model, which would make up a sentence for it: it comes back as it was sent, through
    either API and whatever the source; errors still name texts by their index."""
    calls = len(fake.calls)  # the warm-up
    texts = ["🙂", "123", "A dog. 🙂", "!!! https://example.com", "  \u200b ", "½ ① Ⅻ²"]
    response = await client.post(f"{LT}/translate", json={"q": texts, **EN_DE})
    assert response.json() == {
        "translatedText": ["🙂", "123", "A DOG. 🙂", "!!! https://example.com", "", "½ ① Ⅻ²"]
    }
    [(sources, _)] = fake.calls[calls:]
    assert len(sources) == 1  # "A dog." alone
    response = await client.post(f"{LT}/translate", json={"q": "🙂", **EN_DE, "alternatives": 1})
    assert response.json() == {"translatedText": "🙂", "alternatives": []}
    response = await client.post("/translate", json={"text": ["2024", "— 5 —"], **EN_DE})
    assert [t["text"] for t in response.json()["translations"]] == ["2024", "— 5 —"]
    assert len(fake.calls) == calls + 1
    response = await client.post(f"{LT}/translate", json={"q": ["🙂", "x" * 300], **EN_DE})
    assert response.status_code == 400 and response.json()["error"].startswith("text 1,")


@pytest.mark.parametrize(
    ("body", "status", "message"),
    [
        ({"source": "en", "target": "de"}, 400, "Invalid request: missing q parameter"),
        ({"q": "x", "target": "de"}, 400, "Invalid request: missing source parameter"),
        ({"q": "x", "source": "en", "target": "fr"}, 400, "no model translates en -> fr"),
        ({"q": "x", **EN_DE, "format": "html", "alternatives": 1}, 400, "are for format text"),
        ({"q": "x", **EN_DE, "format": "xml"}, 400, "format"),
        ({"q": "x", **EN_DE, "alternatives": 8}, 400, "alternatives parameter must be <= 7"),
        ({"q": "x", **EN_DE, "alternatives": "many"}, 400, "alternatives"),
        ({"q": ["x"] * 129, **EN_DE}, 400, "exceeds text limit (128)"),
        ({"q": "x" * 300, **EN_DE}, 400, "limit of 200 tokens"),
        ({"q": "FAIL", **EN_DE}, 500, "the translation engine failed"),
    ],
)
async def test_libretranslate_errors(
    client: httpx.AsyncClient, body: dict[str, Any], status: int, message: str
) -> None:
    response = await client.post(f"{LT}/translate", json=body)
    assert response.status_code == status
    assert list(response.json()) == ["error"] and message in response.json()["error"]


async def test_libretranslate_rejects_non_object_json(client: httpx.AsyncClient) -> None:
    for content in (b"[1, 2]", b"{nope"):
        response = await client.post(
            f"{LT}/translate", content=content, headers={"content-type": "application/json"}
        )
        assert response.status_code == 400
        assert response.json()["error"].startswith("Invalid JSON format: ")
    assert (await client.get(f"{LT}/nowhere")).json() == {"error": "Not Found"}


async def test_libretranslate_languages_of_several_models() -> None:
    models = [FakeModel("en", "de"), FakeModel("fr", "de")]
    async with running(create_app(fast_settings(), models=models)) as client:
        languages = (await client.get(f"{LT}/languages")).json()
    assert languages == [
        {"code": "de", "name": "German", "targets": []},
        {"code": "en", "name": "English", "targets": ["de"]},
        {"code": "fr", "name": "French", "targets": ["de"]},
    ]


async def test_libretranslate_prefix_can_be_moved_or_switched_off(fake: FakeModel) -> None:
    async with running(create_app(fast_settings(libretranslate_prefix="/lt"), models=[fake])) as c:
        assert (await c.get("/lt/languages")).status_code == 200
    async with running(create_app(fast_settings(libretranslate_prefix=""), models=[fake])) as c:
        assert (await c.get(f"{LT}/languages")).status_code == 404


# --- Metrics -----------------------------------------------------------------------------------


async def test_metrics_parse_and_carry_bounded_labels(client: httpx.AsyncClient) -> None:
    await client.post("/translate", json={"text": "x", **EN_DE}, headers={"X-API-Key": "secret"})
    await client.post("/translate", json={"text": "x", "source": "en", "target": "xx"})
    await client.get("/no/such/path/12345")
    response = await client.get("/metrics")
    assert response.headers["content-type"].startswith("text/plain")
    families = {f.name: f for f in text_string_to_metric_families(response.text)}
    expected = {
        "mt_http_requests": "counter",
        "mt_http_request_duration_seconds": "histogram",
        "mt_in_flight_requests": "gauge",
        "mt_rejected_requests": "counter",
        "mt_queue_wait_seconds": "histogram",
        "mt_engine_seconds": "histogram",
        "mt_batch_size_segments": "histogram",
        "mt_batch_tokens": "histogram",
        "mt_input_tokens": "counter",
        "mt_generated_tokens": "counter",
        "mt_queue_depth_segments": "gauge",
        "mt_dropped_segments": "counter",
        "mt_model_info": "gauge",
    }
    for name, kind in expected.items():
        assert families[name].type == kind, name
    requests = {
        (s.labels["route"], s.labels["status"]): s.value
        for s in families["mt_http_requests"].samples
        if s.name.endswith("_total")
    }
    assert requests[("/translate", "200")] == 1
    assert requests[("/translate", "422")] == 1
    assert requests[("other", "404")] == 1
    rejected = {s.labels["reason"] for s in families["mt_rejected_requests"].samples}
    assert {"unsupported_language_pair", "not_found"} <= rejected
    [info] = [s for s in families["mt_model_info"].samples]
    assert info.labels == {
        "model": "fake-en-de",
        "source": "en",
        "target": "de",
        "provider": "FakeProvider",
    }
    # Nothing from the client (address, key, path, text) becomes a label value.
    values = {v for f in families.values() for s in f.samples for v in s.labels.values()}
    assert not {"secret", "127.0.0.1", "testclient", "/no/such/path/12345", "X"} & values


async def test_metrics_count_each_models_cuda_graphs_after_each_batch() -> None:
    fake = FakeModel()
    async with running(create_app(fast_settings(), models=[fake])) as c:
        for captured in (2, 3):  # the warm-up's batch set it; a batch sets it again
            fake.cuda_graphs_captured = captured
            # A new sentence each time: a repeated one is answered from the cache.
            await c.post("/translate", json={"text": f"x{captured}", **EN_DE})
            text = (await c.get("/metrics")).text
            families = {f.name: f for f in text_string_to_metric_families(text)}
            [sample] = families["mt_cuda_graphs"].samples
            assert (sample.labels, sample.value) == ({"model": "fake-en-de"}, captured)


def _scope(path: str, body: bytes) -> dict[str, Any]:
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "root_path": "",
        "query_string": b"",
        "headers": [
            (b"host", b"test"),
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
        ],
        "client": ("127.0.0.1", 50000),
        "server": ("test", 80),
    }


def _receive(body: bytes, gone: asyncio.Event) -> Any:
    """The body, then `http.disconnect` once `gone` is set: a client that hangs up."""
    messages = [{"type": "http.request", "body": body, "more_body": False}]

    async def receive() -> dict[str, Any]:
        if messages:
            return messages.pop()
        await gone.wait()
        return {"type": "http.disconnect"}

    return receive


def _collect(sent: list[dict[str, Any]]) -> Any:
    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    return send


# --- Review fixes ------------------------------------------------------------------------------


async def test_more_sentences_than_the_queue_holds_is_422_even_when_idle(fake: FakeModel) -> None:
    app = create_app(fast_settings(max_queue_segments=3), models=[fake])
    async with running(app) as client:
        encoded: list[str] = []
        real_encode = fake.encode
        fake.encode = lambda texts, target=None, source=None: (  # type: ignore[method-assign]
            encoded.extend(texts) or real_encode(texts, target, source)
        )
        response = await client.post("/translate", json={"text": "Aa. Bb. Cc. Dd.", **EN_DE})
        assert response.status_code == 422 and "retry-after" not in response.headers
        assert error_of(response) == {
            "type": "invalid_request",
            "message": "4 sentences in one request; the limit is 3 (max_queue_segments)",
        }
        response = await client.post(f"{LT}/translate", json={"q": ["Aa.", "Bb. Cc. Dd."], **EN_DE})
        assert response.status_code == 400 and "max_queue_segments" in response.json()["error"]
        assert encoded == []  # refused before tokenising
        response = await client.post("/translate", json={"text": "Aa. Bb. Cc.", **EN_DE})
        assert response.status_code == 200


@pytest.mark.parametrize(("sentences", "on_the_loop"), [(2, True), (200, False)])
async def test_large_bodies_are_split_and_tokenised_off_the_event_loop(
    client: httpx.AsyncClient,
    fake: FakeModel,
    monkeypatch: pytest.MonkeyPatch,
    sentences: int,
    on_the_loop: bool,
) -> None:
    """A short text costs less than a thread hop; a large one would stall every request."""
    threads: list[threading.Thread] = []
    real_encode = fake.encode

    def encode(texts: Any, target: str | None = None, source: str | None = None) -> list[list[int]]:
        threads.append(threading.current_thread())
        return real_encode(texts, target, source)

    monkeypatch.setattr(fake, "encode", encode)
    text = " ".join(["A dog runs across the green field."] * sentences)  # 2: 69, 200: 7k chars
    response = await client.post("/translate", json={"text": text, **EN_DE})
    assert response.status_code == 200
    assert threads and (threading.main_thread() in threads) == on_the_loop


async def test_libretranslate_detect_is_refused_while_draining(fake: FakeModel) -> None:
    app = create_app(fast_settings(), models=[fake])
    async with running(app) as client:
        assert await runtime_of(app).finish_requests(1.0) is True  # nothing open: drains at once
        response = await client.post(f"{LT}/detect", data={"q": "Hello"})
        assert response.status_code == 503 and response.headers["retry-after"] == "2"
        assert response.json() == {"error": "the service is shutting down"}


async def test_libretranslate_repeated_fields_take_the_first_value_query_first(
    client: httpx.AsyncClient,
) -> None:
    """As Flask's request.values: query string before form, first of repeated names."""
    form = [("q", "first"), ("q", "second"), ("source", "en"), ("target", "de")]
    response = await client.post(
        f"{LT}/translate",
        content=urllib.parse.urlencode(form),
        headers={"content-type": "application/x-www-form-urlencoded"},
    )
    assert response.json() == {"translatedText": "FIRST"}
    response = await client.post(
        f"{LT}/translate", params=[("q", "one"), ("q", "two"), *EN_DE.items()]
    )
    assert response.json() == {"translatedText": "ONE"}
    response = await client.post(
        f"{LT}/translate", params={"q": "query"}, data={"q": "form", **EN_DE}
    )
    assert response.json() == {"translatedText": "QUERY"}


async def test_lines_joined_past_the_token_limit_are_translated_one_by_one() -> None:
    """Lower-case lines read as one wrapped sentence, which would be over the model's limit:
    the text's lines are translated each on its own, as they were before lines were joined."""
    fake = FakeModel(max_input_tokens=30)  # the fake's tokens are characters (+ </s>)
    async with running(create_app(fast_settings(), models=[fake])) as client:
        for text, segments in (
            ("red apples and pears\ngreen grapes and figs\nsweet plums and limes", 3),
            ("red apples\ngreen figs", 1),  # within the limit: one wrapped sentence
        ):
            response = await client.post("/translate", json={"text": text, **EN_DE})
            assert response.status_code == 200, response.text
            [translation] = response.json()["translations"]
            assert translation["text"] == text.upper()
            assert len(translation["segments"]) == segments
