"""A document beside interactive requests: a docx of Multi30k test sentences (three to a
paragraph, 1-3 words of every other paragraph bold: --bold-every) through POST /documents,
while one client sends one-sentence POST /translate requests one after another.

Reports (a service of its own for each --document-batch-size):
- `translate_p50_ms` alone (before and after) and while the document runs, and their ratio
  (goal: <= 1.5);
- the document's sentences per second alone, against the same paragraphs' text sent as one
  plain POST /translate (goal: >= 0.9x), and against them as one HTML request (the bold runs
  as `<b>`: what the formatting itself costs, the aligner on the sentences that hold a run);
  the document's time is the client's, from its POST to the status poll that sees it done
  (`--poll-s`, 0.5 s as the web page polls), and, as `throughput_ratio_in_service`, the
  service's own from the job's start to its end (reading the docx, translating, writing the
  result; mt_document_translation_seconds): its throughput, which the client's polls only round
  up.

    python -m benchmarks.document_bench --bundle bundles/multi30k-en-de [--paragraphs 300]
        [--document-batch-size 32 96] [--scheduler batch] [--repeat 3] [--json out.json]
        [--server-args "--max-batch-size 96"]
"""

from __future__ import annotations

import argparse
import io
import json
import random
import shlex
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from html import escape
from pathlib import Path
from typing import Any, TypeVar

import docx
import httpx

from benchmarks.paths import MULTI30K
from benchmarks.servers import metric, percentile_ms, read_texts, service
from service.settings import Settings

TEST_2016 = MULTI30K / "test_2016_flickr.en.gz"
EN_DE = {"source": "en", "target": "de"}
PROBE = "A man in a blue shirt is riding a bike."
T = TypeVar("T")


def make_docx(
    sentences: list[str], paragraphs: int, seed: int = 0, bold_every: int = 2
) -> tuple[bytes, list[str], list[str]]:
    """The document, its paragraphs' text, and the same paragraphs as HTML (the bold run a
    `<b>`): 1-3 words of every `bold_every`-th paragraph bold (0: none)."""
    rng = random.Random(seed)
    document = docx.Document()
    texts, markup = [], []
    for i in range(paragraphs):
        text = " ".join(sentences[(3 * i + k) % len(sentences)] for k in range(3))
        words = text.split(" ")
        paragraph = document.add_paragraph()
        if bold_every and i % bold_every == bold_every - 1:
            start = rng.randrange(len(words) - 3)
            end = start + rng.randint(1, 3)
            before, bold = " ".join(words[:start]) + " ", " ".join(words[start:end])
            after = " " + " ".join(words[end:])
            paragraph.add_run(before)
            paragraph.add_run(bold).bold = True
            paragraph.add_run(after)
            markup.append(f"<p>{escape(before)}<b>{escape(bold)}</b>{escape(after)}</p>")
        else:
            paragraph.add_run(text)
            markup.append(f"<p>{escape(text)}</p>")
        texts.append(text)
    out = io.BytesIO()
    document.save(out)
    return out.getvalue(), texts, markup


def probe(client: httpx.Client, stop: threading.Event, times: list[float]) -> None:
    while not stop.is_set():
        start = time.perf_counter()
        client.post("/translate", json={"text": PROBE, **EN_DE}, timeout=60).raise_for_status()
        times.append(time.perf_counter() - start)


def probing(client: httpx.Client, times: list[float], during: Callable[[], T]) -> T:
    """`during()`'s answer, one-sentence requests timed into `times` one after another
    meanwhile."""
    stop = threading.Event()
    thread = threading.Thread(target=probe, args=(client, stop, times))
    thread.start()
    try:
        return during()
    finally:
        stop.set()
        thread.join()


def translate_document(
    client: httpx.Client, data: bytes, poll_s: float = 0.5
) -> tuple[float, float, int]:
    """Seconds from POST to done as the client saw them (a status poll every `poll_s`), seconds
    the service took from the job's start to its end (reading the file, translating, writing
    the result: mt_document_translation_seconds), and the sentences it counted."""
    spent = _translation_seconds(client)
    start = time.perf_counter()
    response = client.post(
        "/documents", files={"file": ("bench.docx", data)}, data=EN_DE, timeout=120
    )
    response.raise_for_status()
    status = finished(client, response.json()["id"], poll_s)
    seconds = time.perf_counter() - start
    assert status["status"] == "done", status
    return seconds, _translation_seconds(client) - spent, int(status["progress"]["total"])


def _translation_seconds(client: httpx.Client) -> float:
    text = client.get("/metrics").text
    return metric(text, "mt_document_translation_seconds_sum", format="docx")


def finished(client: httpx.Client, id: str, every_s: float) -> dict[str, Any]:
    """Document `id`'s status once it is done or failed (asked every `every_s`)."""
    while (status := client.get(f"/documents/{id}", timeout=60).json())["status"] not in (
        "done",
        "error",
    ):
        time.sleep(every_s)
    return dict(status)


