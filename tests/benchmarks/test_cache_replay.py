"""benchmarks.cache_replay's load and its counts, against the service over the fake model in a
uvicorn thread: the Zipf draw, the paragraphs, and a replay whose sentences decoded are the
load's distinct ones."""

from __future__ import annotations

import asyncio
import os
import shutil
from collections import Counter
from collections.abc import Iterator

import numpy as np
import pytest

from benchmarks.cache_replay import CPU_PARTS, paragraphs, replay, zipf_sequence
from service.http.app import create_app
from tests.service.helpers import FakeModel, fast_settings, uvicorn_thread


def test_the_draw_follows_zipfs_law_and_paragraphs_keep_every_sentence_once() -> None:
    rng = np.random.default_rng(0)
    drawn = Counter(zipf_sequence(100, 20_000, 1.1, rng))
    # P(rank 1) / P(rank 2) = 2 ** 1.1 = 2.14; rank 1 is index 0.
    assert 1.9 < drawn[0] / drawn[1] < 2.4 and drawn[0] > drawn[9] > drawn[99]
    sentences = [f"Sentence {i}." for i in range(50)]
    grouped = paragraphs(sentences, rng)
    assert " ".join(grouped) == " ".join(sentences)
    assert all(1 <= p.count(".") <= 3 for p in grouped)


@pytest.fixture
def fake_server() -> Iterator[str]:
    with uvicorn_thread(create_app(fast_settings(), models=[FakeModel()])) as url:
        yield url


@pytest.mark.skipif(shutil.which("wrk") is None, reason="needs wrk (apt-get install wrk)")
def test_a_replay_decodes_each_distinct_sentence_once(fake_server: str) -> None:
    """...the warm-up's sentences not counted, every body of the load sent once (wrk), and the
    CPU of every part measured (here one process is the server)."""
    bodies = ["One. Two.", "Two. Three.", "One. Two.", "Four.", "One. Two."] * 4
    pids = {"replicas": [os.getpid()], "nginx": [], "redis": []}
    warm_up = ["Five. Six.", "Seven."] * 3
    run = asyncio.run(
        replay(fake_server, bodies, clients=6, probes=bodies[:3], warm_up=warm_up, pids=pids)
    )
    assert (run.answered, run.failed) == (20, 0)
    assert set(run.cpu_ms) == set(CPU_PARTS) and run.cpu_ms["loops"] > 0 < run.cpu_ms["load"]
    assert run.cpu_ms["nginx"] == run.cpu_ms["redis"] == 0
    sentences = 2 * 12 + 2 * 4 + 4  # 36, of 4 distinct ones: One, Two, Three, Four
    assert run.misses == 4 and run.hits + run.joined == sentences - 4
    assert run.hit_rate == round(32 / 36, 3) and run.cached_p50_ms > 0
