"""Speed and memory of the engine against the torch reference loops and CTranslate2, in one run.

    python -m benchmarks.engine_bench --checkpoint checkpoints/multi30k-en-de \\
        --bundle-fp32 BUNDLE [--bundle-int8 BUNDLE] [--bundle-fp16 BUNDLE] [--src FILE] \\
        [--n 500] [--threads 2] [--intra-op-spinning] [--device cpu|cuda] \\
        [--batch-sizes 1 32] [--beam-sizes 1 4] \\
        [--repeat 3] [--systems NAME ...] [--json FILE] [--hf-dir DIR] [--length N]

Systems: torch-uncached (model.search with the decoder re-run on the whole prefix each step),
torch-cached (decode_step with the key/value cache), both on --device; engine-fp32 /
engine-int8 / engine-fp16 (this service's engine on --device), engine-fp32-graphs /
engine-fp16-graphs (the same with CUDA graphs), engine-fp32-cpu (the engine on the CPU whatever
--device, to hold a GPU's outputs to the CPU's); ct2-fp32 / ct2-int8, and on a GPU ct2-fp16 /
ct2-int8-fp16 (CTranslate2 on the same weights and --device, converted by
benchmarks/ct2_convert.py; an optional, benchmark-only dependency);
transformers (generate on --device, for a checkpoint imported from transformers' format:
--hf-dir, which CTranslate2 then converts with its own TransformersConverter; run by default
when --hf-dir is given). benchmarks/gpu_bench.py runs the GPU set of these,
benchmarks/marian_bench.py the CPU set on a base-size Marian model.

Method, so the numbers compare like with like:
- The first N lines of --src are tokenized once with the bundle's tokenizer; lines over the
  model's input limit are left out. Every system decodes the same id sequences in the same
  batches (sorted by length, then cut), greedy and beam with the same length penalty (1.0),
  max length (the model's positions) and no minimum length; or, with --length N, exactly N
  tokens per sentence (min = max), so that every system does the same work whatever its
  weights make of the sentence.
- Each system runs in its own Python process, so one's imports (torch or not) and allocator
  state never count against another's. Peak memory is the process's peak RSS (VmHWM), reset
  through /proc/self/clear_refs before each configuration: what the host must provision,
  libraries and weights included. "load RSS" is the RSS after loading and one warm-up batch.
- Time is wall clock over generation only (no tokenization, no loading), after the warm-up: the
  median of --repeat passes over all the sentences (a shared machine drifts by 10-20 % between
  single passes). Target tokens exclude </s>. Ratios are against engine-fp32 in the same
  configuration. At batch 1, greedy, "ms/step" is the time per decoder step (one per target
  token and one for </s>), search included.
- "same" counts sentences whose output equals engine-fp32's: torch and CTranslate2 fp32 greedy
  must match on every sentence (same model, same search); int8 and CTranslate2 beam search (its
  own beam rules) may differ.
The last stdout line is a JSON object with every measurement (--json also writes it to a file).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from benchmarks.paths import MULTI30K, REPO

DEFAULT_SRC = MULTI30K / "test_2016_flickr.en.gz"
CPU_SYSTEMS = (
    "torch-uncached",
    "torch-cached",
    "engine-fp32",
    "engine-int8",
    "ct2-fp32",
    "ct2-int8",
)
SYSTEMS = (
    *CPU_SYSTEMS,
    "transformers",
    "engine-fp16",
    "engine-fp32-graphs",
    "engine-fp16-graphs",
    "engine-fp32-cpu",
    "ct2-fp16",
    "ct2-int8-fp16",
)
# CTranslate2's compute type of each ct2 system (fp16 and int8-fp16 run on a GPU only).
CT2_COMPUTE_TYPES = {
    "ct2-fp32": "float32",
    "ct2-int8": "int8",
    "ct2-fp16": "float16",
    "ct2-int8-fp16": "int8_float16",
}
REFERENCE = "engine-fp32"

Decode = Callable[[list[list[int]], int], list[list[int]]]  # (batch, beam size) -> ids per row


def read_lines(path: Path) -> list[str]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        return [line.rstrip("\n") for line in f]


def batch_indices(sources: Sequence[Sequence[int]], batch_size: int) -> list[list[int]]:
    """Indices of `sources`, sorted by length and cut into batches: the same for every system."""
    order = sorted(range(len(sources)), key=lambda i: len(sources[i]))
    return [order[i : i + batch_size] for i in range(0, len(order), batch_size)]


def _memory_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field}")


def _reset_peak() -> bool:
    """Reset VmHWM to the current RSS (Linux >= 4.0); False where that is not allowed."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return False
    return True


