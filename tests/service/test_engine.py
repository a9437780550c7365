"""service/inference/engine.py and service/translate.py on the tiny bundles: token for token with
the torch reference, provider fallback, input checks without model calls, order, the CLI."""

from __future__ import annotations

import io
import itertools
import logging
import math
import resource
import sys
import threading
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest
from hypothesis import given
from hypothesis import strategies as st

from model.search import generate
from model.transformer import load_model
from service import translate
from service.bundle.decoding import DecodingOptions, Hypothesis
from service.bundle.manifest import ATTENTION_MASK, INPUT_IDS, BundleError, cross_names
from service.inference import step_state
from service.inference.engine import (
    CPU_PROVIDER,
    Engine,
    InputTooLongError,
    _load_cuda_libraries,
    _providers,
    encoder_chunks,
)
from service.inference.step_state import narrow_rows, step_macs_per_row
from service.settings import Settings
from tests.service.helpers import model_translate, step_runs


@pytest.fixture(scope="module")
def engine(eos_bundle: Path) -> Engine:
    return Engine.load(eos_bundle, device="cpu", intra_op_threads=1)


@pytest.fixture(scope="module")
def sources(engine: Engine, val_src: list[str]) -> list[list[int]]:
    ids = [s for s in engine.encode(val_src) if len(s) <= engine.max_input_tokens]
    assert len(ids) >= 15  # only a few val sentences exceed the tiny max_positions
    return ids


