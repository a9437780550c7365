"""benchmarks.soak: a few thousand requests of the mix, pooled and one connection per client,
directly and through nginx (deploy/nginx/transformer-mt.conf), lose nothing."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from benchmarks.servers import DEFAULT_TEXTS, nginx_binary
from benchmarks.soak import Connections, Library, Report, main, request_body, rss_summary, soak
from tests.service.helpers import ServerProcess, server_process

REQUESTS = 2000


@pytest.fixture(scope="module")
def server(eos_bundle: Path) -> Iterator[ServerProcess]:
    with server_process(["--bundle", str(eos_bundle), "--intra-op-threads", "1"]) as running:
        yield running


def test_the_mix() -> None:
    kinds = [request_body(i, DEFAULT_TEXTS, ("en", "de")) for i in range(600)]
    assert Counter(kind for kind, _ in kinds) == {"short": 300, "beam": 200, "long": 100}
    for kind, body in kinds[:6]:
        assert (body["source"], body["target"]) == ("en", "de")
        assert body["beam_size"] == (4 if kind == "beam" else 1)
    long_text = next(str(body["text"]) for kind, body in kinds if kind == "long")
    first, second = long_text.split("\n\n")
    assert first.count(". ") == 2 and second.count(". ") == 1 and long_text.endswith(".")


def test_rss_growth_compares_the_first_and_last_tenth() -> None:
    report = Report(1, 1, "pooled", "direct")
    mib = [100.0, 110.0, *[300.0] * 16, 120.0, 130.0]  # a peak in between is not growth
    report.rss = [(float(i), i, value) for i, value in enumerate(mib)]
    rss_summary(report)
    assert (report.rss_warm_mib, report.rss_end_mib, report.rss_max_mib) == (105.0, 125.0, 300.0)
    assert report.rss_growth_pct == 19.0


@pytest.mark.parametrize(
    ("connections", "client"), [("pooled", "httpx2"), ("per-client", "httpx2"), ("pooled", "httpx")]
)
def test_a_soak_loses_nothing(
    server: ServerProcess, connections: Connections, client: Library
) -> None:
    report = asyncio.run(
        soak(
            server.url,
            requests=REQUESTS,
            clients=64,
            connections=connections,
            texts=DEFAULT_TEXTS,
            client=client,
            server_pid=server.process.pid,
            warmup=200,
            rss_every=1.0,
        )
    )
    assert (report.client, report.lost) == (client, {})
    assert report.statuses == {"200": REQUESTS}
    assert report.server_answered == REQUESTS  # the server answered what the clients counted
    assert report.by_kind["long"]["answered"] == REQUESTS // 6
    assert report.rss_warm_mib is not None and report.rss_end_mib is not None


@pytest.mark.skipif(nginx_binary() is None, reason="nginx not installed (apt-get install nginx)")
def test_the_benchmark_through_nginx_loses_nothing(eos_bundle: Path, tmp_path: Path) -> None:
    out = tmp_path / "soak.json"
    argv = [
        "--bundle", str(eos_bundle), "--requests", str(REQUESTS), "--clients", "64",
        "--connections", "per-client", "--via", "nginx", "--warmup", "200", "--rss-every", "1",
        "--server-args", "--intra-op-threads 1", "--max-rss-growth", "100", "--json", str(out),
    ]  # fmt: skip
    assert main(argv) == 0
    report = json.loads(out.read_text())
    assert report["via"] == "nginx" and report["lost"] == {}
    assert report["statuses"] == {"200": REQUESTS} and report["server_answered"] == REQUESTS


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--proxy-url", "http://10.0.0.1:8080", "--port", "8000"], "must be on this machine"),
        (["--proxy-url", "http://127.0.0.1:8080"], "needs --port"),
        (["--proxy-url", "http://127.0.0.1:8080", "--port", "1", "--via", "nginx"], "exclude"),
        (["--clients", "0"], "at least 1"),
    ],
)
def test_bad_arguments_are_refused(
    extra: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit:
        main(["--bundle", "b", *extra])
    assert exit.value.code == 2
    assert message in capsys.readouterr().err
