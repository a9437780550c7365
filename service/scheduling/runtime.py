"""The serving runtime: route, prepare, batch, reassemble.

`Runtime` holds the loaded models by language pair (a multi-target model serves several pairs),
one batcher per model, readiness and draining. A translation goes: the text pipeline's `prepare`
(service/text/pipeline.py: split into sentences, limits, encode) -> the model's batcher (all
segments of the request, batched with everyone else's, whatever their target) -> the pipeline's
`assemble` (decode, reassemble each text around its original separators). The HTTP routes
(service/http/routes.py, libretranslate.py) validate and call it; it knows nothing of HTTP.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any, Literal, Protocol

from service.bundle.decoding import Deadline, DecodingOptions, Hypothesis, nothing
from service.errors import ErrorType, ServiceError
from service.metrics import Metrics, RequestRate
from service.scheduling.batcher import Batcher, BatchLimits
from service.settings import Settings
from service.text import pipeline
from service.text.pipeline import PLAIN, Form, TextModel, TextTranslation

log = logging.getLogger(__name__)

WARM_UP_TEXT = "A man is riding a bike."


class TranslationModel(TextModel, Protocol):
    """What the service needs of an engine (service.inference.engine.Engine, or a test's fake)."""

    name: str  # unique among the served models: the metrics' model label
    source_languages: tuple[str, ...]  # several for a multilingual model (M2M100, NLLB)
    target_languages: tuple[str, ...]  # several for a multi-target or multilingual model
    provider: str
    device: Literal["cpu", "cuda"]
    dtype: str  # the bundle's: fp32, fp16, int8
    card: str | None  # the bundle's model card (Markdown), if it carries one
    license: str | None  # the weights' license, as the bundle records it

    def generate(
        self,
        sources: Sequence[Sequence[int]],
        options: DecodingOptions,
        deadline: Deadline | None = None,
        prefixes: Sequence[Sequence[int]] | None = None,
    ) -> list[list[Hypothesis]]: ...

    def decoder_prefix(self, target: str | None = None) -> list[int]: ...


class Runtime:
    """Everything the routes share once the models are loaded."""

    def __init__(
        self, settings: Settings, metrics: Metrics, models: Sequence[TranslationModel]
    ) -> None:
        self.settings = settings
        self.metrics = metrics
        self.models: dict[tuple[str, str], TranslationModel] = {}  # by (source, target)
        names: dict[str, TranslationModel] = {}
        for model in models:
            if model.name in names:
                raise ValueError(
                    f"two models named {model.name}: the name labels its metrics; serve bundles "
                    "of differently named checkpoints"
                )
            names[model.name] = model
            for pair in _pairs(model):
                other = self.models.get(pair)
                if other is not None:
                    if _multilingual(other) == _multilingual(model):
                        raise ValueError(
                            f"two models for {pair[0]} -> {pair[1]}: {model.name}, {other.name}"
                        )
                    # A bilingual model before a multilingual one, unless the settings say.
                    if _multilingual(model) != settings.prefer_multilingual:
                        continue
                self.models[pair] = model
        limits = BatchLimits(
            max_batch_size=settings.max_batch_size,
            max_batch_tokens=settings.max_batch_tokens,
            max_wait_s=settings.max_wait_ms / 1000,
            max_queue=settings.max_queue_segments,
        )
        # One batcher per model: a multi-target or multilingual model batches all its pairs
        # together (the target is in the source ids, or the decoder's prefix).
        self.batchers = {
            name: Batcher(model.generate, model=name, limits=limits, metrics=metrics)
            for name, model in names.items()
        }
        # Large texts are split and tokenized here, one request at a time (a burst of large
        # bodies takes at most this thread's core, and waits in a short line, not in memory).
        self._preparation = ThreadPoolExecutor(max_workers=1, thread_name_prefix="prepare")
        self._preparing = 0  # requests in that line, the one being prepared included
        self.warmed_up = False
        self.draining = False
        self._drain_end = math.inf
        self._in_flight = 0
        self._no_requests = asyncio.Event()
        self._no_requests.set()
        self.request_rate = RequestRate()  # translation requests answered, for /status

    @property
    def ready(self) -> bool:
        running = all(b.running for b in self.batchers.values())
        return self.warmed_up and running and not self.draining

    def describe(self) -> str:
        """The served pairs for a log line: each pair, a multilingual model's in a count."""
        by_model: dict[str, list[tuple[str, str]]] = {}
        for pair, model in self.models.items():
            by_model.setdefault(model.name, []).append(pair)
        return "; ".join(
            f"{name}: {len(pairs)} pairs of {len({s for s, _ in pairs})} source languages"
            if len(pairs) > 8
            else f"{name}: " + ", ".join(f"{s} -> {t}" for s, t in pairs)
            for name, pairs in by_model.items()
        )

    async def start(self) -> None:
        """Start the batchers and translate one sentence per model through the whole path."""
        for (source, target), model in self.models.items():
            if _multilingual(model):  # one series, not one per pair (NLLB: 40,602)
                source = target = model.source_language
            self.metrics.model_info.labels(model.name, source, target, model.provider).set(1)
        for batcher in self.batchers.values():
            batcher.start()
        warm_up: dict[str, tuple[str, str]] = {}  # model name -> its first pair
        for pair, model in self.models.items():
            warm_up.setdefault(model.name, pair)
        for pair in warm_up.values():
            options = self.decoding_options(pair)
            await self.translate([WARM_UP_TEXT], pair, options, deadline=math.inf)
        self.warmed_up = True

    @contextmanager
    def accept(self) -> Iterator[None]:
        """Hold a translation request open; refused once draining has begun."""
        if self.draining:
            raise ServiceError(ErrorType.UNAVAILABLE, "the service is shutting down")
        self._in_flight += 1
        self._no_requests.clear()
        self.metrics.in_flight.inc()
        try:
            yield
        finally:
            self._in_flight -= 1
            self.metrics.in_flight.dec()
            self.request_rate.record()
            if self._in_flight == 0:
                self._no_requests.set()

    @property
    def in_flight(self) -> int:
        """Translation requests accepted and not yet answered."""
        return self._in_flight

    async def finish_requests(self, timeout: float) -> bool:
        """Refuse new requests and wait for the accepted ones to be answered, until `timeout`
        seconds after the first call (a second call shares the first one's deadline)."""
        if not self.draining:
            self.draining = True
            self._drain_end = time.monotonic() + timeout
        try:
            await asyncio.wait_for(self._no_requests.wait(), self._drain_left())
        except TimeoutError:
            log.warning("%d requests still open at the drain timeout", self._in_flight)
            return False
        return True

    async def shutdown(self, timeout: float) -> None:
        """Drain (see finish_requests), then stop the batchers within the same deadline."""
        await self.finish_requests(timeout)
        for batcher in self.batchers.values():
            await batcher.stop(self._drain_left())
        self._preparation.shutdown(wait=False, cancel_futures=True)

    def _drain_left(self) -> float:
        return max(0.0, self._drain_end - time.monotonic())

    def model(self, source: str, target: str) -> TranslationModel:
        model = self.models.get((source, target))
        if model is None:
            served = ", ".join(f"{s} -> {t}" for s, t in self.models)
            raise ServiceError(
                ErrorType.UNSUPPORTED_LANGUAGE_PAIR,
                f"no model translates {source} -> {target}; served: {served}",
            )
        return model

    def decoding_options(
        self, pair: tuple[str, str], requested: Mapping[str, Any] | None = None
    ) -> DecodingOptions:
        """The options of a request for `pair`: see service.text.pipeline.decoding_options."""
        return pipeline.decoding_options(
            self.settings, requested or {}, max_input_tokens=self.models[pair].max_input_tokens
        )

    def _prepare_now(
        self, model: TranslationModel, texts: Sequence[str], pair: tuple[str, str], form: Form
    ) -> pipeline.Prepared:
        source, target = pair
        return pipeline.prepare(
            model,
            texts,
            target,
            source=source,
            max_segment_characters=self.settings.max_segment_characters,
            max_segments=self.settings.max_queue_segments,
            format=form.format,
            translate_attributes=form.translate_attributes,
        )

    async def _prepare(
        self, model: TranslationModel, texts: Sequence[str], pair: tuple[str, str], form: Form
    ) -> pipeline.Prepared:
        """Parse, split and tokenize, after the cheap limits: the characters of the request
        (markup as sent) first."""
        characters = sum(len(text) for text in texts)
        if characters > self.settings.max_characters:
            raise ServiceError(
                ErrorType.INPUT_TOO_LONG,
                f"{characters} characters in one request; the limit is "
                f"{self.settings.max_characters} (max_characters)",
            )
        if characters <= _INLINE_CHARACTERS:
            return self._prepare_now(model, texts, pair, form)
        # Off the event loop: splitting and tokenising a large body takes CPU time that would
        # stall every other request (and /health) meanwhile.
        if self._preparing >= PREPARATION_LINE:
            raise ServiceError(
                ErrorType.QUEUE_FULL,
                f"{self._preparing} large requests are being split and tokenized; try again",
            )
        self._preparing += 1
        try:
            return await asyncio.get_running_loop().run_in_executor(
                self._preparation, self._prepare_now, model, texts, pair, form
            )
        finally:
            self._preparing -= 1

    async def translate(
        self,
        texts: Sequence[str],
        pair: tuple[str, str],
        options: DecodingOptions,
        *,
        deadline: float,
        form: Form = PLAIN,
    ) -> list[TextTranslation]:
        """Each text translated as `form` says (plain text or markup, alignments or not)."""
        model = self.models[pair]
        pipeline.check_form(model, form, options)
        prepared = await self._prepare(model, texts, pair, form)
        sources = prepared.sources
        # Sentences that encode to nothing (only control characters, say) skip the model.
        to_run = [i for i, ids in enumerate(sources) if ids]
        batcher = self.batchers[model.name]
        results = await batcher.submit(
            [sources[i] for i in to_run],
            options,
            deadline=deadline,
            prefix=model.decoder_prefix(pair[1]),
        )
        nbest = [[nothing()] for _ in sources]
        for i, hypotheses in zip(to_run, results, strict=True):
            nbest[i] = hypotheses
        return pipeline.assemble(
            model, prepared, nbest, options.num_hypotheses, alignments=form.alignments
        )


def _multilingual(model: TranslationModel) -> bool:
    """A model of several source languages (M2M100, NLLB), which routing ranks after a
    bilingual or multi-target one for a pair both serve (Settings.prefer_multilingual)."""
    return len(model.source_languages) > 1


def _pairs(model: TranslationModel) -> list[tuple[str, str]]:
    """The (source, target) pairs a model serves: every source to every other language."""
    return [
        (source, target)
        for source in model.source_languages
        for target in model.target_languages
        if source != target
    ]


# Texts up to this many characters in all are split and tokenised on the event loop: well under
# a millisecond, less than the hop to a worker thread and back costs under load.
_INLINE_CHARACTERS = 2000
# Large requests waiting for (or in) the preparation thread; one more gets 429. With at most
# max_characters each, the line is a fraction of a second long.
PREPARATION_LINE = 16
