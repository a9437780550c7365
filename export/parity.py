"""Torch vs ONNX Runtime parity of an fp32 bundle.

    python -m export.parity --checkpoint DIR --bundle BUNDLE --src FILE [--n 200]
        [--beam-size 4] [--batch-size 32] [--threads 1]

Checks, with ONNX Runtime on CPU, and collects every failure before failing once:
1. the bundle was exported from this checkpoint (weights sha256);
2. every encoder output (memory, cross keys/values) on a padded batch, within TOLERANCE;
3. every decoder-step output (log_probs, the top-k candidates, the keys/values written into the
   cache) for several steps, starting from an empty cache, on the same padded batch, each side
   feeding back its own cache;
4. greedy and beam search give the same tokens: the search code of model/search.py drives both,
   once with the torch `CachedStepper` and once with `OrtStepper` below (over the service's
   `StaticCacheState`, so beams move through the cache indirection as they do in serving).

The last stdout line is a JSON summary; the exit status is 1 when any check failed.
fp16 and int8 bundles are judged by BLEU instead (python -m export.quantize).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Unpack

import numpy as np
import onnxruntime as ort
import torch
from torch import Tensor

from model.data import DataError, pad, read_lines
from model.search import decode_batches, generate
from model.transformer import WEIGHTS_FILE, Transformer, load_model
from service.bundle.decoding import Hypothesis, OptionFields, options_within
from service.bundle.manifest import (
    ALIGNMENT,
    ATTENTION_MASK,
    INPUT_IDS,
    LOG_PROBS,
    MEMORY,
    TOP_IDS,
    TOP_LOG_PROBS,
    Bundle,
    BundleError,
    cross_key,
    cross_names,
    cross_value,
    load_bundle,
    past_key,
    past_value,
    present_key,
    present_value,
    sha256_file,
)
from service.bundle.tokenizer import load_tokenizer
from service.inference.shortlist import Shortlist, batch_inputs
from service.inference.step_state import BufferPool, StaticCacheState, StepSessions, cross_inputs

log = logging.getLogger(__name__)

TOLERANCE = 1e-4  # max abs difference of any fp32 output, log-probs included
_PROBE_TOP_K = 8  # candidates per row compared in the decoder-step check
_MAX_EXAMPLES = 5  # token mismatches spelled out in the failures; the rest are counted

Arrays = dict[str, np.ndarray]


@dataclass(frozen=True)
class OrtBundle:
    """A verified bundle with its two ONNX Runtime sessions."""

    bundle: Bundle
    encoder: ort.InferenceSession
    decoder_step: ort.InferenceSession

    def encode(self, input_ids: np.ndarray, attention_mask: np.ndarray) -> Arrays:
        """(B, S) ids and mask -> every encoder output by name."""
        names = self.bundle.manifest.encoder.output_names
        outputs = self.encoder.run(names, {INPUT_IDS: input_ids, ATTENTION_MASK: attention_mask})
        return dict(zip(names, outputs, strict=True))


def open_bundle(
    directory: str | Path,
    *,
    threads: int = 1,
    providers: Sequence[str] = ("CPUExecutionProvider",),
) -> OrtBundle:
    """Verify the bundle's files, open both graphs and check their tensor names."""
    bundle = load_bundle(directory)
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    sessions = []
    for graph in (bundle.manifest.encoder, bundle.manifest.decoder_step):
        try:
            session = ort.InferenceSession(
                str(bundle.path(graph.file)), options, providers=list(providers)
            )
        except Exception as e:  # ORT raises its own untyped errors for unreadable graphs
            raise BundleError(f"{bundle.path(graph.file)}: ONNX Runtime cannot load it: {e}") from e
        bundle.check_graph_io(
            graph,
            [i.name for i in session.get_inputs()],
            [o.name for o in session.get_outputs()],
        )
        sessions.append(session)
    return OrtBundle(bundle, *sessions)