def measure(
    bundle: Path,
    data: bytes,
    texts: list[str],
    markup: list[str],
    batch_size: int,
    args: argparse.Namespace,
) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as jobs:
        flags = [
            "--intra-op-threads", str(args.threads), "--scheduler", args.scheduler,
            "--documents-dir", jobs, "--document-batch-size", str(batch_size),
            "--max-texts", str(len(texts)), "--max-characters", "10000000",
            "--max-queue-segments", str(10 * len(texts)), "--request-timeout-s", "600",
            "--no-cache",  # each run decodes every sentence (they repeat between phases)
            *shlex.split(args.server_args),
        ]  # fmt: skip
        with service(bundle, flags) as running, httpx.Client(base_url=running.url) as client:
            for _ in range(10):
                client.post("/translate", json={"text": PROBE, **EN_DE}).raise_for_status()
            alone: list[float] = []
            probing(client, alone, lambda: time.sleep(args.probe_s))
            # Alone, alternately, `repeat` times each: medians (the machine's pace moves). The
            # document against its paragraphs' text as one request, and against the same
            # paragraphs as one HTML request (the formatting's own work, bold run and all).
            plains, htmls, documents, in_service = [], [], [], []
            for _ in range(args.repeat):
                start = time.perf_counter()
                plain = client.post("/translate", json={"text": texts, **EN_DE}, timeout=600)
                plain.raise_for_status()
                plains.append(time.perf_counter() - start)
                sentences = sum(len(t["segments"]) for t in plain.json()["translations"])
                start = time.perf_counter()
                body = {"text": markup, "format": "html", **EN_DE}
                client.post("/translate", json=body, timeout=600).raise_for_status()
                htmls.append(time.perf_counter() - start)
                document_s, service_s, counted = translate_document(client, data, args.poll_s)
                documents.append(document_s)
                in_service.append(service_s)
            plain_s, document_s = statistics.median(plains), statistics.median(documents)
            service_s = statistics.median(in_service)
            html_s = statistics.median(htmls)
            loaded: list[float] = []
            loaded_document_s, _, _ = probing(
                client, loaded, lambda: translate_document(client, data, args.poll_s)
            )
            # Alone again right after: on a shared machine the load moves between phases.
            probing(client, alone, lambda: time.sleep(args.probe_s))
    p50_alone, p50_loaded = percentile_ms(alone, 50), percentile_ms(loaded, 50)
    return {
        "document_batch_size": batch_size,
        "sentences": sentences,
        "document_sentences_counted": counted,
        "translate_p50_ms_alone": p50_alone,
        "translate_p50_ms_under_document": p50_loaded,
        "translate_p90_ms_under_document": percentile_ms(loaded, 90),
        "p50_ratio": round(p50_loaded / p50_alone, 2),
        "probes_under_document": len(loaded),
        "plain_sentences_per_s": round(sentences / plain_s, 1),
        "document_sentences_per_s": round(sentences / document_s, 1),
        "throughput_ratio": round(plain_s / document_s, 2),
        "throughput_ratio_to_html": round(html_s / document_s, 2),
        # The same with the document's time as the service measured it (its start to its end)
        "throughput_ratio_in_service": round(plain_s / service_s, 2),
        "html_s_runs": [round(x, 2) for x in htmls],
        "plain_s_runs": [round(x, 2) for x in plains],
        "document_s_runs": [round(x, 2) for x in documents],
        "document_s_in_service_runs": [round(x, 2) for x in in_service],
        "document_s_under_probes": round(loaded_document_s, 1),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.document_bench", description=__doc__)
    p.add_argument("--bundle", type=Path, required=True)
    p.add_argument("--paragraphs", type=int, default=300, help="of three sentences each")
    p.add_argument(
        "--document-batch-size",
        type=int,
        nargs="+",
        default=[Settings.model_fields["document_batch_size"].default],
        help="a service for each (default: the service's own)",
    )
    p.add_argument("--scheduler", choices=("batch", "step"), default="batch")
    p.add_argument("--threads", type=int, default=2, help="ONNX Runtime intra-op threads")
    p.add_argument("--probe-s", type=float, default=10.0, help="unloaded probing time")
    p.add_argument(
        "--bold-every", type=int, default=2, help="a bold run in every N-th paragraph (0: none)"
    )
    p.add_argument("--repeat", type=int, default=3, help="plain and document runs alone, each")
    p.add_argument(
        "--poll-s",
        type=float,
        default=0.5,
        help="a document's status asked every POLL_S (the web page's pace; DeepL's client: 5 s)",
    )
    p.add_argument("--server-args", default="", help="more flags for python -m service")
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    sentences = read_texts(TEST_2016 if TEST_2016.exists() else None)
    data, texts, markup = make_docx(sentences, args.paragraphs, bold_every=args.bold_every)
    results = [
        measure(args.bundle, data, texts, markup, size, args) for size in args.document_batch_size
    ]
    report = {
        "paragraphs": args.paragraphs,
        "bold_every": args.bold_every,
        "scheduler": args.scheduler,
        "server_args": args.server_args,
        "runs": results,
    }
    print(json.dumps(report, indent=2))
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
