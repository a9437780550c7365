"""deploy/nginx/transformer-mt.conf: its timeouts and limits agree with the service's settings
and the deployment files (the keep-alive rule, the body limit, the read timeout), and a real
nginx runs it in front of a real service (benchmarks/servers.py starts it on loopback)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from benchmarks.servers import NGINX_CONF, Running, nginx, nginx_binary
from service.settings import Settings
from tests.deploy.helpers import REPO, k8s_objects, load_yaml
from tests.service.helpers import server_process

Block = dict[str, Any]  # directive name -> list of argument lists; "{name}" -> child blocks


def parse(text: str) -> Block:
    """nginx's configuration syntax, enough for this file: directives and nested blocks."""
    tokens = re.findall(r'"[^"]*"|[{};]|[^\s{};]+', re.sub(r"#.*", "", text))
    stack: list[Block] = [{}]
    words: list[str] = []
    for token in tokens:
        if token == ";":
            stack[-1].setdefault(words[0], []).append(words[1:])
            words = []
        elif token == "{":
            child: Block = {}
            stack[-1].setdefault("{" + words[0] + "}", []).append(child)
            stack.append(child)
            words = []
        elif token == "}":
            stack.pop()
        else:
            words.append(token)
    assert len(stack) == 1 and not words, "unbalanced braces or a missing ';'"
    return stack[0]


def seconds(value: str) -> float:
    match = re.fullmatch(r"(\d+)(ms|s|m)?", value)
    assert match, value
    return int(match[1]) * {"ms": 0.001, "s": 1, "m": 60, None: 1}[match[2]]


def size(value: str) -> int:
    match = re.fullmatch(r"(\d+)([kKmM])?", value)
    assert match, value
    return int(match[1]) * {"k": 1024, "m": 1 << 20, None: 1}[match[2] and match[2].lower()]


@pytest.fixture(scope="module")
def conf() -> Block:
    return parse(NGINX_CONF.read_text())


def one(block: Block, name: str) -> list[str]:
    (args,) = block[name]
    return args  # type: ignore[no-any-return]


def keep_alive_values() -> dict[str, int]:
    """MT_KEEP_ALIVE_TIMEOUT_S in the service's defaults, the Deployment and the compose stack."""
    (server,) = k8s_objects()["Deployment"]["spec"]["template"]["spec"]["containers"]
    (compose,) = load_yaml(REPO / "docker-compose.yml")
    return {
        "default": Settings().keep_alive_timeout_s,
        "k8s": int({e["name"]: e.get("value") for e in server["env"]}["MT_KEEP_ALIVE_TIMEOUT_S"]),
        "compose": int(compose["services"]["mt"]["environment"]["MT_KEEP_ALIVE_TIMEOUT_S"]),
    }


def test_nginx_closes_idle_upstream_connections_before_the_service(conf: Block) -> None:
    (upstream,) = conf["{upstream}"]
    assert upstream["keepalive"], "no upstream keep-alive"
    idle = seconds(one(upstream, "keepalive_timeout")[0])
    values = keep_alive_values()
    assert len(set(values.values())) == 1, values  # one value everywhere
    assert all(idle < value for value in values.values()), (idle, values)
    (server,) = conf["{server}"]
    (location,) = server["{location}"]
    # Upstream keep-alive needs HTTP/1.1 and the client's Connection header dropped.
    assert one(location, "proxy_http_version") == ["1.1"]
    assert ["Connection", '""'] in location["proxy_set_header"]


def test_body_limit_and_read_timeout_fit_the_service(conf: Block) -> None:
    (server,) = conf["{server}"]
    (location,) = server["{location}"]
    settings = Settings()
    assert size(one(server, "client_max_body_size")[0]) == settings.max_body_bytes
    assert seconds(one(location, "proxy_read_timeout")[0]) > settings.request_timeout_s
    forwarded = {args[0] for args in location["proxy_set_header"]}
    assert {"Host", "X-Forwarded-For", "X-Forwarded-Proto"} <= forwarded


@pytest.fixture(scope="module")
def proxy(eos_bundle: Path) -> Iterator[Running]:
    if nginx_binary() is None:
        pytest.skip("nginx not installed (apt-get install nginx)")
    args = ["--bundle", str(eos_bundle), "--intra-op-threads", "1", "--default-beam-size", "1"]
    with server_process(args) as server, nginx(server.port) as running:
        yield running


def test_through_nginx_the_body_limit_is_the_services(proxy: Running) -> None:
    request = b'{"text": "A dog runs.", "source": "en", "target": "de"}'
    limit = Settings().max_body_bytes
    headers = {"Content-Type": "application/json"}
    # Whitespace after the JSON value: a valid request of exactly the limit.
    at_limit = request + b" " * (limit - len(request))
    response = httpx.post(f"{proxy.url}/translate", content=at_limit, headers=headers, timeout=30)
    assert response.status_code == 200, response.text
    over = at_limit + b" "
    response = httpx.post(f"{proxy.url}/translate", content=over, headers=headers, timeout=30)
    assert response.status_code == 413
    # nginx's own page (the service answers JSON): refused before reaching the service.
    assert response.headers["content-type"].startswith("text/html"), response.text