class OrtStepper:
    """model/search.py's Stepper over the decoder-step graph: the same search code that drives
    the torch model drives ONNX Runtime, so any token difference is the graphs' doing. The
    graph's cache, indirection and bindings are the service's own (`StaticCacheState`), so this
    checks them too; the torch search reads the whole log_probs, the probe the top-k."""

    def __init__(
        self,
        ort_bundle: OrtBundle,
        encoded: Arrays,
        attention_mask: np.ndarray,
        *,
        beam_size: int = 1,
        max_decoding_length: int,
        top_k: int = 1,
        input_ids: np.ndarray | None = None,
    ) -> None:
        """`encoded` holds at least the cross keys/values, one row per sentence (per row of the
        mask), shared by the sentence's beams. `input_ids` (the mask's shape): the sources,
        which a bundle with a vocabulary shortlist needs (each sentence's ids)."""
        manifest = ort_bundle.bundle.manifest
        names = cross_names(manifest.model.decoder_layers)
        shortlist, inputs = Shortlist.load(ort_bundle.bundle), None
        if shortlist is not None:  # each sentence's ids, from its source's
            if input_ids is None:
                raise ValueError("a bundle with a shortlist needs the sentences' input ids")
            sources = zip(input_ids, attention_mask != 0, strict=True)
            inputs = batch_inputs([shortlist.candidates(ids[kept]) for ids, kept in sources])
        self.state = StaticCacheState(
            StepSessions(ort_bundle.decoder_step),
            manifest,
            BufferPool(),
            cross_inputs(manifest, [encoded[name] for name in names]),
            attention_mask,
            sentences=attention_mask.shape[0],
            beam_size=beam_size,
            capacity=max_decoding_length,
            limit=max_decoding_length,
            padded=False,
            shortlist=inputs,
        )
        self.top_k = top_k
        # (top_log_probs, top_ids) of the last step, (R, top_k) each
        self.top: tuple[np.ndarray, np.ndarray] = (np.empty((0, 0)), np.empty((0, 0)))

    def step(self, tokens: Tensor) -> Tensor:
        self.top = self.state.step(tokens.cpu().numpy().astype(np.int64), self.top_k)
        return torch.from_numpy(self.state.log_probs())  # (R, V)

    def select(self, rows: Tensor, sentences: Tensor) -> None:
        self.state.select(rows.cpu().numpy(), sentences.cpu().numpy())

    def reorder(self, rows: Tensor) -> None:
        self.state.reorder(rows.cpu().numpy())


def ort_generate(
    ort_bundle: OrtBundle,
    sources: Sequence[Sequence[int]],
    *,
    batch_size: int = 64,
    **options: Unpack[OptionFields],
) -> list[list[Hypothesis]]:
    """model.search.generate with ONNX Runtime in place of the model: same sorting, batching and
    search functions, so its n-best lists must equal torch's token for token."""
    manifest = ort_bundle.bundle.manifest
    decoding = options_within(manifest.model.max_positions, **options)
    ids = manifest.special_ids

    def make_stepper(batch: Tensor) -> OrtStepper:
        src = batch.numpy()  # (B, S)
        mask = (src != ids.pad).astype(np.int64)  # (B, S)
        return OrtStepper(
            ort_bundle,
            ort_bundle.encode(src, mask),
            mask,
            beam_size=decoding.beam_size,
            max_decoding_length=decoding.max_decoding_length,
            input_ids=src,
        )

    return decode_batches(
        make_stepper,
        sources,
        decoding,
        batch_size=batch_size,
        pad_id=ids.pad,
        bos_id=ids.bos,
        eos_id=ids.eos,
    )


def encode_sources(
    ort_bundle: OrtBundle, lines: Sequence[str]
) -> tuple[list[list[int]], list[int]]:
    """Token ids + </s> of the lines that fit max_positions, and which lines those are.

    Longer lines are left out rather than truncated: neither side can encode them.
    """
    limit = ort_bundle.bundle.manifest.model.max_positions
    sources, kept = [], []
    for i, ids in enumerate(load_tokenizer(ort_bundle.bundle).encode(lines)):
        if len(ids) <= limit:
            sources.append(ids)
            kept.append(i)
    if len(kept) < len(lines):
        log.info(
            "left out %d of %d lines longer than %d tokens",
            len(lines) - len(kept),
            len(lines),
            limit,
        )
    return sources, kept


def decode_texts(
    ort_bundle: OrtBundle, lines: Sequence[str], *, beam_size: int, batch_size: int
) -> tuple[list[str], list[list[int]], list[int]]:
    """Translate with ONNX Runtime: (texts, token ids, indices of the lines translated)."""
    sources, kept = encode_sources(ort_bundle, lines)
    nbest = ort_generate(ort_bundle, sources, beam_size=beam_size, batch_size=batch_size)
    tokens = [hyps[0].ids for hyps in nbest]
    tokenizer = load_tokenizer(ort_bundle.bundle)
    return [tokenizer.decode(t) for t in tokens], tokens, kept


