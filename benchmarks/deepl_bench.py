"""What DeepL's API costs over the native one: the same sentence sent to `/translate` (JSON) and
to `/v2/translate` as DeepL's clients send it (the Python client's JSON body, the Node client's
form body), over HTTP to one `python -m service`, the three kinds in turn, one request at a time.

    python -m benchmarks.deepl_bench --bundle bundles/multi30k-en-de [--requests 300]
        [--threads 1] [--text SENTENCE] [--json OUT]

Prints each kind's p50/p90 and its p50 over the native one's (issue 57's goal: within 1.05x).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from benchmarks.servers import DEFAULT_TEXTS, percentile_ms, service


def requests_for(text: str) -> dict[str, dict[str, Any]]:
    """Each kind's path and body, for the same text from English into German."""
    return {
        "native": {"url": "/translate", "json": {"text": text, "source": "en", "target": "de"}},
        "deepl_json": {
            "url": "/v2/translate",
            "json": {
                "text": [text],
                "source_lang": "EN",
                "target_lang": "DE",
                "show_billed_characters": True,
            },
        },
        "deepl_form": {
            "url": "/v2/translate",
            "data": {
                "text": text,
                "source_lang": "en",
                "target_lang": "de",
                "show_billed_characters": "1",
            },
        },
    }


def latency(bundle: Path, requests: int, threads: int, text: str) -> dict[str, Any]:
    kinds = requests_for(text)
    times: dict[str, list[float]] = {kind: [] for kind in kinds}
    flags = ["--intra-op-threads", str(threads)]
    with service(bundle, flags) as running, httpx.Client(base_url=running.url) as client:
        for _ in range(10):  # warm-up: sessions, caches, the first shapes
            for request in kinds.values():
                client.post(**request, timeout=60).raise_for_status()
        for _ in range(requests):
            for kind, request in kinds.items():
                start = time.perf_counter()
                client.post(**request, timeout=60).raise_for_status()
                times[kind].append(time.perf_counter() - start)
    result: dict[str, Any] = {
        kind: {"p50_ms": percentile_ms(values, 50), "p90_ms": percentile_ms(values, 90)}
        for kind, values in times.items()
    }
    native = result["native"]["p50_ms"]
    for kind in ("deepl_json", "deepl_form"):
        result[kind]["p50_over_native"] = round(result[kind]["p50_ms"] / native, 3)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bundle", type=Path, required=True)
    parser.add_argument("--requests", type=int, default=300, help="of each kind")
    parser.add_argument("--threads", type=int, default=1, help="the server's intra-op threads")
    parser.add_argument("--text", default=DEFAULT_TEXTS[0])
    parser.add_argument("--json", type=Path, help="also write the result here")
    args = parser.parse_args(argv)
    result = latency(args.bundle, args.requests, args.threads, args.text)
    print(json.dumps(result, indent=2))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
