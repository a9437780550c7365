"""benchmarks.load_bench against a server that refuses some requests: an overloaded server's
refusals, in the warm-up too, are reported in the level's errors, and the level goes on."""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Iterator

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from benchmarks.load_bench import _run_level, _shares
from tests.service.helpers import uvicorn_thread


def overloaded_app(refuse_first: int) -> Starlette:
    """The first `refuse_first` translations get 503 (as a server past its deadlines answers),
    the rest 200; /metrics reports one batch per answered request."""
    answered = 0
    calls = 0

    async def translate(request: Request) -> Response:
        nonlocal answered, calls
        calls += 1
        if calls <= refuse_first:
            error = {"type": "deadline_exceeded", "message": "retry later"}
            return JSONResponse({"error": error}, status_code=503, headers={"Retry-After": "1"})
        answered += 1
        return JSONResponse({"translations": [{"text": "x"}]})

    async def metrics(request: Request) -> Response:
        return PlainTextResponse(
            "# TYPE mt_batch_size_segments histogram\n"
            f"mt_batch_size_segments_count {answered}\nmt_batch_size_segments_sum {answered}\n"
        )

    return Starlette(
        routes=[Route("/translate", translate, methods=["POST"]), Route("/metrics", metrics)]
    )


@pytest.fixture
def refusing_server() -> Iterator[str]:
    with uvicorn_thread(overloaded_app(refuse_first=5)) as url:
        yield url


def test_refused_warm_up_requests_are_reported_and_the_level_goes_on(refusing_server: str) -> None:
    args = argparse.Namespace(
        beam_size=1, warmup_requests=2, duration=30.0, max_requests=20, client_processes=1
    )  # 4 clients x 2 warm-up requests: 5 of them refused
    result = asyncio.run(
        _run_level(refusing_server, "test", 4, ["A dog."], {"source": "en", "target": "de"}, args)
    )
    assert result.errors == {"warm-up 503": 5}
    assert result.requests == 20  # the measured ones, all answered
    assert result.requests_per_s > 0 and result.mean_batch_size == 1.0


def test_clients_spread_over_processes_add_up(refusing_server: str) -> None:
    """Four clients in two processes: every measured request counted once, the warm-up's
    refusals with them, whichever process met them."""
    args = argparse.Namespace(
        beam_size=1, warmup_requests=2, duration=30.0, max_requests=21, client_processes=2
    )
    result = asyncio.run(
        _run_level(refusing_server, "test", 4, ["A dog."], {"source": "en", "target": "de"}, args)
    )
    assert result.errors == {"warm-up 503": 5}
    assert result.requests == 21  # 11 + 10
    assert result.requests_per_s > 0 and result.mean_batch_size == 1.0
    assert _shares(21, 2) == [11, 10] and _shares(3, 3) == [1, 1, 1]