@dataclass
class ParityReport:
    ok: bool = True
    max_abs_diff: float = 0.0
    tolerance: float = TOLERANCE
    tokens_equal: bool = True
    max_abs_diff_by_tensor: dict[str, float] = field(default_factory=dict)
    mismatched_sentences: dict[str, int] = field(default_factory=dict)
    n_sentences: int = 0
    beam_size: int = 4
    failures: list[str] = field(default_factory=list)

    def fail(self, message: str) -> None:
        self.ok = False
        self.failures.append(message)

    def compare(self, name: str, expected: Tensor, actual: np.ndarray, where: str) -> None:
        """Record the max abs difference of one output; a failure when over the tolerance."""
        if tuple(expected.shape) != actual.shape:
            self.fail(f"{where}: {name} has shape {actual.shape}, torch {tuple(expected.shape)}")
            return
        e, a = expected.float().numpy(), actual.astype(np.float32)
        # Equal values count as no difference, equal infinities included (suppressed tokens).
        with np.errstate(invalid="ignore"):  # inf - inf, which np.where then drops
            diff = float(np.abs(np.where(e == a, 0.0, e - a)).max(initial=0.0))
        self.max_abs_diff = max(self.max_abs_diff, diff)
        self.max_abs_diff_by_tensor[name] = max(self.max_abs_diff_by_tensor.get(name, 0.0), diff)
        if not diff <= self.tolerance:  # also catches NaN
            self.fail(f"{where}: {name} max abs diff {diff:.3g} > {self.tolerance:g}")

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))


@torch.inference_mode()
def check_parity(
    model: Transformer,
    ort_bundle: OrtBundle,
    sources: Sequence[Sequence[int]],
    *,
    beam_size: int = 4,
    batch_size: int = 32,
    probe_rows: int = 8,
    probe_steps: int = 4,
    tolerance: float = TOLERANCE,
) -> ParityReport:
    """Compare every graph output on a padded probe batch, then greedy and beam tokens on all
    `sources` (ids ending in </s>, each within max_positions)."""
    if ort_bundle.bundle.manifest.shortlist is not None:
        raise BundleError(
            f"{ort_bundle.bundle.directory} scores a vocabulary shortlist, which changes the "
            "model's outputs by design: check the bundle exported without --shortlist, and this "
            "one against it with `python -m export.quantize --bundle B --reference FULL`"
        )
    report = ParityReport(tolerance=tolerance, n_sentences=len(sources), beam_size=beam_size)
    # An error inside ONNX Runtime is one more failure to report, not a reason to skip the rest.
    try:
        _check_outputs(model, ort_bundle, _probe_batch(sources, probe_rows), probe_steps, report)
    except Exception as e:
        report.fail(f"outputs: {type(e).__name__}: {e}")
    for kind, size in (("greedy", 1), (f"beam{beam_size}", beam_size)):
        try:
            _check_tokens(model, ort_bundle, sources, kind, size, batch_size, report)
        except Exception as e:
            report.tokens_equal = False
            report.fail(f"{kind}: {type(e).__name__}: {e}")
    return report


def _check_tokens(
    model: Transformer,
    ort_bundle: OrtBundle,
    sources: Sequence[Sequence[int]],
    kind: str,
    beam_size: int,
    batch_size: int,
    report: ParityReport,
) -> None:
    expected = generate(model, sources, beam_size=beam_size, batch_size=batch_size)
    actual = ort_generate(ort_bundle, sources, beam_size=beam_size, batch_size=batch_size)
    mismatched = [
        i
        for i, (e, a) in enumerate(zip(expected, actual, strict=True))
        if [h.ids for h in e] != [h.ids for h in a]
    ]
    report.mismatched_sentences[kind] = len(mismatched)
    if mismatched:
        report.tokens_equal = False
        report.fail(f"{kind}: {len(mismatched)} of {len(sources)} sentences differ")
    for i in mismatched[:_MAX_EXAMPLES]:
        report.fail(f"{kind}: sentence {i}: torch {expected[i][0].ids} onnx {actual[i][0].ids}")


def _probe_batch(sources: Sequence[Sequence[int]], rows: int) -> list[Sequence[int]]:
    """Up to `rows` non-empty sources spread over the length range, so the batch is padded."""
    by_length = sorted((s for s in sources if s), key=len)
    if len(by_length) <= rows:
        return by_length
    return [by_length[round(i * (len(by_length) - 1) / (rows - 1))] for i in range(rows)]