# --- Worker: one system, every configuration ---------------------------------------------------


def _lengths(args: argparse.Namespace, max_positions: int) -> tuple[int, int]:
    """(min, max) target tokens per sentence: exactly --length, else 0 to the positions."""
    return (args.length, args.length) if args.length else (0, max_positions)


def _load_system(system: str, args: argparse.Namespace, max_positions: int) -> Decode:
    min_length, max_length = _lengths(args, max_positions)
    if system.startswith("torch-"):
        import torch

        from model.search import generate
        from model.transformer import load_model

        torch.set_num_threads(args.threads)
        model = load_model(args.checkpoint, device=args.device)
        kind = system.removeprefix("torch-")

        def decode_torch(batch: list[list[int]], beam: int) -> list[list[int]]:
            nbest = generate(
                model,
                batch,
                beam_size=beam,
                batch_size=len(batch),
                decoder=kind,
                max_decoding_length=max_length,
                min_decoding_length=min_length,
            )
            return [n[0].ids for n in nbest]

        return decode_torch

    if system == "transformers":
        return _load_transformers(args, min_length, max_length)

    if system.startswith("engine-"):
        from service.bundle.decoding import DecodingOptions
        from service.inference.engine import Engine

        dtype = system.split("-")[1]  # engine-DTYPE[-graphs|-cpu]
        on_cpu = system.endswith("-cpu")
        engine = Engine.load(
            (args.bundle_cpu or args.bundle_fp32) if on_cpu else getattr(args, f"bundle_{dtype}"),
            device="cpu" if on_cpu else args.device,
            intra_op_threads=args.threads,
            intra_op_spinning=args.intra_op_spinning,
            max_batch_size=max(args.batch_sizes),
            cuda_graphs=system.endswith("-graphs"),
        )

        def decode_engine(batch: list[list[int]], beam: int) -> list[list[int]]:
            options = DecodingOptions(
                beam_size=beam, max_decoding_length=max_length, min_decoding_length=min_length
            )
            return [n[0].ids for n in engine.generate(batch, options)]

        return decode_engine

    import ctranslate2

    source_tokens, target_tokens = _ct2_vocabularies(args.ct2_dir)
    index = {token: i for i, token in enumerate(target_tokens)}
    translator = ctranslate2.Translator(
        str(args.ct2_dir),
        device=args.device,
        compute_type=CT2_COMPUTE_TYPES[system],
        inter_threads=1,
        intra_threads=args.threads,
    )

    def decode_ct2(batch: list[list[int]], beam: int) -> list[list[int]]:
        results = translator.translate_batch(
            [[source_tokens[i] for i in source] for source in batch],
            beam_size=beam,
            max_decoding_length=max_length,
            min_decoding_length=min_length,  # CTranslate2's default is 1; the engine's is 0
            length_penalty=1.0,
        )
        return [[index[t] for t in r.hypotheses[0]] for r in results]

    return decode_ct2


def _ct2_vocabularies(ct2_dir: Path) -> tuple[list[str], list[str]]:
    """(source, target) tokens of a CTranslate2 model, in id order."""
    shared = ct2_dir / "shared_vocabulary.json"
    if shared.is_file():
        tokens: list[str] = json.loads(shared.read_text())
        return tokens, tokens
    return (
        json.loads((ct2_dir / "source_vocabulary.json").read_text()),
        json.loads((ct2_dir / "target_vocabulary.json").read_text()),
    )