@pytest.fixture
def model_calls(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every ONNX Runtime session run, whichever way it is made."""
    calls: list[str] = []
    for method in ("run", "run_with_iobinding"):
        original = getattr(ort.InferenceSession, method)

        def spy(
            self: object, *args: object, _f: Any = original, _m: str = method, **kw: object
        ) -> Any:
            calls.append(_m)
            return _f(self, *args, **kw)

        monkeypatch.setattr(ort.InferenceSession, method, spy)
    return calls


@pytest.mark.parametrize(("beam_size", "num_hypotheses"), [(1, 1), (4, 2)])
# Compacted batches (the CPU's policy) of 8, and padded ones (CUDA's) of 6: padded to 8 sentences
# and to a multiple of 8 source positions, with finished rows staying in the batch. The gather
# bundles are the CUDA graphs (service/bundle/manifest.py), here on the CPU.
@pytest.mark.parametrize(
    ("bundle_name", "checkpoint_name", "padded", "batch_size"),
    [
        ("eos_bundle", "eos_checkpoint", False, 8),
        ("eos_bundle", "eos_checkpoint", True, 6),
        ("eos_gather_bundle", "eos_checkpoint", True, 6),
        ("eos_gather_bundle", "eos_checkpoint", False, 8),
        ("fp32_bundle", "tiny_checkpoint", False, 8),
        ("gather_bundle", "tiny_checkpoint", True, 6),
    ],
)
def test_engine_equals_the_torch_reference(
    bundle_name: str,
    checkpoint_name: str,
    padded: bool,
    batch_size: int,
    beam_size: int,
    num_hypotheses: int,
    sources: list[list[int]],
    request: pytest.FixtureRequest,
) -> None:
    """The eos model stops at varied lengths (rows leave the batch), the plain one at
    max_positions ("length", past the first cache capacity of short sources); equal batch sizes
    make the engine and torch sort and split alike. Padding (sentences, source positions,
    finished rows) never changes an output, nor does the way beams follow the cache."""
    engine = Engine.load(
        request.getfixturevalue(bundle_name),
        device="cpu",
        intra_op_threads=1,
        max_batch_size=batch_size,
        padded=padded,
    )
    model = load_model(request.getfixturevalue(checkpoint_name))
    options = DecodingOptions(beam_size=beam_size, num_hypotheses=num_hypotheses)

    ours = engine.generate(sources, options)
    expected = generate(
        model, sources, beam_size=beam_size, num_hypotheses=num_hypotheses, batch_size=batch_size
    )

    assert [[(h.ids, h.finish_reason) for h in n] for n in ours] == [
        [(h.ids, h.finish_reason) for h in n] for n in expected
    ]
    for n, m in zip(ours, expected, strict=True):
        assert [h.score for h in n] == pytest.approx([h.score for h in m], abs=1e-4)
    reasons = {h.finish_reason for n in ours for h in n}
    if checkpoint_name == "eos_checkpoint":
        assert "eos" in reasons
        assert len({len(n[0].ids) for n in ours}) > 3  # varied lengths
    else:
        assert reasons == {"length"}


def test_cuda_asked_for_without_cuda_falls_back_to_cpu_with_a_warning(
    fp32_bundle: Path, caplog: pytest.LogCaptureFixture
) -> None:
    if "CUDAExecutionProvider" in ort.get_available_providers():
        pytest.skip("this ONNX Runtime has CUDA")
    with caplog.at_level(logging.INFO, logger="service.inference.engine"):
        engine = Engine.load(fp32_bundle, device="cuda", intra_op_threads=1)
    assert engine.provider == CPU_PROVIDER
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "running on the CPU" in warnings[0].getMessage()
    [[(text, hyp)]] = model_translate(
        engine, ["A dog runs."], DecodingOptions(max_decoding_length=5)
    )
    assert len(hyp.ids) == 5 and isinstance(text, str)


def test_a_cpu_only_decoder_step_is_kept_off_cuda(
    fp32_bundle: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The indirection cache's attention kernel is CPU-only: asked for CUDA explicitly, the
    engine refuses it with the export that makes one for CUDA; on "auto" it takes the CPU."""
    available = ["CUDAExecutionProvider", "CPUExecutionProvider"]
    monkeypatch.setattr(ort, "get_available_providers", lambda: available)
    with pytest.raises(BundleError, match="--cache gather"):
        Engine.load(fp32_bundle, device="cuda")
    with caplog.at_level(logging.INFO, logger="service.inference.engine"):
        engine = Engine.load(fp32_bundle, intra_op_threads=1)
    assert engine.provider == CPU_PROVIDER
    assert any("runs on the CPU only" in r.getMessage() for r in caplog.records)


def test_cuda_provider_options_name_a_device_only_past_the_first(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """ONNX Runtime >= 1.26 warns at every session that no plugin EP device is registered for
    a device_id it is given (seen on an H100): device 0, its default, is not named."""
    available = ["CUDAExecutionProvider", "CPUExecutionProvider"]
    monkeypatch.setattr(ort, "get_available_providers", lambda: available)
    [(_, first), cpu] = _providers("auto", 0, cuda_graphs=False)
    assert "device_id" not in first and cpu == CPU_PROVIDER
    [(_, second), _] = _providers("cuda", 1, cuda_graphs=True)
    assert second["device_id"] == 1 and second["enable_cuda_graph"] == "1"
    assert _providers("cpu", 1, cuda_graphs=True) == [CPU_PROVIDER]


def test_cuda_libraries_are_preloaded_once_before_the_first_cuda_session(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The CUDA provider links CUDA and cuDNN by name with no search path: the gpu image's
    libraries are the nvidia-* wheels' in site-packages, which onnxruntime.preload_dlls() loads.
    Once a process, and never for the CPU."""
    loads: list[None] = []
    monkeypatch.setattr(ort, "preload_dlls", lambda: loads.append(None))
    monkeypatch.setattr(ort, "get_available_providers", lambda: ["CPUExecutionProvider"])
    _load_cuda_libraries.cache_clear()
    _providers("auto", 0, cuda_graphs=False)
    assert loads == []  # no CUDA provider in this ONNX Runtime
    available = ["CUDAExecutionProvider", "CPUExecutionProvider"]
    monkeypatch.setattr(ort, "get_available_providers", lambda: available)
    _providers("cpu", 0, cuda_graphs=False)
    assert loads == []
    _providers("auto", 0, cuda_graphs=False)
    _providers("cuda", 1, cuda_graphs=True)
    assert loads == [None]
    _load_cuda_libraries.cache_clear()


def test_auto_picks_the_cpu_without_a_warning(
    fp32_bundle: Path, caplog: pytest.LogCaptureFixture
) -> None:
    if "CUDAExecutionProvider" in ort.get_available_providers():
        pytest.skip("this ONNX Runtime has CUDA")
    with caplog.at_level(logging.INFO, logger="service.inference.engine"):
        engine = Engine.load(fp32_bundle, intra_op_threads=1)
    assert engine.provider == CPU_PROVIDER
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert any(CPU_PROVIDER in r.getMessage() for r in caplog.records)


@given(
    lengths=st.lists(st.integers(1, 60), min_size=1, max_size=9).map(sorted),
    run_cost=st.integers(0, 40),
)
def test_encoder_chunks_are_the_cheapest_cut(lengths: list[int], run_cost: int) -> None:
    """Against every way to cut the sorted lengths into consecutive groups."""

    def cost(groups: list[tuple[int, int]]) -> int:
        return sum((end - start) * lengths[end - 1] + run_cost for start, end in groups)

    n = len(lengths)
    cheapest = min(
        cost(list(itertools.pairwise([0, *cuts, n])))
        for r in range(n)
        for cuts in itertools.combinations(range(1, n), r)
    )
    groups = encoder_chunks(lengths, run_cost)
    assert [start for start, _ in groups] == [0] + [end for _, end in groups[:-1]]
    assert groups[-1][1] == n
    assert cost(groups) == cheapest


def test_encoder_chunks_need_sorted_lengths() -> None:
    with pytest.raises(ValueError, match="ascending"):
        encoder_chunks([3, 2])


def test_the_cpu_encodes_groups_of_similar_length_as_one_padded_run_would(
    engine: Engine, sources: list[list[int]], model_calls: list[str]
) -> None:
    """The compact policy's encoder runs once per length group (each padded to its longest);
    every source's keys/values equal those of one run over the whole padded batch (past its
    end the decoder masks them)."""
    batch = sorted(sources[:16], key=len)
    lengths = [len(s) for s in batch]
    ids = np.full((len(batch), lengths[-1]), engine.manifest.special_ids.pad, np.int64)
    mask = np.zeros_like(ids)
    for row, source in enumerate(batch):
        ids[row, : len(source)] = source
        mask[row, : len(source)] = 1
    groups = encoder_chunks(lengths)
    assert len(groups) > 1, lengths

    chunked = engine._encode(ids, mask)
    assert model_calls == ["run"] * len(groups)

    names = cross_names(engine.manifest.model.decoder_layers)
    whole = engine._encoder.run(names, {INPUT_IDS: ids, ATTENTION_MASK: mask})
    for name, expected in zip(names, whole, strict=True):
        assert chunked[name].shape == expected.shape
        for row, length in enumerate(lengths):
            np.testing.assert_allclose(
                chunked[name][row, :, :length], expected[row, :, :length], atol=1e-5
            )


def test_cuda_graphs_are_numbered_by_shape_up_to_their_limit() -> None:
    graphs = step_state.CudaGraphs(2)
    assert [graphs.id_for(shape) for shape in [(1,), (2,), (1,), (3,), (2,), (3,)]] == [
        1, 2, 1, -1, 2, -1
    ]  # fmt: skip
    assert graphs.captured == 2
    options = graphs.run_options(2)
    assert options is graphs.run_options(2)  # made once, not at every step
    assert options.get_run_config_entry("gpu_graph_id") == "2"
    assert graphs.run_options(-1).get_run_config_entry("gpu_graph_id") == "-1"
    with pytest.raises(ValueError, match="at least 1"):
        step_state.CudaGraphs(0)


def test_a_padded_batch_runs_its_steps_under_the_graphs_of_their_shapes(
    gather_bundle: Path, sources: list[list[int]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """CUDA's policy, on the CPU (whose provider ignores gpu_graph_id): a batch's first step of
    a shape runs without a graph, its later ones under the shape's graph; a shape that comes
    after the limit's worth of others runs without one at every step; the tokens never change."""
    engine = Engine.load(gather_bundle, device="cpu", intra_op_threads=1, padded=True)
    expected = {n: engine.generate(sources[:n], DecodingOptions()) for n in (1, 2, 4)}
    engine._graphs = step_state.CudaGraphs(2)
    ids: list[str] = []
    run = ort.InferenceSession.run_with_iobinding

    def spy(session: ort.InferenceSession, binding: Any, options: ort.RunOptions) -> None:
        ids.append(options.get_run_config_entry("gpu_graph_id"))
        run(session, binding, options)

    monkeypatch.setattr(ort.InferenceSession, "run_with_iobinding", spy)
    by_batch = []
    for n in (1, 2, 4, 1):  # 1, 2 and 4 slots: three shapes, the third past the limit
        ids.clear()
        assert engine.generate(sources[:n], DecodingOptions()) == expected[n]
        by_batch.append(ids[:])
    for batch, graph in zip(by_batch, ["1", "2", "-1", "1"], strict=True):
        assert len(batch) > 2 and batch[0] == "-1", batch
        assert set(batch[1:]) == {graph}, batch
    assert engine.cuda_graphs_captured == 2


@pytest.mark.parametrize("padded", [False, True])
def test_buffers_are_reused_and_memory_stays_flat(
    eos_bundle: Path, sources: list[list[int]], padded: bool
) -> None:
    """1,000 batches of varying sentences, lengths and beams after one of the largest shape:
    the pooled cache and outputs never grow, and neither does the process."""
    engine = Engine.load(eos_bundle, device="cpu", intra_op_threads=1, padded=padded)
    rng = np.random.default_rng(0)
    largest = DecodingOptions(beam_size=4, max_decoding_length=16)
    engine.generate(sorted(sources, key=len)[-8:], largest)
    held = engine._pool.nbytes()
    rss = []
    for i in range(1000):
        batch = [sources[j] for j in rng.choice(len(sources), size=rng.integers(1, 9))]
        options = DecodingOptions(
            beam_size=int(rng.choice([1, 2, 4])), max_decoding_length=int(rng.integers(1, 17))
        )
        engine.generate(batch, options)
        assert engine._pool.nbytes() == held, f"batch {i}"
        if i % 100 == 99:
            rss.append(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
    assert rss[-1] - rss[0] < 10_000, rss  # KiB of peak RSS over the last 900 batches


@pytest.mark.parametrize("spinning", [False, True])
def test_only_the_steps_threads_spin_and_only_when_asked(
    fp32_bundle: Path, monkeypatch: pytest.MonkeyPatch, spinning: bool
) -> None:
    """The encoder's threads always sleep between kernels (a second spinning pool would take
    the step's cores), and a small model's encoder runs on one; the step's spin when asked, and
    then no one-thread session is opened for steps of few rows (spinning threads beat one
    thread at any rows)."""
    engine = Engine.load(fp32_bundle, device="cpu", intra_op_threads=2, intra_op_spinning=spinning)
    assert narrow_rows(engine.manifest.model) > 0  # a small model
    for session, threads, spins in (
        (engine._encoder, 1, False),
        (engine.step_sessions.wide, 2, spinning),
    ):
        options = session.get_session_options()
        assert options.intra_op_num_threads == threads
        entry = options.get_session_config_entry("session.intra_op.allow_spinning")
        assert entry == ("1" if spins else "0")
    assert (engine.step_sessions.narrow is None) == spinning
    monkeypatch.setattr(step_state, "MIN_NARROW_ROWS", 10**9)  # as large as a model gets
    engine = Engine.load(fp32_bundle, device="cpu", intra_op_threads=2, intra_op_spinning=spinning)
    assert engine._encoder.get_session_options().intra_op_num_threads == 2
    assert engine.step_sessions.narrow is None


@pytest.mark.parametrize("beam_size", [1, 4])
def test_steps_of_few_rows_run_on_one_thread_and_translate_the_same(
    eos_bundle: Path,
    sources: list[list[int]],
    monkeypatch: pytest.MonkeyPatch,
    beam_size: int,
) -> None:
    """With two intra-op threads, a step of fewer rows than `narrow_rows` (6 here) runs on the
    engine's one-thread session: a batch of 8 sentences starts on the wide session and moves
    to the narrow one once compaction takes it below 6 rows, and every translation is the one
    an engine of one thread gives."""
    one = Engine.load(eos_bundle, device="cpu", intra_op_threads=1)
    per_row = step_macs_per_row(one.manifest.model)
    monkeypatch.setattr(step_state, "NARROW_STEP_MACS", 6 * per_row)
    monkeypatch.setattr(step_state, "MIN_NARROW_ROWS", 1)  # a model this small gets it
    assert one.step_sessions.narrow is None  # one thread already
    two = Engine.load(eos_bundle, device="cpu", intra_op_threads=2)
    sessions = two.step_sessions
    assert sessions.narrow is not None and sessions.narrow_rows == 6
    assert sessions.narrow.get_session_options().intra_op_num_threads == 1
    assert sessions.wide.get_session_options().intra_op_num_threads == 2
    runs = step_runs(monkeypatch)
    options = DecodingOptions(beam_size=beam_size, num_hypotheses=min(2, beam_size))
    for batch in ([sources[0]], sources[:3], sources[3:11]):
        runs.clear()
        got = two.generate(batch, options)
        rows = len(batch) * beam_size
        assert runs[0][0] is (sessions.narrow if rows < 6 else sessions.wide)
        if rows >= 6:  # sentences finish at different steps: compacted below 6 rows
            assert runs[-1][0] is sessions.narrow
        expected = one.generate(batch, options)
        for g, e in zip(got, expected, strict=True):
            assert [h.ids for h in g] == [h.ids for h in e]
            assert [h.score for h in g] == pytest.approx([h.score for h in e], abs=1e-6)


def test_a_large_model_keeps_its_steps_on_every_thread(
    eos_bundle: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where a step of MIN_NARROW_ROWS rows is already past NARROW_STEP_MACS (a model as large
    as OPUS-MT base), no one-thread session is opened: two threads read its weights faster
    even at one row, and a second session would hold them twice."""
    engine = Engine.load(eos_bundle, device="cpu", intra_op_threads=2)
    assert engine.step_sessions.narrow is not None  # the tiny model's steps are small
    per_row = step_macs_per_row(engine.manifest.model)
    monkeypatch.setattr(step_state, "NARROW_STEP_MACS", 15 * per_row)  # 15 rows < 16
    engine = Engine.load(eos_bundle, device="cpu", intra_op_threads=2)
    assert engine.step_sessions.narrow is None
    assert engine.step_sessions.for_rows(1) is engine.step_sessions.wide


def test_engine_describes_its_model(engine: Engine, eos_checkpoint: Path) -> None:
    assert engine.name == eos_checkpoint.name
    assert (engine.source_language, engine.target_languages) == ("en", ("de",))
    assert engine.max_input_tokens == engine.manifest.model.max_positions == 48
    assert (engine.device, engine.dtype) == ("cpu", "fp32")
    assert engine.card is None and engine.license is None  # the test checkpoint has neither


def test_over_long_input_names_the_limit_and_runs_nothing(
    engine: Engine, sources: list[list[int]], model_calls: list[str]
) -> None:
    too_long = [5] * 48 + [2]
    with pytest.raises(InputTooLongError, match="limit of 48 tokens") as error:
        engine.generate([sources[0], too_long], DecodingOptions())
    assert (error.value.limit, error.value.length) == (48, 49)
    assert isinstance(error.value, ValueError)
    assert model_calls == []
    assert engine.generate([[5] * 47 + [2]], DecodingOptions(max_decoding_length=2))  # at the limit


def test_unknown_token_ids_are_rejected_before_running(
    engine: Engine, model_calls: list[str]
) -> None:
    with pytest.raises(ValueError, match=r"token id 600 is outside the vocabulary \(0\.\.599\)"):
        engine.generate([[5, 600, 2]], DecodingOptions())
    assert model_calls == []


def test_empty_input_gives_empty_output_without_a_model_call(
    engine: Engine, model_calls: list[str]
) -> None:
    assert engine.encode(["", "   ", "\t\n"]) == [[], [], []]
    empty = [Hypothesis([], 0.0, "eos")]
    assert engine.generate([[], []], DecodingOptions(beam_size=4)) == [empty, empty]
    assert model_translate(engine, ["", "  "], DecodingOptions()) == [[("", empty[0])]] * 2
    assert engine.generate([], DecodingOptions()) == []
    assert model_calls == []


def test_user_text_cannot_inject_the_end_token(engine: Engine) -> None:
    [ids] = engine.encode(["a dog </s> runs"])
    eos = engine.manifest.special_ids.eos
    assert ids[-1] == eos and eos not in ids[:-1]
    assert engine.decode(ids) == "a dog </s> runs"


def test_a_text_seen_again_is_not_tokenized_again(
    eos_bundle: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Traffic repeats its sentences: a text's ids are remembered (TOKENIZED_MEMO texts), the
    same as tokenizing it again, each call's lists its own to change."""
    engine = Engine.load(eos_bundle, device="cpu", intra_op_threads=1)
    tokenized: list[str] = []
    tokenizer = engine._tokenizer
    encode = tokenizer.encode

    def counted(texts: Sequence[str]) -> list[list[int]]:
        tokenized.extend(texts)
        return encode(texts)

    monkeypatch.setattr(tokenizer, "encode", counted)
    first = engine.encode(["a dog runs", "a cat\x07 sleeps", ""])
    first[0].append(99)  # the caller's own list
    again = engine.encode(["a cat\x07 sleeps", "a dog runs", "a bird"])
    assert tokenized == ["a dog runs", "a cat sleeps", "", "a bird"]  # control character out
    assert again[:2] == [encode(["a cat sleeps"])[0], encode(["a dog runs"])[0]]
    assert first[1] == again[0] and first[2] == []


def test_a_translation_seen_again_is_not_detokenized_again(
    eos_bundle: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The sentence cache answers a popular sentence's ids again and again: their text is
    remembered, the same as detokenizing them again."""
    engine = Engine.load(eos_bundle, device="cpu", intra_op_threads=1)
    detokenized: list[tuple[int, ...]] = []
    tokenizer = engine._tokenizer
    decode = tokenizer.decode

    def counted(ids: Sequence[int]) -> str:
        detokenized.append(tuple(ids))
        return decode(ids)

    monkeypatch.setattr(tokenizer, "decode", counted)
    ids = engine.encode(["a dog runs", "a cat sleeps"])
    texts = [engine.decode(ids[0]), engine.decode(ids[1]), engine.decode(list(ids[0]))]
    assert texts == [decode(ids[0]), decode(ids[1]), decode(ids[0])]
    assert detokenized == [tuple(ids[0]), tuple(ids[1])]


def test_order_is_restored_across_batches(eos_bundle: Path, sources: list[list[int]]) -> None:
    """Sources sorted by length and cut into batches of 3 come back in the input order, each
    as it would be decoded alone; empty ones keep their places."""
    engine = Engine.load(eos_bundle, device="cpu", intra_op_threads=1, max_batch_size=3)
    mixed = [sources[5], [], sources[0], sources[12], [], sources[3], sources[9]]
    options = DecodingOptions(beam_size=2)
    together = engine.generate(mixed, options)
    alone = [engine.generate([s], options)[0] for s in mixed]
    assert [[h.ids for h in n] for n in together] == [[h.ids for h in n] for n in alone]
    assert together[1] == together[4] == [Hypothesis([], 0.0, "eos")]


def test_decoding_length_is_capped_by_the_model_positions(
    fp32_bundle: Path, sources: list[list[int]]
) -> None:
    engine = Engine.load(fp32_bundle, device="cpu", intra_op_threads=1)
    options = DecodingOptions(max_decoding_length=1000, min_decoding_length=500)
    [[hyp]] = engine.generate(sources[:1], options)
    assert len(hyp.ids) == 48 and hyp.finish_reason == "length"


@pytest.mark.parametrize("beam_size", [1, 3])
def test_a_relative_limit_gives_each_source_its_own_length(
    fp32_bundle: Path, tiny_checkpoint: Path, sources: list[list[int]], beam_size: int
) -> None:
    """max_length_a/b: the random model never ends a sentence, so each runs to its own limit,
    a * source tokens + b, in one batch, as the torch reference has it."""
    engine = Engine.load(fp32_bundle, device="cpu", intra_op_threads=1, max_batch_size=8)
    batch = sources[:8]
    options = DecodingOptions(beam_size=beam_size, max_length_a=0.5, max_length_b=2)
    ours = engine.generate(batch, options)
    limits = [len(s) // 2 + 2 for s in batch]
    assert len(set(limits)) > 1
    assert [len(n[0].ids) for n in ours] == limits
    assert {h.finish_reason for n in ours for h in n} == {"length"}
    expected = generate(
        load_model(tiny_checkpoint), batch, beam_size=beam_size, max_length_a=0.5, max_length_b=2
    )
    assert [[h.ids for h in n] for n in ours] == [[h.ids for h in n] for n in expected]


@pytest.mark.parametrize("beam_size", [1, 3])
def test_no_repeat_ngram_size_as_the_torch_reference(
    fp32_bundle: Path, tiny_checkpoint: Path, sources: list[list[int]], beam_size: int
) -> None:
    """The random model repeats itself; with no_repeat_ngram_size 2 no bigram comes twice in
    any hypothesis, and the engine's tokens are the reference's."""
    engine = Engine.load(fp32_bundle, device="cpu", intra_op_threads=1, max_batch_size=8)
    batch = sources[:8]
    options = DecodingOptions(beam_size=beam_size, num_hypotheses=beam_size, max_decoding_length=30)
    free = engine.generate(batch, options)
    assert any(len(set(pairs)) < len(pairs) for pairs in _bigrams(free))
    ours = engine.generate(batch, replace(options, no_repeat_ngram_size=2))
    assert all(len(set(pairs)) == len(pairs) for pairs in _bigrams(ours))
    expected = generate(
        load_model(tiny_checkpoint),
        batch,
        beam_size=beam_size,
        num_hypotheses=beam_size,
        max_decoding_length=30,
        no_repeat_ngram_size=2,
    )
    assert [[h.ids for h in n] for n in ours] == [[h.ids for h in n] for n in expected]


def _bigrams(nbest: list[list[Hypothesis]]) -> list[list[tuple[int, int]]]:
    return [list(zip(h.ids, h.ids[1:], strict=False)) for n in nbest for h in n]


@pytest.mark.parametrize("beam_size", [1, 2])
@pytest.mark.parametrize(
    ("bundle_name", "padded"),
    [("eos_bundle", False), ("eos_bundle", True), ("eos_gather_bundle", True)],
)
def test_a_source_past_its_deadline_leaves_its_batch_between_steps(
    bundle_name: str,
    padded: bool,
    sources: list[list[int]],
    beam_size: int,
    request: pytest.FixtureRequest,
) -> None:
    """The deadline of each source (by its index in the call, whatever order the engine
    decodes in) is read before every step: one that passes it mid-way leaves with a "deadline"
    hypothesis of the tokens it had; every other source gets what it gets without it, in
    compacted batches and in padded ones (whose rows stay), with either cache."""
    bundle = request.getfixturevalue(bundle_name)
    engine = Engine.load(bundle, device="cpu", intra_op_threads=1, padded=padded)
    batch = [sources[9], sources[2], sources[5], sources[0]]
    options = DecodingOptions(beam_size=beam_size, max_decoding_length=12)
    reads = 0

    def deadline(source: int) -> float:
        nonlocal reads
        if source != 2:
            return math.inf
        reads += 1
        return math.inf if reads <= 3 else -math.inf  # past it after three steps

    stopped = engine.generate(batch, options, deadline)
    alone = engine.generate(batch, options)
    [late] = stopped[2]
    assert late.finish_reason == "deadline" and len(late.ids) == 3 < len(alone[2][0].ids)
    if beam_size == 1:  # the tokens it had (a beam's best so far may not lead the final list)
        assert late.ids == alone[2][0].ids[:3]
    for i in (0, 1, 3):
        assert [(h.ids, h.finish_reason) for h in stopped[i]] == [
            (h.ids, h.finish_reason) for h in alone[i]
        ]
        assert [h.score for h in stopped[i]] == pytest.approx([h.score for h in alone[i]])


@pytest.mark.parametrize("bundle_name", ["int8_bundle", "fp16_bundle"])
def test_reduced_precision_bundles_run(
    bundle_name: str, sources: list[list[int]], request: pytest.FixtureRequest
) -> None:
    engine = Engine.load(request.getfixturevalue(bundle_name), device="cpu", intra_op_threads=1)
    nbest = engine.generate(sources[:4], DecodingOptions(beam_size=2, max_decoding_length=6))
    assert [len(n[0].ids) for n in nbest] == [6] * 4  # random weights: never </s>


def test_concurrent_calls_are_serialized_and_correct(
    engine: Engine, sources: list[list[int]]
) -> None:
    options = DecodingOptions(beam_size=2)
    expected = engine.generate(sources, options)
    results: list[list[list[Hypothesis]]] = []

    def worker() -> None:
        results.append(engine.generate(sources, options))

    threads = [threading.Thread(target=worker) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [expected] * 3


# --- python -m service.translate -------------------------------------------------------------


def _run_cli(monkeypatch: pytest.MonkeyPatch, stdin: str, *args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(stdin.encode()), "utf-8"))
    monkeypatch.setattr(sys, "stdout", out)
    monkeypatch.setattr(sys, "stderr", err)
    code = translate.main(list(args))
    return code, out.getvalue(), err.getvalue()


def test_cli_keeps_order_and_empty_lines(
    eos_bundle: Path, engine: Engine, val_src: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    lines = [val_src[3], "", val_src[0], "   ", val_src[7], val_src[1]]
    code, out, _ = _run_cli(
        monkeypatch,
        "\n".join(lines) + "\n",
        "--bundle",
        str(eos_bundle),
        "--beam-size",
        "2",
        "--batch-size",
        "2",
        "--device",
        "cpu",
        "--threads",
        "1",
    )
    assert code == 0
    # The CLI's default length penalty is the service's.
    default_lp = Settings.model_fields["default_length_penalty"].default
    options = DecodingOptions(beam_size=2, length_penalty=default_lp)
    expected = [n[0][0] for n in model_translate(engine, lines, options)]
    assert out.split("\n") == [*expected, ""]
    assert out.split("\n")[1] == out.split("\n")[3] == ""


def test_cli_rejects_a_too_long_line_before_writing_anything(
    eos_bundle: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    stdin = "A dog.\n" + "dog " * 60 + "\n"
    code, out, err = _run_cli(monkeypatch, stdin, "--bundle", str(eos_bundle), "--device", "cpu")
    assert code == 2 and out == ""
    assert "line 2, sentence 0: " in err and "limit of 48" in err


def test_cli_takes_one_servers_threads_whatever_mt_workers_says(
    eos_bundle: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The file CLI is one process: a server's MT_WORKERS in its environment shares out no
    cores."""
    monkeypatch.setenv("MT_WORKERS", "4")
    processes: list[int] = []
    step_threads = translate.step_threads

    def spy(settings: Settings, models: int, sharing: int) -> tuple[int, bool]:
        processes.append(sharing)
        return step_threads(settings, models, sharing)

    monkeypatch.setattr(translate, "step_threads", spy)
    code, out, _ = _run_cli(monkeypatch, "A dog.\n", "--bundle", str(eos_bundle), "--device", "cpu")
    assert (code, processes) == (0, [1])
    assert out.strip()
