"""What the HTTP layer's protection costs: the service on its own protocol (uvicorn's httptools
protocol with the limits of service/http/connections.py) against uvicorn's plain httptools protocol
(no limits) and uvicorn's h11 protocol (the pure-Python parser, which has a head size limit of
its own), the same app and settings, driven by wrk on 127.0.0.1.

    python -m benchmarks.http_parser_bench --bundle bundles/multi30k-en-de [--duration 8] \\
        [--rounds 2]

Measured: GET /health (nothing but HTTP: the protocol's share is largest there) at 64
connections, and POST /translate of one short sentence at beam 1 with 1 and 32 connections. The
servers take turns, `--rounds` times, and each cell is the median. Needs wrk (Debian: apt-get
install wrk).
"""

from __future__ import annotations

import argparse
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from benchmarks.servers import (
    DEFAULT_TEXTS,
    HOST,
    Running,
    free_port,
    wait_until_ready,
    wrk_percentile_ms,
)

# uvicorn's protocols by name, and the service's ("guarded").
PARSERS = ("httptools", "guarded", "h11")
# (name, path, connections, wrk script or None)
LOADS = (
    ("GET /health", "/health", 64, None),
    ("POST /translate", "/translate", 1, "post"),
    ("POST /translate", "/translate", 32, "post"),
)
_POST = """wrk.method = "POST"
wrk.body = '{"text": "%s", "source": "en", "target": "de", "beam_size": 1}'
wrk.headers["Content-Type"] = "application/json"
"""


def serve(parser: str, bundle: Path, port: int) -> None:
    """The service as `python -m service` runs it ("guarded"), or on uvicorn's `parser`."""
    import uvicorn

    from service.http.app import create_app
    from service.http.server import uvicorn_config
    from service.settings import Settings

    settings = Settings(
        bundle=[bundle],
        host=HOST,
        port=port,
        log_level="warning",
        intra_op_threads=1,
        cache=False,  # one request again and again: time the model, not the cache
    )
    config = uvicorn_config(create_app(settings), settings)
    if parser != "guarded":
        config.http = parser  # uvicorn's own protocol: none of our limits
    uvicorn.Server(config).run()


def wrk(url: str, connections: int, seconds: float, script: Path | None) -> tuple[float, float]:
    """Requests per second and p50 latency in ms."""
    command = ["wrk", "-t1", f"-c{connections}", f"-d{seconds:g}s", "--latency"]
    if script is not None:
        command += ["-s", str(script)]
    out = subprocess.run([*command, url], capture_output=True, text=True, check=True).stdout
    rate = re.search(r"Requests/sec:\s*([\d.]+)", out)
    p50 = wrk_percentile_ms(out, 50)
    errors = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    if rate is None or p50 is None or errors is not None:
        raise RuntimeError(f"wrk: no rate, no p50 or errors:\n{out}")
    return float(rate.group(1)), p50


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.http_parser_bench")
    p.add_argument("--bundle", type=Path, required=True)
    p.add_argument("--duration", type=float, default=8.0, help="seconds per wrk run")
    p.add_argument("--rounds", type=int, default=2, help="turns of each server per load")
    p.add_argument("--serve", choices=PARSERS, help=argparse.SUPPRESS)  # the server process
    p.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.serve:
        serve(args.serve, args.bundle, args.port)
        return 0
    if shutil.which("wrk") is None:
        print("wrk not found (Debian: apt-get install wrk)", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "post.lua"
        script.write_text(_POST % DEFAULT_TEXTS[0], encoding="utf-8")
        results: dict[tuple[int, str], list[tuple[float, float]]] = {}
        for _ in range(args.rounds):
            for parser in PARSERS:
                port = free_port()
                command = [sys.executable, "-m", "benchmarks.http_parser_bench", "--serve",
                           parser, "--bundle", str(args.bundle), "--port", str(port)]  # fmt: skip
                process = subprocess.Popen(command)
                running = Running(port, process)
                try:
                    wait_until_ready(running.url, process)
                    for i, (_, path, connections, kind) in enumerate(LOADS):
                        wrk(running.url + path, connections, 1, script if kind else None)
                        measured = wrk(
                            running.url + path, connections, args.duration, script if kind else None
                        )
                        results.setdefault((i, parser), []).append(measured)
                finally:
                    process.terminate()
                    process.wait(30)
    print(f"{'load':<20}{'conns':>6}" + "".join(f"{p + ' req/s':>17}{'p50 ms':>8}" for p in PARSERS)
          + "".join(f"{p + '/httptools':>18}" for p in PARSERS[1:]))  # fmt: skip
    for i, (name, _, connections, _) in enumerate(LOADS):
        rate = {p: statistics.median(r for r, _ in results[(i, p)]) for p in PARSERS}
        p50 = {p: statistics.median(m for _, m in results[(i, p)]) for p in PARSERS}
        cells = "".join(f"{rate[p]:>17.0f}{p50[p]:>8.2f}" for p in PARSERS)
        ratios = "".join(f"{rate[p] / rate['httptools']:>17.2f}x" for p in PARSERS[1:])
        print(f"{name:<20}{connections:>6}{cells}{ratios}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