def _load_transformers(args: argparse.Namespace, min_length: int, max_length: int) -> Decode:
    """transformers' generate under the engine's conventions (tests/transformers_reference.py):
    early stopping at beam_size finished hypotheses, no </s> forced at the length limit."""
    import torch
    from transformers import AutoModelForSeq2SeqLM

    torch.set_num_threads(args.threads)
    model = AutoModelForSeq2SeqLM.from_pretrained(args.hf_dir).to(args.device).eval()
    pad, eos = model.config.pad_token_id, model.config.eos_token_id

    @torch.inference_mode()
    def decode_transformers(batch: list[list[int]], beam: int) -> list[list[int]]:
        ids = torch.full((len(batch), max(map(len, batch))), pad)  # (B, S)
        for row, source in enumerate(batch):
            ids[row, : len(source)] = torch.tensor(source)
        ids = ids.to(args.device)
        out = model.generate(
            input_ids=ids,
            attention_mask=(ids != pad).long(),
            num_beams=beam,
            max_new_tokens=max_length,
            min_new_tokens=min_length,
            early_stopping=True,
            forced_eos_token_id=None,
            do_sample=False,
        )
        outputs = []
        for row in out.tolist():
            tokens = row[1:]  # without the decoder's start token
            ends = [i for i, t in enumerate(tokens) if t in (eos, pad)]
            outputs.append(tokens[: ends[0]] if ends else tokens)
        return outputs

    return decode_transformers


def _worker(args: argparse.Namespace) -> dict[str, Any]:
    data = json.loads(Path(args.sources_file).read_text())
    sources: list[list[int]] = data["sources"]
    start = time.perf_counter()
    decode = _load_system(args.worker, args, data["max_positions"])
    load_seconds = time.perf_counter() - start
    runs = []
    for beam in args.beam_sizes:
        for batch_size in args.batch_sizes:
            batches = batch_indices(sources, batch_size)
            decode([sources[i] for i in batches[0]], beam)  # warm-up
            load_rss = _memory_kib("VmRSS")
            peak_reset = _reset_peak()
            outputs: list[list[int]] = [[] for _ in sources]
            times = []
            for _ in range(args.repeat):
                start = time.perf_counter()
                for batch in batches:
                    for i, ids in zip(
                        batch, decode([sources[i] for i in batch], beam), strict=True
                    ):
                        outputs[i] = ids
                times.append(time.perf_counter() - start)
            seconds = statistics.median(times)
            # One step per target token and one for </s> (none after a length-capped output).
            steps = sum(min(len(o) + 1, data["max_positions"]) for o in outputs)
            runs.append(
                {
                    "batch_size": batch_size,
                    "beam_size": beam,
                    "seconds": seconds,
                    "target_tokens": sum(len(o) for o in outputs),
                    "ms_per_step": 1000 * seconds / steps if batch_size == beam == 1 else None,
                    "load_rss_mib": load_rss / 1024,
                    "peak_rss_mib": _memory_kib("VmHWM") / 1024,
                    "peak_since_start": not peak_reset,
                    "outputs": outputs,
                }
            )
    return {"system": args.worker, "load_seconds": load_seconds, "runs": runs}


# --- Parent: sentences, subprocesses, table ----------------------------------------------------


def _prepare(args: argparse.Namespace, work: Path) -> tuple[Path, int, int]:
    """Tokenize the sentences once; returns the sources file, its size and the lines left out."""
    lines = read_lines(args.src)[: args.n]
    sources, max_positions = encode_sources(args.bundle_fp32, lines)
    path = work / "sources.json"
    path.write_text(json.dumps({"sources": sources, "max_positions": max_positions}))
    return path, len(sources), len(lines) - len(sources)


