"""benchmarks.nginx_reload against this machine's nginx: clients on kept-alive connections
through reloads, every request counted once; keepalive_min_timeout where this nginx has it,
refused where it does not."""

from __future__ import annotations

import pytest

from benchmarks.nginx_reload import nginx_version, parse_version, run
from benchmarks.servers import nginx_binary

NGINX = nginx_binary()
needs_nginx = pytest.mark.skipif(NGINX is None, reason="needs nginx (apt-get install nginx)")


def test_the_version_is_read_from_what_nginx_v_says() -> None:
    assert parse_version("nginx version: nginx/1.22.1\n") == (1, 22, 1)
    assert parse_version("nginx version: nginx/1.24.0 (Ubuntu)\n") == (1, 24, 0)
    with pytest.raises(ValueError, match="no nginx version"):
        parse_version("sh: nginx: not found")


@needs_nginx
def test_clients_are_counted_through_reloads() -> None:
    assert NGINX is not None
    report = run(NGINX, "", "", clients=4, seconds=3, every=0.2)
    assert report["reloads"] >= 5
    outcomes = report["outcomes"]
    assert report["answered"] == outcomes["200"] > 100
    # What a reload can do to a request: no answer on a connection it closed, nothing else.
    assert set(outcomes) <= {"200", "ReadError", "RemoteProtocolError", "WriteError"}
    assert report["failed"] == sum(outcomes.values()) - outcomes["200"]


@needs_nginx
def test_keepalive_min_timeout_keeps_every_request_or_is_refused() -> None:
    """With it (nginx 1.27.4 and later) a reload loses nothing; an older nginx refuses it at
    start (why the committed conf leaves it to docker-compose.yml's check)."""
    assert NGINX is not None
    if nginx_version(NGINX) >= (1, 27, 4):
        report = run(NGINX, "", "1s", clients=4, seconds=3, every=0.2)
        assert report["reloads"] >= 5 and report["failed"] == 0
    else:
        with pytest.raises(RuntimeError, match='unknown directive "keepalive_min_timeout"'):
            run(NGINX, "", "1s", clients=1, seconds=0.5, every=0.2)
