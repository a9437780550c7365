"""benchmarks.nginx_reload against this machine's nginx: clients on kept-alive connections
through reloads, every request counted once; keepalive_min_timeout where this nginx has it,
refused where it does not."""

from __future__ import annotations

import pytest

from benchmarks.nginx_reload import run
from benchmarks.servers import nginx_binary

NGINX = nginx_binary()
pytestmark = pytest.mark.skipif(NGINX is None, reason="needs nginx (apt-get install nginx)")


def version(report: dict[str, object]) -> tuple[int, ...]:
    return tuple(int(part) for part in str(report["nginx"]).split("."))


def test_clients_are_counted_through_reloads() -> None:
    assert NGINX is not None
    report = run(NGINX, "", "", clients=4, seconds=3, every=0.2)
    assert report["reloads"] >= 10
    outcomes = report["outcomes"]
    assert report["answered"] == outcomes["200"] > 100
    # What a reload can do to a request: no answer on a connection it closed, nothing else.
    assert set(outcomes) <= {"200", "ReadError", "RemoteProtocolError", "WriteError"}
    assert report["failed"] == sum(outcomes.values()) - outcomes["200"]


def test_keepalive_min_timeout_keeps_every_request_or_is_refused() -> None:
    """nginx 1.27.4 and later lose nothing to a reload with it; older nginx refuses it at
    start (why the committed conf leaves it to docker-compose.yml's check)."""
    assert NGINX is not None
    plain = run(NGINX, "", "", clients=1, seconds=0.5, every=0.2)
    if version(plain) >= (1, 27, 4):
        report = run(NGINX, "", "1s", clients=4, seconds=3, every=0.2)
        assert report["reloads"] >= 10 and report["failed"] == 0
    else:
        with pytest.raises(RuntimeError, match='unknown directive "keepalive_min_timeout"'):
            run(NGINX, "", "1s", clients=1, seconds=0.5, every=0.2)