def encode_sources(bundle: Path, lines: Sequence[str]) -> tuple[list[list[int]], int]:
    """`lines` tokenized by the bundle's engine (a multilingual one's first pair: the same work
    as any other), the empty ones and those over the model's input limit left out; and that
    limit."""
    from service.inference.engine import Engine

    engine = Engine.load(bundle, device="cpu", intra_op_threads=1)
    source, target = engine.source_languages[0], engine.target_languages[-1]
    encoded = [ids for ids in engine.encode(lines, target, source) if ids]
    return [ids for ids in encoded if len(ids) <= engine.max_input_tokens], engine.max_input_tokens


def _convert_ct2(args: argparse.Namespace) -> str | None:
    """Convert the checkpoint for CTranslate2 (with its own TransformersConverter when the
    checkpoint came from transformers' format); the reason it could not be, or None."""
    try:
        from ctranslate2.converters import TransformersConverter

        from benchmarks.ct2_convert import convert
    except ImportError as e:
        return f"ctranslate2 is not installed ({e}); pip install ctranslate2"
    try:
        if args.hf_dir:
            TransformersConverter(str(args.hf_dir)).convert(str(args.ct2_dir), force=True)
        else:
            convert(args.checkpoint, args.ct2_dir)
    except Exception as e:  # any failure is reported in the table, the rest still runs
        return f"conversion failed: {type(e).__name__}: {e}"
    return None


def _run_system(system: str, args: argparse.Namespace, sources_file: Path) -> dict[str, Any]:
    argv = [
        sys.executable, "-m", "benchmarks.engine_bench",
        "--worker", system, "--sources-file", str(sources_file),
        "--checkpoint", str(args.checkpoint), "--bundle-fp32", str(args.bundle_fp32),
        "--threads", str(args.threads), "--ct2-dir", str(args.ct2_dir), "--device", args.device,
        "--repeat", str(args.repeat),
        "--batch-sizes", *map(str, args.batch_sizes), "--beam-sizes", *map(str, args.beam_sizes),
    ]  # fmt: skip
    for name in ("int8", "fp16", "cpu"):
        bundle = getattr(args, f"bundle_{name}")
        if bundle:
            argv += [f"--bundle-{name}", str(bundle)]
    for flag, value in (("--hf-dir", args.hf_dir), ("--length", args.length)):
        if value:
            argv += [flag, str(value)]
    if args.intra_op_spinning:
        argv.append("--intra-op-spinning")
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
    print(f"running {system} ...", file=sys.stderr, flush=True)
    done = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        reason = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
        return {"system": system, "error": reason}
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def _table(results: list[dict[str, Any]]) -> list[str]:
    reference = next((r for r in results if r["system"] == REFERENCE and "runs" in r), None)
    ref_runs = (
        {(x["batch_size"], x["beam_size"]): x for x in reference["runs"]} if reference else {}
    )
    header = (
        "| system | batch | beam | tokens | seconds | tokens/s | × engine-fp32 | ms/step "
        "| load RSS MiB | peak RSS MiB | × engine-fp32 | same as engine-fp32 |"
    )
    rows = [header, "|" + "---|" * 12]
    for result in results:
        if "error" in result:
            rows.append(f"| {result['system']} | n/a: {result['error']} |" + " |" * 10)
            continue
        for run in result["runs"]:
            ref = ref_runs.get((run["batch_size"], run["beam_size"]))
            speed = run["target_tokens"] / run["seconds"]
            cells = [
                result["system"],
                str(run["batch_size"]),
                str(run["beam_size"]),
                str(run["target_tokens"]),
                f"{run['seconds']:.2f}",
                f"{speed:.0f}",
                f"{speed / (ref['target_tokens'] / ref['seconds']):.2f}" if ref else "-",
                f"{run['ms_per_step']:.3f}" if run["ms_per_step"] is not None else "",
                f"{run['load_rss_mib']:.0f}",
                f"{run['peak_rss_mib']:.0f}" + ("*" if run["peak_since_start"] else ""),
                f"{run['peak_rss_mib'] / ref['peak_rss_mib']:.2f}" if ref else "-",
                _same(run, ref),
            ]
            rows.append("| " + " | ".join(cells) + " |")
    return rows


