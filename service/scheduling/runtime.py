"""The serving runtime: route, prepare, batch, reassemble.

`Runtime` holds the loaded models by language pair (a multi-target model serves several pairs),
one batcher per model, readiness and draining. A translation goes: the text pipeline's `prepare`
(service/text/pipeline.py: split into sentences, limits, encode) -> the model's batcher (all
segments of the request, batched with everyone else's, whatever their target) -> the pipeline's
`assemble` (decode, reassemble each text around its original separators). The HTTP routes
(service/http/routes.py, libretranslate.py) validate and call it; it knows nothing of HTTP.

A request's glossary (`terms`: one of `glossaries`, its store, or inline entries) is matched
in the pipeline; the matched terms become the search's constraints here (`_constraints`, after
the model's own translation of each new source term, one batch of its own).

With `source: "auto"` (`translate_detected`) each text's language is detected on its own
(service/text/detect.py) and each text goes to the model of its (detected, target) pair: the
texts of one request may go to several models, at the same time, and come back in order.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Protocol, TypeVar

from service import glossaries
from service.bundle.decoding import (
    NO_CONSTRAINTS,
    Constraints,
    Deadline,
    DecodingOptions,
    Hypothesis,
    nothing,
)
from service.errors import ErrorType, ServiceError
from service.glossaries import Entry, Glossaries, Glossary, open_store
from service.keys.access import Access
from service.metrics import Metrics, RequestRate
from service.scheduling.batcher import Batcher, BatchLimits, Generate, Stepper, set_within
from service.scheduling.cache import (
    MemoryStore,
    Sentences,
    SharedSentences,
    sentence_key,
)
from service.settings import Settings
from service.store.connection import RedisLink
from service.text import pipeline, terms
from service.text.detect import Candidate, Detector
from service.text.markup import NO_TAGS, Tags
from service.text.pipeline import PLAIN, Form, Format, TextModel, TextTranslation
from service.text.terms import Terms

if TYPE_CHECKING:
    from prometheus_client import Gauge

log = logging.getLogger(__name__)

WARM_UP_TEXT = "A man is riding a bike."
AUTO = "auto"  # the source that asks for each text's language to be detected
# The language of a text with nothing to detect (ISO 639's "undetermined"), confidence 0.
UNDETERMINED = Candidate("und", 0.0)

_T = TypeVar("_T")
_K = TypeVar("_K")

# Why a text of a request with source "auto" came back as it was sent: it is already in the
# target language, or it has no letter to detect a language from (emoji, a URL, digits).
Untranslated = Literal["source_is_target", "nothing_to_detect"]


@dataclass(frozen=True)
class DetectedTranslation:
    """A text of a request with source "auto": its translation (the text itself when
    `untranslated` says why), its detected language (UNDETERMINED when there was nothing to
    detect) and the model that translated it (None: none did)."""

    translation: TextTranslation
    detected: Candidate
    model: str | None
    untranslated: Untranslated | None


class TranslationModel(TextModel, Protocol):
    """What the service needs of an engine (service.inference.engine.Engine, or a test's fake)."""

    name: str  # unique among the served models: the metrics' model label
    # What its translations are a function of (its bundle's content hash): the sentence
    # cache's keys (service/scheduling/cache.py) never answer for another model.
    fingerprint: str
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
        constraints: Sequence[Constraints] | None = None,
    ) -> list[list[Hypothesis]]: ...

    def decoder_prefix(self, target: str | None = None) -> list[int]: ...

    @property
    def cuda_graphs_captured(self) -> int:
        """Decoder-step shapes with a CUDA graph."""
        ...

    def stepper(self, slots: int) -> Stepper | None:
        """Step-level batching over this model with `slots` sentences per running batch;
        None where the model runs whole batches only."""
        ...


