"""The whole service in process over the real engine (tiny eos bundle): translation through
every room, any Unicode input, and schemathesis against the OpenAPI schema."""

from __future__ import annotations

import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import schemathesis
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis.checks import not_a_server_error
from schemathesis.python.asgi import shutdown_lifespans

from service.http.app import create_app
from service.inference.engine import Engine
from tests.service.helpers import fast_settings, running

EN_DE = {"source": "en", "target": "de"}
# Schema fuzzing: cases per generation mode for POST /translate, the service's core, and for each
# other operation (the compatible APIs, documents, glossaries, usage: each its own reader).
EXAMPLES_PER_MODE = 350
OTHER_EXAMPLES_PER_MODE = 60


@pytest.mark.anyio
async def test_bundles_from_settings_translate_with_their_layout(eos_bundle: Path) -> None:
    settings = fast_settings(bundle=[eos_bundle], intra_op_threads=1, device="cpu")
    async with running(create_app(settings)) as client:
        text = "A man rides a bike. Two dogs play in the snow.\n\nA woman sings."
        response = await client.post(
            "/translate",
            json={
                "text": [text, " "],
                **EN_DE,
                "beam_size": 2,
                "num_hypotheses": 2,
                "return_scores": True,
            },
        )
        assert response.status_code == 200, response.text
        body = response.json()
        assert body["model"] == Path(Engine.load(eos_bundle).manifest.provenance.checkpoint).name
        translation, blank = body["translations"]
        assert blank["text"] == "" and blank["segments"] == []
        assert len(translation["segments"]) == 3
        assert {s["finish_reason"] for s in translation["segments"]} <= {"eos", "length"}
        assert all(s["score"] <= 0 for s in translation["segments"])
        assert translation["text"].count("\n\n") == 1  # the paragraph break survives
        assert len(translation["alternatives"]) == 1
        ready = await client.get("/ready")
        assert ready.status_code == 200


@pytest.mark.anyio
async def test_the_cli_and_http_give_a_text_the_same_translation(eos_bundle: Path) -> None:
    """One text pipeline behind both doors: sentences split, translated and joined alike."""
    lines = [
        "A man rides a bike. Two dogs play in the snow!",
        "",
        "Dr. Smith reads a book. A woman sings.",
        "A child runs.",
    ]
    done = subprocess.run(
        [sys.executable, "-m", "service.translate", "--bundle", str(eos_bundle)]
        + ["--device", "cpu", "--threads", "1", "--beam-size", "2"],
        input="\n".join(lines) + "\n",
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    settings = fast_settings(bundle=[eos_bundle], intra_op_threads=1, device="cpu")
    async with running(create_app(settings)) as client:
        response = await client.post("/translate", json={"text": lines, **EN_DE, "beam_size": 2})
    assert response.status_code == 200, response.text
    translations = response.json()["translations"]
    assert [len(t["segments"]) for t in translations] == [2, 0, 2, 1]
    assert done.stdout.split("\n") == [t["text"] for t in translations] + [""]


@pytest.mark.anyio
async def test_the_model_limit_is_the_bundles(eos_engine: Engine) -> None:
    async with running(create_app(fast_settings(), models=[eos_engine])) as client:
        limit = eos_engine.max_input_tokens
        response = await client.post(
            "/translate", json={"text": " ".join(["dog"] * (limit + 5)), **EN_DE}
        )
        assert response.status_code == 422
        error = response.json()["error"]
        assert error["type"] == "input_too_long" and f"limit of {limit} tokens" in error["message"]
        response = await client.post(
            "/libretranslate/translate", json={"q": "A dog.", "source": "auto", "target": "de"}
        )
        assert response.status_code == 200 and isinstance(response.json()["translatedText"], str)


def test_any_unicode_text_gets_an_answer(eos_engine: Engine) -> None:
    app = create_app(fast_settings(), models=[eos_engine])
    with TestClient(app) as client:

        @settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
        @given(texts=st.lists(st.text(max_size=60), max_size=3), form=st.text(max_size=40))
        def check(texts: list[str], form: str) -> None:
            response = client.post("/translate", json={"text": texts, **EN_DE})
            assert response.status_code in (200, 422), response.text
            if response.status_code == 200:
                assert len(response.json()["translations"]) == len(texts)
            else:
                assert response.json()["error"]["type"] == "input_too_long"
            response = client.post("/libretranslate/translate", data={"q": form, **EN_DE})
            assert response.status_code in (200, 400), response.text

        check()


def test_openapi_schema_fuzzing_finds_no_server_error(eos_engine: Engine) -> None:
    """Valid cases for every operation and invalid ones for those with a body, through the
    ASGI transport: no 5xx, whatever arrives."""
    app = create_app(fast_settings(max_texts=8), models=[eos_engine])
    schema = schemathesis.openapi.from_asgi("/openapi.json", app)
    calls: Counter[str] = Counter()
    try:
        for result in schema.get_all_operations():
            operation = result.ok()
            _fuzz(operation, schemathesis.GenerationMode.POSITIVE, calls)
            if operation.method.upper() == "POST":
                _fuzz(operation, schemathesis.GenerationMode.NEGATIVE, calls)
    finally:
        shutdown_lifespans()
    assert calls["POST /translate"] >= 2 * EXAMPLES_PER_MODE, calls
    # Every operation with a body got its cases (one without has only a few distinct ones).
    posts = {op: n for op, n in calls.items() if op.startswith("POST ")}
    assert all(n >= OTHER_EXAMPLES_PER_MODE for n in posts.values()), calls


def _fuzz(
    operation: schemathesis.APIOperation,
    mode: schemathesis.GenerationMode,
    calls: Counter[str],
) -> None:
    core = operation.label == "POST /translate"

    @settings(
        max_examples=EXAMPLES_PER_MODE if core else OTHER_EXAMPLES_PER_MODE,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(
        case=operation.as_strategy(generation_mode=mode),
        source=st.sampled_from([None, "en", "auto"]),
    )
    def check(case: schemathesis.Case, source: str | None) -> None:
        # Random language codes are all unknown: two times in three use the served pair, or
        # detect the source, so that cases get past validation into detection, segmentation,
        # batching and the engine.
        if source is not None and isinstance(case.body, dict):
            case.body.update({**EN_DE, "source": source})
        calls[operation.label] += 1
        case.call_and_validate(checks=[not_a_server_error])

    check()