def _same(run: dict[str, Any], ref: dict[str, Any] | None) -> str:
    if ref is None:
        return "-"
    same = sum(a == b for a, b in zip(run["outputs"], ref["outputs"], strict=True))
    return f"{same}/{len(ref['outputs'])}"


# Systems that run the same model with the same search as the reference: every output must match
# (CTranslate2's beam search has its own rules, so only its greedy output is held to this; on
# a GPU, fp32 kernels round differently, so there it is a fraction: gpu_bench reports it).
_MUST_MATCH = {
    "torch-uncached": None,
    "torch-cached": None,
    "transformers": None,
    "ct2-fp32": 1,
    "engine-fp32-graphs": None,
}  # beam size or all


def _checks(results: list[dict[str, Any]]) -> list[str]:
    """One line per system that must give engine-fp32's output: does it, per configuration."""
    reference = next((r for r in results if r["system"] == REFERENCE and "runs" in r), None)
    if reference is None:
        return []
    ref_runs = {(x["batch_size"], x["beam_size"]): x for x in reference["runs"]}
    lines = []
    for result in results:
        if result["system"] not in _MUST_MATCH or "runs" not in result:
            continue
        beam = _MUST_MATCH[result["system"]]
        runs = [x for x in result["runs"] if beam is None or x["beam_size"] == beam]
        verdicts = [
            f"batch {x['batch_size']} beam {x['beam_size']}: "
            f"{_same(x, ref_runs.get((x['batch_size'], x['beam_size'])))}"
            for x in runs
        ]
        everywhere = all(
            x["outputs"] == ref_runs[(x["batch_size"], x["beam_size"])]["outputs"] for x in runs
        )
        verdict = "equal" if everywhere else "DIFFERENT"
        lines.append(f"{result['system']} output vs {REFERENCE}: {verdict} ({'; '.join(verdicts)})")
    return lines