def _check_outputs(
    model: Transformer,
    ort_bundle: OrtBundle,
    probe: Sequence[Sequence[int]],
    steps: int,
    report: ParityReport,
) -> None:
    if not probe:
        return
    n, config = model.config.n_decoder_layers, model.config
    src = pad(probe, pad_id=config.pad_id)  # (B, S)
    src_mask = model.source_mask(src)  # (B, 1, 1, S)
    attention_mask = (src != config.pad_id).long().numpy()  # (B, S)
    where = f"encoder (batch {tuple(src.shape)}, padded)"
    memory = model.encode(src, src_mask)  # (B, S, d_model)
    cache = model.init_cache(memory)
    encoded = ort_bundle.encode(src.numpy(), attention_mask)
    report.compare(MEMORY, memory, encoded[MEMORY], where)
    for i in range(n):
        report.compare(cross_key(i), cache.cross_k[i], encoded[cross_key(i)], where)
        report.compare(cross_value(i), cache.cross_v[i], encoded[cross_value(i)], where)

    top_k = min(_PROBE_TOP_K, config.decoder_vocab_size)
    stepper = OrtStepper(
        ort_bundle, encoded, attention_mask, max_decoding_length=steps, top_k=top_k
    )
    tokens = torch.full((src.size(0),), config.bos_id, dtype=torch.long)  # (B,)
    inputs: list[Tensor] = []  # each step's tokens, (B,)
    aligned: list[np.ndarray] = []  # each step's alignment output, (B, S)
    for step in range(steps):
        where = f"decoder_step {step} (past length {step})"
        expected, cache = model.decode_step(tokens, cache, src_mask)  # (B, V)
        log_probs = stepper.step(tokens).numpy()
        inputs.append(tokens)
        alignment = stepper.state.alignment()
        if alignment is not None:
            aligned.append(alignment)
        report.compare(LOG_PROBS, expected, log_probs, where)
        top_log_probs, top_ids = stepper.top
        report.compare(TOP_LOG_PROBS, expected.topk(top_k).values, top_log_probs, where)
        # The ids may swap where two candidates are within rounding; the values may not.
        at_ids = torch.from_numpy(np.take_along_axis(log_probs, top_ids, -1))
        report.compare(TOP_IDS, at_ids, top_log_probs, where)
        # The present keys/values are the cache written in place (the past of the next step).
        for i in range(n):
            report.compare(present_key(i), cache.self_k[i], stepper.state.cache(past_key(i)), where)
            report.compare(
                present_value(i), cache.self_v[i], stepper.state.cache(past_value(i)), where
            )
        tokens = expected.argmax(dim=-1)  # both sides continue with torch's greedy choice
    if aligned:  # the steps' alignment rows: the model's, teacher-forced on the same tokens
        _, expected_alignment = model.decode_aligned(torch.stack(inputs, dim=1), memory, src_mask)
        where = f"decoder_step alignment, steps 0-{steps - 1}"
        report.compare(ALIGNMENT, expected_alignment, np.stack(aligned, axis=1), where)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m export.parity", description="torch vs ONNX Runtime parity of a bundle."
    )
    p.add_argument("--checkpoint", required=True, type=Path)
    p.add_argument("--bundle", required=True, type=Path)
    p.add_argument("--src", required=True, help="source sentences, plain or .gz")
    p.add_argument("--n", type=int, default=200, help="first N sentences (default 200)")
    p.add_argument("--beam-size", type=int, default=4)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--threads", type=int, default=1, help="CPU threads, torch and ORT (default 1)")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    torch.set_num_threads(args.threads)
    try:
        model = load_model(args.checkpoint)
        ort_bundle = open_bundle(args.bundle, threads=args.threads)
        lines = read_lines(args.src)[: args.n]
    except (BundleError, DataError, FileNotFoundError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    manifest = ort_bundle.bundle.manifest
    if manifest.dtype != "fp32":
        print(
            f"error: {args.bundle} is {manifest.dtype}; parity is exact for fp32 only, compare "
            "fp16/int8 by BLEU with python -m export.quantize",
            file=sys.stderr,
        )
        return 2
    sources, _ = encode_sources(ort_bundle, lines)
    report = check_parity(
        model, ort_bundle, sources, beam_size=args.beam_size, batch_size=args.batch_size
    )
    weights = args.checkpoint / WEIGHTS_FILE
    if sha256_file(weights) != manifest.provenance.checkpoint_sha256:
        report.fail(f"{args.bundle} was exported from other weights than {weights}")
    print(report.to_json())
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
