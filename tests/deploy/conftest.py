"""Fixtures of the deployment-file tests: the parsed Dockerfile and the metrics a real
`python -m service` exports. Helpers live in tests/deploy/helpers.py (imported by module path;
a bare `from conftest import` would be ambiguous with several test folders)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.deploy.helpers import Exported, Stage, parse_dockerfile
from tests.service.helpers import server_process


@pytest.fixture(scope="session")
def stages() -> dict[str, Stage]:
    parsed = parse_dockerfile()
    return {stage.name or str(i): stage for i, stage in enumerate(parsed)}


@pytest.fixture(scope="session")
def exported_metrics(eos_bundle: Path) -> Iterator[Exported]:
    """/metrics of a real `python -m service` on the tiny eos bundle, after one translation, one
    rejected request (422) and one unknown path (404), so labelled series have samples."""
    args = ["--bundle", str(eos_bundle), "--intra-op-threads", "1", "--default-beam-size", "1"]
    with server_process(args) as server:
        body = {"text": "A man rides a bike.", "source": "en", "target": "de"}
        assert httpx.post(f"{server.url}/translate", json=body, timeout=60).status_code == 200
        bad = {"text": "x", "source": "en", "target": "de", "beam_size": 0}
        assert httpx.post(f"{server.url}/translate", json=bad, timeout=10).status_code == 422
        assert httpx.get(f"{server.url}/nowhere", timeout=10).status_code == 404
        text = httpx.get(f"{server.url}/metrics", timeout=10).text
    families: dict[str, str] = {}
    samples: set[str] = set()
    for family in text_string_to_metric_families(text):
        families[family.name] = family.type
        samples |= {sample.name for sample in family.samples}
    yield Exported(families, samples)