def parser(
    prog: str, description: str, systems: Sequence[str], *, exports: bool = False
) -> argparse.ArgumentParser:
    """The options of this benchmark; `systems` are the ones run by default. With `exports`
    the checkpoint defaults to the shipped one and the caller exports the bundles not given."""
    p = argparse.ArgumentParser(prog=prog, description=description)
    if exports:
        p.add_argument("--checkpoint", type=Path, default=REPO / "checkpoints" / "multi30k-en-de")
        p.add_argument("--bundle-fp32", type=Path, help="exported from --checkpoint if not given")
    else:
        p.add_argument("--checkpoint", required=True, type=Path)
        p.add_argument("--bundle-fp32", required=True, type=Path)
    p.add_argument("--bundle-int8", type=Path, help="leave out to skip engine-int8")
    p.add_argument("--bundle-fp16", type=Path, help="leave out to skip engine-fp16*")
    p.add_argument(
        "--bundle-cpu", type=Path, help="engine-fp32-cpu's bundle (default: --bundle-fp32)"
    )
    p.add_argument("--src", type=Path, default=DEFAULT_SRC, help="plain or .gz, one per line")
    p.add_argument("--n", type=int, default=500, help="first N lines (default 500)")
    p.add_argument("--threads", type=int, default=2, help="intra-op threads for every system")
    p.add_argument(
        "--intra-op-spinning",
        action="store_true",
        help="the engine's decoder-step threads spin between kernels (as the service's do when "
        "it serves one model)",
    )
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="torch's and engine's")
    p.add_argument(
        "--repeat", type=int, default=3, help="timed passes per configuration; the median counts"
    )
    p.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 32])
    p.add_argument("--beam-sizes", type=int, nargs="+", default=[1, 4])
    p.add_argument("--systems", nargs="+", choices=SYSTEMS, default=list(systems))
    p.add_argument("--ct2-dir", type=Path, help="where the CTranslate2 model goes (a temp dir)")
    p.add_argument("--json", type=Path, help="also write the JSON summary here")
    p.add_argument(
        "--hf-dir",
        type=Path,
        help="the transformers checkpoint --checkpoint was imported from: runs the transformers "
        "system, and CTranslate2 converts it with its own converter",
    )
    p.add_argument("--length", type=int, help="decode exactly N tokens per sentence")
    p.add_argument("--worker", choices=SYSTEMS, help=argparse.SUPPRESS)
    p.add_argument("--sources-file", type=Path, help=argparse.SUPPRESS)
    return p


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Every system in its own process; prints the table and returns the JSON summary."""
    with tempfile.TemporaryDirectory(prefix="engine_bench_") as tmp:
        work = Path(tmp)
        args.ct2_dir = args.ct2_dir or work / "ct2"
        sources_file, n_sources, left_out = _prepare(args, work)
        skipped: dict[str, str] = {}
        for dtype in ("int8", "fp16"):
            if not getattr(args, f"bundle_{dtype}"):
                skipped.update(
                    {
                        s: f"no --bundle-{dtype} given"
                        for s in SYSTEMS
                        if s.startswith("engine-") and f"-{dtype}" in s
                    }
                )
        if not args.hf_dir:
            skipped["transformers"] = "no --hf-dir given"
        if any(s.startswith("ct2-") for s in args.systems):
            reason = _convert_ct2(args)
            if reason:
                skipped.update({s: reason for s in SYSTEMS if s.startswith("ct2-")})
        # The reference first, so a failure there shows before the long torch runs.
        order = sorted(args.systems, key=lambda s: s != REFERENCE)
        results = [
            {"system": s, "error": skipped[s]}
            if s in skipped
            else _run_system(s, args, sources_file)
            for s in order
        ]

    print(
        f"{n_sources} sentences from {args.src} ({left_out} over the input limit or empty left "
        f"out), threads {args.threads}, device {args.device}; * = peak since process start"
    )
    print("\n".join([*_table(results), *_checks(results)]))
    summary = {
        "src": str(args.src),
        "sentences": n_sources,
        "threads": args.threads,
        "device": args.device,
        "results": results,
    }
    return summary


def without_outputs(summary: dict[str, Any]) -> dict[str, Any]:
    """The summary as written: measurements without the decoded ids."""
    results = [
        {**r, "runs": [{k: v for k, v in x.items() if k != "outputs"} for x in r["runs"]]}
        if "runs" in r
        else r
        for r in summary["results"]
    ]
    return {**summary, "results": results}


def tokens_per_s(summary: dict[str, Any]) -> dict[tuple[str, int, int], float]:
    """Target tokens/s of every (system, batch size, beam size) the summary measured."""
    return {
        (r["system"], x["batch_size"], x["beam_size"]): x["target_tokens"] / x["seconds"]
        for r in summary["results"]
        if "runs" in r
        for x in r["runs"]
    }


def emit(summary: dict[str, Any], json_path: Path | None) -> None:
    """Write the summary to `json_path` (when given) and print it as the last stdout line."""
    if json_path:
        json_path.write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps(summary))


def main(argv: list[str] | None = None) -> int:
    p = parser(
        "python -m benchmarks.engine_bench",
        "Engine vs torch vs CTranslate2: target tokens/s and peak RSS.",
        CPU_SYSTEMS,
    )
    args = p.parse_args(argv)
    if args.repeat < 1:
        p.error("--repeat must be at least 1")
    if args.hf_dir and args.systems == list(CPU_SYSTEMS):  # the default set
        args.systems.append("transformers")

    if args.worker:
        try:
            result = _worker(args)
        except Exception:
            traceback.print_exc()
            return 1
        print(json.dumps(result))
        return 0

    emit(without_outputs(run(args)), args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
