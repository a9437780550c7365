"""Prometheus metrics in a registry of their own per app, so tests can build several apps.

Labels are bounded: routes are the service's own paths, statuses are HTTP codes, models are the
loaded bundles, reasons are error types; never a client address, key or text.

With several worker processes (`--workers`), prometheus_client's multiprocess mode: each worker
writes its values to files under PROMETHEUS_MULTIPROC_DIR, and a scrape adds them up (gauges
over the live workers; the model info is each model's, not a sum).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
    multiprocess,
)

# Request latency and queue wait (seconds): from a few ms to a minute.
_SECONDS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
# A document's wait and translation (seconds): a second to an hour.
_DOCUMENT_SECONDS = (1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0)
_BATCH_SEGMENTS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
_BATCH_TOKENS = (16, 64, 256, 1024, 4096, 16384, 65536)
# One decoder step (seconds): from a fraction of a ms (one row) to tens of ms (hundreds).
_STEP_SECONDS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25)
_STEP_ROWS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)


class Metrics:
    def __init__(self, *, aggregate: bool = False) -> None:
        """`aggregate`: this process is one of several workers (service/http/workers.py), whose
        values a scrape adds up."""
        self.registry = CollectorRegistry()
        r = self.registry
        # What a scrape renders: this registry, or every worker's values read from their files.
        self._exposed = r
        if aggregate:
            self._exposed = CollectorRegistry()
            multiprocess.MultiProcessCollector(self._exposed)  # type: ignore[no-untyped-call]
        self.requests = Counter(
            "mt_http_requests", "HTTP requests answered", ["route", "status"], registry=r
        )
        self.request_seconds = Histogram(
            "mt_http_request_duration_seconds",
            "Time from request to response",
            ["route"],
            buckets=_SECONDS,
            registry=r,
        )
        self.in_flight = Gauge(
            "mt_in_flight_requests",
            "Translation requests accepted and not yet answered",
            registry=r,
            multiprocess_mode="livesum",
        )
        self.rejected = Counter(
            "mt_rejected_requests",
            "Requests answered with an error, by error type",
            ["reason"],
            registry=r,
        )
        self.queue_wait_seconds = Histogram(
            "mt_queue_wait_seconds",
            "Time a segment waited in the queue before decoding",
            ["model"],
            buckets=_SECONDS,
            registry=r,
        )
        self.engine_seconds = Histogram(
            "mt_engine_seconds",
            "Time of one engine call (one batch)",
            ["model"],
            buckets=_SECONDS,
            registry=r,
        )
        self.batch_segments = Histogram(
            "mt_batch_size_segments",
            "Segments per engine call",
            ["model"],
            buckets=_BATCH_SEGMENTS,
            registry=r,
        )
        self.batch_tokens = Histogram(
            "mt_batch_tokens",
            "Source tokens per engine call",
            ["model"],
            buckets=_BATCH_TOKENS,
            registry=r,
        )
        self.input_tokens = Counter(
            "mt_input_tokens", "Source tokens decoded", ["model"], registry=r
        )
        self.generated_tokens = Counter(
            "mt_generated_tokens",
            "Tokens of the best hypotheses (without </s>)",
            ["model"],
            registry=r,
        )
        self.queue_depth = Gauge(
            "mt_queue_depth_segments",
            "Segments waiting for a batch",
            ["model"],
            registry=r,
            multiprocess_mode="livesum",
        )
        self.dropped = Counter(
            "mt_dropped_segments",
            "Queued segments dropped before decoding: client gone (cancelled) or past the "
            "request deadline (deadline)",
            ["reason"],
            registry=r,
        )
        self.stopped = Counter(
            "mt_stopped_segments",
            "Segments taken out of their batch between decoder steps: past the request "
            "deadline (deadline) or client gone (cancelled)",
            ["model", "reason"],
            registry=r,
        )
        self.cuda_graphs = Gauge(
            "mt_cuda_graphs",
            "Decoder-step shapes captured as CUDA graphs (at most max_cuda_graphs per model and "
            "worker process)",
            ["model"],
            registry=r,
            multiprocess_mode="livesum",
        )
        # Step-level batching (scheduler "step"): the running batches.
        self.running_segments = Gauge(
            "mt_running_segments", "Segments being decoded in the running batches", ["model"],
            registry=r, multiprocess_mode="livesum",
        )  # fmt: skip
        self.slots = Gauge(
            "mt_slots",
            "Sentence slots of the running batches (one batch per beam size), in use or free",
            ["model", "state"],
            registry=r,
            multiprocess_mode="livesum",
        )
        self.cache_bytes = Gauge(
            "mt_cache_bytes",
            "Memory of the running batches' slots: key/value caches and cross keys/values",
            ["model"],
            registry=r,
            multiprocess_mode="livesum",
        )
        self.step_rows = Histogram(
            "mt_step_rows",
            "Decoder rows per step (sentences x beams)",
            ["model"],
            buckets=_STEP_ROWS,
            registry=r,
        )
        self.step_seconds = Histogram(
            "mt_step_seconds",
            "Time of one decoder step of a running batch (step-level batching)",
            ["model"],
            buckets=_STEP_SECONDS,
            registry=r,
        )
        self.first_step_seconds = Histogram(
            "mt_time_to_first_step_seconds",
            "Time from a segment's arrival to the end of its first decoder step",
            ["model"],
            buckets=_SECONDS,
            registry=r,
        )
        self.open_connections = Gauge(
            "mt_open_connections",
            "HTTP connections open (refused ones not counted)",
            registry=r,
            multiprocess_mode="livesum",
        )
        self.closed_connections = Counter(
            "mt_closed_connections",
            "Connections the server closed or refused on its own: evicted (the longest waiting "
            "for its client, to make room for a new one at max_connections), over_limit (a new "
            "one refused: all busy), idle_timeout (nothing sent), header_timeout, body_timeout, "
            "send_timeout (the answer not read), bad_request (e.g. a head over max_header_bytes)",
            ["reason"],
            registry=r,
        )
        self.sentence_cache = Counter(
            "mt_sentence_cache",
            "Sentences looked up in the translation cache: hit (answered from it), miss "
            "(decoded), joined (answered by the decoding of the same sentence for another "
            "request, or earlier in the same one: single flight)",
            ["result"],
            registry=r,
        )
        self.sentence_cache_bytes = Gauge(
            "mt_sentence_cache_bytes",
            "Memory of the in-process translation cache's entries (without redis_url)",
            registry=r,
            multiprocess_mode="livesum",
        )
        self.redis_up = Gauge(
            "mt_redis_up",
            "1 while Redis answers (redis_url), 0 after a failed call until one succeeds",
            registry=r,
            multiprocess_mode="livemin",
        )
        self.redis_errors = Counter(
            "mt_redis_errors",
            "Redis calls that failed or timed out (redis_timeout_s), by operation",
            ["operation"],
            registry=r,
        )
        self.quota_rejections = Counter(
            "mt_quota_rejections",
            "Requests refused by their API key's limits, by limit (requests_per_minute, "
            "characters_per_day, characters_per_month)",
            ["limit"],
            registry=r,
        )
        self.quota_unchecked = Counter(
            "mt_quota_unchecked",
            "Requests whose key's limits could not be counted (Redis failed): served with "
            "quota_fail_open, else refused with 503",
            registry=r,
        )
        self.model_info = Gauge(
            "mt_model_info",
            "Loaded models (value 1)",
            ["model", "source", "target", "provider"],
            registry=r,
            multiprocess_mode="livemax",
        )
        # Documents (service/documents/jobs.py): formats are the registry's names, outcomes
        # done, error (by its type), deleted.
        self.documents = Counter(
            "mt_documents",
            "Documents finished, by format and outcome",
            ["format", "outcome"],
            registry=r,
        )
        self.document_sentences = Counter(
            "mt_document_sentences", "Sentences of documents translated", ["format"], registry=r
        )
        self.document_queue_seconds = Histogram(
            "mt_document_queue_seconds",
            "Time a document waited before its translation started",
            buckets=_DOCUMENT_SECONDS,
            registry=r,
        )
        self.document_seconds = Histogram(
            "mt_document_translation_seconds",
            "Time a document took to translate, read and write included",
            ["format"],
            buckets=_DOCUMENT_SECONDS,
            registry=r,
        )
        self.documents_kept = Gauge(
            "mt_documents_kept",
            "Document jobs kept, by status",
            ["status"],
            registry=r,
            multiprocess_mode="livesum",
        )

    def connection_event(self, kind: str) -> None:
        """service.http.connections' events: the open-connections gauge and the closures."""
        if kind == "opened":
            self.open_connections.inc()
        elif kind == "closed":
            self.open_connections.dec()
        else:
            self.closed_connections.labels(reason=kind).inc()

    def render(self) -> bytes:
        """The exposition: this registry's, or in a worker of several (service/http/workers.py)
        every worker's, added up from their files."""
        return generate_latest(self._exposed)


class RequestRate:
    """Events per second over the last `window_s` seconds, counted in one-second slots: what
    /status reports as requests per second. Prometheus answers that only as the difference of
    two scrapes; a status page wants the figure now, from one call. Over a service younger than
    the window the count is divided by its age (at least a second), not by the whole window."""

    def __init__(self, window_s: int = 60, clock: Callable[[], float] = time.monotonic) -> None:
        if window_s < 1:
            raise ValueError(f"window_s must be at least 1, got {window_s}")
        self.window_s = window_s
        self._clock = clock
        self._start = clock()
        self._seconds = [-1] * window_s  # which second each slot counts
        self._counts = [0] * window_s

    def record(self) -> None:
        second = math.floor(self._clock())
        slot = second % self.window_s
        if self._seconds[slot] != second:
            self._seconds[slot], self._counts[slot] = second, 0
        self._counts[slot] += 1

    def per_second(self) -> float:
        now = self._clock()
        second = math.floor(now)
        recent = sum(
            count
            for counted, count in zip(self._seconds, self._counts, strict=True)
            if second - self.window_s < counted <= second
        )
        return recent / min(self.window_s, max(1.0, now - self._start))