class Runtime:
    """Everything the routes share once the models are loaded."""

    def __init__(
        self, settings: Settings, metrics: Metrics, models: Sequence[TranslationModel]
    ) -> None:
        self.settings = settings
        self.metrics = metrics
        self.models: dict[tuple[str, str], TranslationModel] = {}  # by (source, target)
        names: dict[str, TranslationModel] = {}
        by_kind: dict[bool, dict[tuple[str, str], TranslationModel]] = {False: {}, True: {}}
        for model in models:
            if model.name in names:
                raise ValueError(
                    f"two models named {model.name}: the name labels its metrics; serve bundles "
                    "of differently named checkpoints"
                )
            names[model.name] = model
            claimed = by_kind[_multilingual(model)]
            for pair in _pairs(model):
                if pair in claimed:
                    raise ValueError(
                        f"two models for {pair[0]} -> {pair[1]}: {model.name}, {claimed[pair].name}"
                    )
                claimed[pair] = model
        # A pair both kinds serve goes to the bilingual model, unless the settings say.
        first = settings.prefer_multilingual
        self.models.update(by_kind[not first])
        self.models.update(by_kind[first])
        limits = BatchLimits(
            max_batch_size=settings.max_batch_size,
            max_batch_tokens=settings.max_batch_tokens,
            max_wait_s=settings.max_wait_ms / 1000,
            max_queue=settings.max_queue_segments,
            background_batch_size=settings.document_batch_size,
        )
        # One batcher per model: a multi-target or multilingual model batches all its pairs
        # together (the target is in the source ids, or the decoder's prefix).
        self.batchers = {
            name: Batcher(
                _counting_graphs(model, metrics.cuda_graphs.labels(name)),
                model=name,
                limits=limits,
                metrics=metrics,
                stepper=_stepper(model, settings),
                # Documents' sentences: a running batch of their own, paused for requests.
                background=model.stepper(settings.document_batch_size),
            )
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
        # The process's one Redis client (service/store/connection.py), when there is Redis.
        self.redis: RedisLink | None = None
        if settings.redis_url is not None:
            self.redis = RedisLink(
                settings.redis_url.get_secret_value(),
                timeout_s=settings.redis_timeout_s,
                retry_s=settings.redis_retry_s,
                metrics=metrics,
            )
        memory = MemoryStore(settings.cache_bytes, metrics)
        shared = None
        if self.redis is not None:
            shared = SharedSentences(self.redis, memory, settings.cache_ttl_s)
        # The sentence cache and single flight (across replicas with Redis); None: off.
        self.sentences = Sentences(memory, metrics, shared) if settings.cache else None
        # Who may call and how much (service/keys/): static and stored keys, their limits.
        self.access = Access(settings, self.redis, metrics)
        # Every served language, targets too: a text already in its target is seen as such.
        self.detector = Detector({language for pair in self.models for language in pair})
        # The model's own translation of each source term seen (by model and pair).
        self._renderings: dict[tuple[str, str, str], dict[str, str]] = {}
        self.glossaries = Glossaries(
            open_store(settings.glossary_dir, self.redis),
            max_entries=settings.max_glossary_entries,
            max_per_owner=settings.max_glossaries_per_key,
        )

    @property
    def ready(self) -> bool:
        return self.warmed_up and self._batchers_running and not self.draining

    @property
    def broken(self) -> bool:
        """A batcher's worker stopped while serving (a bug, logged): its model's requests get
        503 until the process is restarted."""
        return self.warmed_up and not self._batchers_running and not self.draining

    @property
    def _batchers_running(self) -> bool:
        return all(b.running for b in self.batchers.values())

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
        await self.access.start()
        self.detector.rank(WARM_UP_TEXT)  # loads its model
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
        if not await set_within(self._no_requests, self._drain_left()):
            # Answered now, 503 with Retry-After (a proxy or client tries another replica),
            # rather than cut off with a 500 when the server closes their connections.
            log.warning("%d requests still open at the drain timeout: 503", self._in_flight)
            for batcher in self.batchers.values():
                batcher.give_up("the service shut down before the translation was done; retry")
            return False
        return True

    async def shutdown(self, timeout: float) -> None:
        """Drain (see finish_requests), then stop the batchers within the same deadline."""
        await self.finish_requests(timeout)
        for batcher in self.batchers.values():
            await batcher.stop(self._drain_left())
        self._preparation.shutdown(wait=False, cancel_futures=True)
        if self.redis is not None:
            await self.redis.close()

    def _drain_left(self) -> float:
        return max(0.0, self._drain_end - time.monotonic())

    def model(self, source: str, target: str) -> TranslationModel:
        model = self.models.get((source, target))
        if model is None:
            raise ServiceError(
                ErrorType.UNSUPPORTED_LANGUAGE_PAIR,
                f"no model translates {source} -> {target}; served: {self._served()}",
            )
        return model

    def _served(self) -> str:
        return ", ".join(f"{s} -> {t}" for s, t in self.models)

    def decoding_options(
        self, pair: tuple[str, str], requested: Mapping[str, Any] | None = None
    ) -> DecodingOptions:
        """The options of a request for `pair`: see service.text.pipeline.decoding_options."""
        return pipeline.decoding_options(
            self.settings, requested or {}, max_input_tokens=self.models[pair].max_input_tokens
        )

    def _prepare_now(
        self,
        model: TranslationModel,
        texts: Sequence[str],
        pair: tuple[str, str],
        form: Form,
        label: Callable[[int], str],
        terms: Terms | None,
    ) -> pipeline.Prepared:
        source, target = pair
        return pipeline.prepare(
            model,
            texts,
            target,
            source=source,
            max_segment_characters=self.settings.max_segment_characters,
            max_segments=self.settings.max_queue_segments,
            label=label,
            format=form.format,
            translate_attributes=form.translate_attributes,
            splitting=form.splitting,
            tags=form.tags,
            protection=form.protection,
            terms=terms,
        )

    async def _prepare(
        self,
        model: TranslationModel,
        texts: Sequence[str],
        pair: tuple[str, str],
        form: Form,
        label: Callable[[int], str],
        terms: Terms | None,
    ) -> pipeline.Prepared:
        """Parse, split and tokenize, after the cheap limits: the characters of the request
        (markup as sent) first."""
        return await self._text_work(
            texts, self._prepare_now, model, texts, pair, form, label, terms
        )

    async def _text_work(self, texts: Sequence[str], work: Callable[..., _T], *args: Any) -> _T:
        """`work(*args)` on the request's `texts`, once they are within max_characters: on
        the event loop when they are short, else in the preparation thread."""
        characters = sum(len(text) for text in texts)
        if characters > self.settings.max_characters:
            raise ServiceError(
                ErrorType.INPUT_TOO_LONG,
                f"{characters} characters in one request; the limit is "
                f"{self.settings.max_characters} (max_characters)",
            )
        if characters <= _INLINE_CHARACTERS:
            return work(*args)
        # Off the event loop: splitting and tokenising (or detecting) a large body takes CPU
        # time that would stall every other request (and /health) meanwhile.
        if self._preparing >= PREPARATION_LINE:
            raise ServiceError(
                ErrorType.QUEUE_FULL,
                f"{self._preparing} large requests are being split and tokenized; try again",
            )
        self._preparing += 1
        try:
            return await asyncio.get_running_loop().run_in_executor(self._preparation, work, *args)
        finally:
            self._preparing -= 1

    def _detect_now(
        self, texts: Sequence[str], format: Format, tags: Tags = NO_TAGS
    ) -> list[list[Candidate] | None]:
        readable = pipeline.detectable(texts, format, tags)
        return [self.detector.rank(text) for text in readable]

    async def detect(
        self, texts: Sequence[str], format: Format = "text"
    ) -> list[list[Candidate] | None]:
        """Each text's served languages, most likely first (None: nothing to detect)."""
        return await self._text_work(texts, self._detect_now, texts, format)

    async def translate(
        self,
        texts: Sequence[str],
        pair: tuple[str, str],
        options: DecodingOptions,
        *,
        deadline: float,
        form: Form = PLAIN,
        label: Callable[[int], str] = pipeline.text_label,
        terms: Terms | None = None,
        cache: bool = True,
        background: bool = False,
    ) -> list[TextTranslation]:
        """Each text translated as `form` says (plain text or markup, alignments or not), with
        `terms` (a glossary) enforced in decoding; an error names a text by `label(its
        index)`. `cache`: its sentences may be answered from the sentence cache or another
        request's decoding (and are stored there). `background`: bulk work (a document's),
        decoded behind interactive requests (service/scheduling/batcher.py)."""
        model = self.models[pair]
        options = pipeline.check_form(model, form, options)
        prepared = await self._prepare(model, texts, pair, form, label, terms)
        options = prepared.decoding(options, min(pipeline.TERMS_BEAM, self.settings.max_beam_size))
        each = prepared.sentence_options(options, form.alignments)
        sources = prepared.sources
        # Sentences that encode to nothing (only control characters, say) skip the model.
        to_run = [i for i, ids in enumerate(sources) if ids]
        batcher = self.batchers[model.name]
        prefix = model.decoder_prefix(pair[1])
        constraints = await self._constraints(model, pair, prepared, to_run, deadline)

        def submit(positions: list[int]) -> Awaitable[list[list[Hypothesis]]]:
            # Each sentence with its own options (markup asks some only for the alignment).
            return batcher.submit(
                [sources[to_run[j]] for j in positions],
                [each[to_run[j]] for j in positions],
                deadline=deadline,
                prefix=prefix,
                constraints=None if constraints is None else [constraints[j] for j in positions],
                background=background,
            )

        if cache and self.sentences is not None:
            keys = [
                sentence_key(
                    model.fingerprint,
                    pair,
                    sources[i],
                    prefix,
                    each[i],
                    NO_CONSTRAINTS if constraints is None else constraints[j],
                )
                for j, i in enumerate(to_run)
            ]
            results = await self.sentences.decode(keys, submit, deadline=deadline)
        else:
            results = await submit(list(range(len(to_run))))
        nbest = [[nothing()] for _ in sources]
        for i, hypotheses in zip(to_run, results, strict=True):
            nbest[i] = hypotheses
        return pipeline.assemble(
            model, prepared, nbest, options.num_hypotheses, alignments=form.alignments
        )

    def _likeliest(self, candidates: list[Candidate], target: str) -> Candidate:
        """The most likely language; of codes the detector cannot tell apart (an ISO code and
        NLLB's FLORES code for one language, equally confident), one that has a model into
        `target`, or is it."""
        tied = [c for c in candidates if c.confidence == candidates[0].confidence]
        for candidate in tied:
            if candidate.language == target or (candidate.language, target) in self.models:
                return candidate
        return candidates[0]

    async def translate_detected(
        self,
        texts: Sequence[str],
        target: str,
        requested: Mapping[str, Any],
        *,
        deadline: float,
        form: Form = PLAIN,
        terms: Terms | None = None,
        cache: bool = True,
    ) -> list[DetectedTranslation]:
        """Each text translated from the language detected in it into `target`, by the model
        of that pair with the options `requested` (as `decoding_options` takes them); a text
        already in `target`, or with nothing to detect, comes back as it was sent. A text
        whose pair no model serves fails the request, before anything is translated. `terms`
        apply to the texts of their pair (inline ones: to every text); `cache`: as
        `translate`'s."""
        if all(t != target for _, t in self.models):
            raise ServiceError(
                ErrorType.UNSUPPORTED_LANGUAGE_PAIR,
                f"no model translates into {target}; served: {self._served()}",
            )
        found = await self._text_work(texts, self._detect_now, texts, form.format, form.tags)
        best: list[Candidate] = []  # each text's language
        routes: dict[tuple[str, str], list[int]] = {}  # pair -> its texts, in order
        for i, candidates in enumerate(found):
            if candidates == []:
                served = ", ".join(sorted(self.detector.languages))
                raise ServiceError(
                    ErrorType.UNSUPPORTED_LANGUAGE_PAIR,
                    f"{pipeline.text_label(i)} is in none of the languages served ({served})",
                )
            best.append(UNDETERMINED if candidates is None else self._likeliest(candidates, target))
            pair = (best[i].language, target)
            if candidates is None or pair[0] == target:
                continue
            try:
                self.model(*pair)
            except ServiceError as e:
                raise ServiceError(
                    e.type,
                    f"{pipeline.text_label(i)} is in {pair[0]} (detected, confidence "
                    f"{best[i].confidence:.2f}): {e.message}",
                ) from None
            routes.setdefault(pair, []).append(i)
        options = {pair: self.decoding_options(pair, requested) for pair in routes}
        for pair, chosen in options.items():
            pipeline.check_form(self.models[pair], form, chosen)
        translated = await _all(
            {
                pair: self.translate(
                    [texts[i] for i in indices],
                    pair,
                    options[pair],
                    deadline=deadline,
                    form=form,
                    label=_labels(indices),
                    terms=terms if terms is not None and terms.pair in (None, pair) else None,
                    cache=cache,
                )
                for pair, indices in routes.items()
            }
        )
        results = [
            DetectedTranslation(
                TextTranslation([text], [None], []),
                language,
                None,
                "nothing_to_detect" if language is UNDETERMINED else "source_is_target",
            )
            for text, language in zip(texts, best, strict=True)
        ]
        for pair, indices in routes.items():
            for i, translation in zip(indices, translated[pair], strict=True):
                results[i] = DetectedTranslation(translation, best[i], self.models[pair].name, None)
        return results

    async def create_glossary(
        self, owner: str, name: str, pair: tuple[str, str], entries: Sequence[Entry]
    ) -> Glossary:
        """A glossary of `owner` for a served pair, every target term spelled by its model."""
        self._spell(pair, glossaries.checked(entries, self.settings.max_glossary_entries))
        return await self.glossaries.create(owner, name, pair, entries)

    async def terms(
        self,
        owner: str,
        pair: tuple[str, str],
        glossary_id: str | None = None,
        entries: Sequence[Entry] | None = None,
    ) -> Terms | None:
        """What a request for `pair` (its source may be "auto") enforces: the owner's glossary
        `glossary_id` of that pair, or its inline `entries` (checked as a glossary's), or
        nothing."""
        if glossary_id is not None and entries is not None:
            raise ServiceError(
                ErrorType.INVALID_REQUEST, "give a glossary_id or inline glossary entries, not both"
            )
        if glossary_id is not None:
            if pair[0] == AUTO:
                glossary = await self.glossaries.get(owner, glossary_id)
                await self.glossaries.for_pair(owner, glossary_id, (glossary.source, pair[1]))
            else:
                glossary = await self.glossaries.for_pair(owner, glossary_id, pair)
            return Terms(glossary.entries, (glossary.source, glossary.target))
        if entries is None:
            return None
        kept = glossaries.checked(entries, self.settings.max_glossary_entries)
        if pair[0] != AUTO:
            self._spell(pair, kept)
        return Terms(kept)

    async def _constraints(
        self,
        model: TranslationModel,
        pair: tuple[str, str],
        prepared: pipeline.Prepared,
        to_run: list[int],
        deadline: float,
    ) -> list[Constraints] | None:
        """The constraints of the sentences to run (service/text/terms.py), None without any:
        the model's own translation of each matched source term it has not translated yet is
        one batch of its own first (what the search then avoids beside the glossary's term)."""
        if not any(prepared.matched):
            return None
        matched = [prepared.matched[i] for i in to_run]
        key = (model.name, *pair)
        known = self._renderings.setdefault(key, {})
        missing = sorted({e.source for own in matched for e in own} - known.keys())
        if missing:
            options = self.decoding_options(pair, {"beam_size": 1})
            found = await self.batchers[model.name].submit(
                model.encode(missing, pair[1], pair[0]),
                options,
                deadline=deadline,
                prefix=model.decoder_prefix(pair[1]),
            )
            if sum(map(len, self._renderings.values())) > _MAX_RENDERINGS:
                self._renderings = {key: known}
            known.update((s, model.decode(h[0].ids)) for s, h in zip(missing, found, strict=True))
        return terms.constraints(model, matched, known.__getitem__)

    def _spell(self, pair: tuple[str, str], entries: Sequence[Entry]) -> None:
        """Refuse an entry whose target term the pair's model cannot spell."""
        model = self.model(*pair)
        terms.check_spelling(model, model.name, entries)


def _labels(indices: Sequence[int]) -> Callable[[int], str]:
    """How errors name the texts of a model's share of a request: by their index in it."""
    return lambda j: pipeline.text_label(indices[j])


async def _all(work: Mapping[_K, Coroutine[Any, Any, _T]]) -> dict[_K, _T]:
    """Every coroutine's result, run at the same time; the first failure cancels the others
    and is raised (as itself, not in an ExceptionGroup: the error table maps it)."""
    try:
        async with asyncio.TaskGroup() as group:
            tasks = {key: group.create_task(coroutine) for key, coroutine in work.items()}
    except BaseExceptionGroup as e:
        raise e.exceptions[0] from None
    return {key: task.result() for key, task in tasks.items()}


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


# Source terms' own translations kept (Runtime._constraints); past it, they start again.
_MAX_RENDERINGS = 100_000
# Texts up to this many characters in all are split and tokenised on the event loop: well under
# a millisecond, less than the hop to a worker thread and back costs under load.
_INLINE_CHARACTERS = 2000
# Large requests waiting for (or in) the preparation thread; one more gets 429. With at most
# max_characters each, the line is a fraction of a second long.
PREPARATION_LINE = 16


def _counting_graphs(model: TranslationModel, graphs: Gauge) -> Generate:
    """The model's generate, which sets `graphs` to the model's CUDA graphs after each call
    (set, not read at the scrape: a worker of several writes its metrics to a file)."""

    def generate(
        sources: list[list[int]],
        options: DecodingOptions,
        deadline: Deadline,
        prefixes: list[list[int]],
        constraints: list[Constraints],
    ) -> list[list[Hypothesis]]:
        try:
            return model.generate(sources, options, deadline, prefixes, constraints)
        finally:
            graphs.set(model.cuda_graphs_captured)

    return generate


def _stepper(model: TranslationModel, settings: Settings) -> Stepper | None:
    """The model's step-level batching when the settings ask for it and it has one."""
    if settings.scheduler != "step":
        return None
    stepper = model.stepper(settings.max_batch_size)
    if stepper is None:
        log.info("%s: whole batches (its bundle runs no step-level batching here)", model.name)
    return stepper
