"""Where the engine's time goes: inside ONNX Runtime's decoder-step run, in the search and
cache bookkeeping around it (Python and numpy), and in the encoder, per configuration.

    python -m benchmarks.step_profile --bundle BUNDLE [--src FILE] [--n 200] [--threads 1 2] \\
        [--batch-sizes 1 32] [--beam-sizes 1 4] [--repeat 3] [--ort-profile] [--json FILE] \\
        [--device cpu|cuda] [--cuda-graphs]

Method: the first N lines of --src, tokenized once, decoded by `Engine.generate` batch after batch
(sorted by length, as the service's batches are), after a warm-up batch; the median of --repeat
passes counts. Time in the decoder step is the wall clock of every run of its sessions (one per
step; with --threads above 1, steps of few rows run on the engine's one-thread session,
step_state.StepSessions), time in the encoder of every run of the encoder's (one per length group of
a batch); the rest of a pass is the host's: the search, the cache bookkeeping (step_state.py),
copying the top-k out. "ms/step" divides by the decoder steps. On CUDA (--device cuda, a bundle
exported with the gather cache) the step's run returns once its outputs are copied back, so it holds
the device's time and the host's kernel launches; with --cuda-graphs a captured step is replayed,
which leaves the device's time and one launch: the difference between the two is the host's launch
cost.

--ort-profile also runs each configuration once with ONNX Runtime's profiler and prints the
decoder step's kernel time by operator type. The profiler adds its own cost to every node (a
step takes several times longer under it), so read those rows as shares and node counts, not as
absolute times. Each operator type also counts its nodes that ran on the CPU provider (on CUDA,
the nodes ONNX Runtime left on the host, each with a copy across), and the
Memcpy nodes it inserted are listed with the rest.
The last stdout line is a JSON object with every measurement (--json also writes it).
"""

from __future__ import annotations

import argparse
import collections
import json
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import onnxruntime as ort

from benchmarks.engine_bench import batch_indices, encode_sources, read_lines
from benchmarks.paths import MULTI30K
from service.bundle.decoding import DecodingOptions
from service.inference import engine as engine_module
from service.inference.engine import Engine
from service.settings import Device

DEFAULT_SRC = MULTI30K / "val.en.gz"


class _Clock:
    """Wall-clock time and calls of one InferenceSession's runs (`run` and
    `run_with_iobinding`), while `timing` is on. The encoder runs through `run` on the CPU and
    through `run_with_iobinding` on CUDA: the session, not the method, tells the graphs apart."""

    METHODS = ("run", "run_with_iobinding")

    def __init__(self, *sessions: ort.InferenceSession) -> None:
        self.sessions = sessions
        self.seconds = 0.0
        self.calls = 0

    @staticmethod
    @contextmanager
    def timing(*clocks: _Clock) -> Iterator[None]:
        originals: dict[str, Callable[..., Any]] = {
            name: getattr(ort.InferenceSession, name) for name in _Clock.METHODS
        }

        def timed(name: str) -> Callable[..., Any]:
            def run(session: ort.InferenceSession, *args: Any, **kwargs: Any) -> Any:
                start = time.perf_counter()
                try:
                    return originals[name](session, *args, **kwargs)
                finally:
                    for clock in clocks:
                        if any(s is session for s in clock.sessions):
                            clock.seconds += time.perf_counter() - start
                            clock.calls += 1

            return run

        for name in _Clock.METHODS:
            setattr(ort.InferenceSession, name, timed(name))
        try:
            yield
        finally:
            for name, original in originals.items():
                setattr(ort.InferenceSession, name, original)


def _batches(sources: Sequence[list[int]], batch_size: int) -> list[list[list[int]]]:
    """The sources in engine_bench's batches: sorted by length, then cut."""
    return [[sources[i] for i in batch] for batch in batch_indices(sources, batch_size)]


def _pass(
    engine: Engine, batches: Sequence[Sequence[list[int]]], options: DecodingOptions
) -> dict[str, float]:
    step, encoder = _Clock(*engine.step_sessions.all), _Clock(engine._encoder)
    tokens = 0
    with _Clock.timing(step, encoder):
        start = time.perf_counter()
        for batch in batches:
            tokens += sum(len(nbest[0].ids) for nbest in engine.generate(batch, options))
        seconds = time.perf_counter() - start
    return {
        "seconds": seconds,
        "tokens": tokens,
        "steps": step.calls,
        "step_run_seconds": step.seconds,
        "encoder_seconds": encoder.seconds,
        "host_seconds": seconds - step.seconds - encoder.seconds,
    }


def measure(
    bundle: Path,
    sources: Sequence[list[int]],
    *,
    threads: int,
    batch_size: int,
    beam_size: int,
    repeat: int,
    device: Device = "cpu",
    cuda_graphs: bool = False,
) -> dict[str, Any]:
    """The median pass (by its time) of `repeat`, with its breakdown."""
    engine = Engine.load(
        bundle,
        device=device,
        intra_op_threads=threads,
        max_batch_size=batch_size,
        cuda_graphs=cuda_graphs,
    )
    batches = _batches(sources, batch_size)
    options = DecodingOptions(beam_size=beam_size)
    # With CUDA graphs each step shape runs plainly once, is captured the next time and replayed
    # after that: two warm-up passes leave every shape of the timed passes captured.
    warm_up = [*batches, *batches] if cuda_graphs else [batches[len(batches) // 2]]
    for batch in warm_up:
        engine.generate(batch, options)
    passes = sorted(
        (_pass(engine, batches, options) for _ in range(repeat)), key=lambda p: p["seconds"]
    )
    median = passes[len(passes) // 2]
    steps = max(median["steps"], 1)
    return {
        "threads": threads,
        "batch_size": batch_size,
        "beam_size": beam_size,
        "device": engine.device,
        "cuda_graphs": engine.cuda_graphs,
        **median,
        "tokens_per_second": median["tokens"] / median["seconds"],
        "ms_per_step": 1000 * median["seconds"] / steps,
        "run_ms_per_step": 1000 * median["step_run_seconds"] / steps,
        "host_ms_per_step": 1000 * median["host_seconds"] / steps,
        "encoder_ms_per_step": 1000 * median["encoder_seconds"] / steps,
        "spread": statistics.pstdev(p["seconds"] for p in passes) / median["seconds"],
    }


def operator_profile(
    bundle: Path,
    sources: Sequence[list[int]],
    *,
    threads: int,
    batch_size: int,
    beam_size: int,
    device: Device = "cpu",
) -> dict[str, dict[str, float]]:
    """Kernel microseconds, nodes and nodes on the CPU provider per decoder step, by operator
    type, under ORT's profiler."""
    prefix = Path(tempfile.mkdtemp(prefix="step_profile-")) / "ort"
    plain = engine_module._session_options

    def profiled(intra_op_threads: int | None, spinning: bool) -> ort.SessionOptions:
        options = plain(intra_op_threads, spinning)
        options.enable_profiling = True
        options.profile_file_prefix = str(prefix)
        return options

    # The engine takes no session options from outside: the profiler is switched on here only.
    engine_module._session_options = profiled
    try:
        engine = Engine.load(
            bundle, device=device, intra_op_threads=threads, max_batch_size=batch_size
        )
    finally:
        engine_module._session_options = plain
    options = DecodingOptions(beam_size=beam_size)
    for batch in _batches(sources, batch_size):
        engine.generate(batch, options)
    trace = [  # a step on either session (step_state.StepSessions)
        event
        for session in engine.step_sessions.all
        for event in json.loads(Path(session.end_profiling()).read_text(encoding="utf-8"))
    ]
    engine._encoder.end_profiling()
    runs = sum(1 for e in trace if e.get("cat") == "Session" and e["name"] == "model_run")
    kernels = [e for e in trace if e.get("cat") == "Node" and e["name"].endswith("_kernel_time")]
    time_by: dict[str, float] = collections.defaultdict(float)
    nodes_by: collections.Counter[str] = collections.Counter()
    on_cpu: collections.Counter[str] = collections.Counter()
    for event in kernels:
        op = event["args"]["op_name"]
        time_by[op] += event["dur"]
        nodes_by[op] += 1
        on_cpu[op] += event["args"].get("provider") == engine_module.CPU_PROVIDER
    return {
        op: {
            "us_per_step": time_by[op] / runs,
            "nodes_per_step": nodes_by[op] / runs,
            "cpu_nodes_per_step": on_cpu[op] / runs,
        }
        for op in sorted(time_by, key=lambda op: -time_by[op])
    }


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.step_profile", description=__doc__)
    p.add_argument("--bundle", type=Path, required=True)
    p.add_argument("--src", type=Path, default=DEFAULT_SRC, help="plain or .gz, one per line")
    p.add_argument("--n", type=int, default=200, help="first N lines (default 200)")
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    p.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 32])
    p.add_argument("--beam-sizes", type=int, nargs="+", default=[1, 4])
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--ort-profile", action="store_true", help="also ORT's per-operator profile")
    p.add_argument("--json", type=Path, help="also write the JSON summary here")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--cuda-graphs", action="store_true", help="replay captured steps (CUDA)")
    args = p.parse_args(argv)
    sources, _ = encode_sources(args.bundle, read_lines(args.src)[: args.n])
    graphs = ", CUDA graphs" if args.cuda_graphs else ""
    print(
        f"{len(sources)} sentences from {args.src}, {args.device}{graphs}, "
        f"median of {args.repeat} passes"
    )
    print("| threads | batch | beam | tokens/s | ms/step | in the step's run | host | encoder |")
    print("|---|---|---|---|---|---|---|---|")
    results = []
    for threads in args.threads:
        for batch_size in args.batch_sizes:
            for beam_size in args.beam_sizes:
                r = measure(
                    args.bundle,
                    sources,
                    threads=threads,
                    batch_size=batch_size,
                    beam_size=beam_size,
                    repeat=args.repeat,
                    device=args.device,
                    cuda_graphs=args.cuda_graphs,
                )
                if args.ort_profile:
                    r["operators"] = operator_profile(
                        args.bundle,
                        sources,
                        threads=threads,
                        batch_size=batch_size,
                        beam_size=beam_size,
                        device=args.device,
                    )
                results.append(r)
                share = 100 / r["ms_per_step"]
                print(
                    f"| {threads} | {batch_size} | {beam_size} | {r['tokens_per_second']:,.0f} "
                    f"| {r['ms_per_step']:.3f} "
                    f"| {r['run_ms_per_step']:.3f} ({r['run_ms_per_step'] * share:.0f} %) "
                    f"| {r['host_ms_per_step']:.3f} ({r['host_ms_per_step'] * share:.0f} %) "
                    f"| {r['encoder_ms_per_step']:.3f} ({r['encoder_ms_per_step'] * share:.0f} %) |"
                )
    for r in results:
        if "operators" in r:
            print(
                f"\nthreads {r['threads']}, batch {r['batch_size']}, beam {r['beam_size']}: "
                "decoder-step kernels under ORT's profiler, per step"
            )
            operators = r["operators"]
            total = sum(o["us_per_step"] for o in operators.values())
            nodes = sum(o["nodes_per_step"] for o in operators.values())
            cpu = sum(o["cpu_nodes_per_step"] for o in operators.values())
            print(f"  {nodes:.0f} nodes per step, {cpu:.0f} of them on the CPU provider")
            for op, o in list(operators.items())[:12]:
                print(
                    f"  {op:26s} {o['nodes_per_step']:5.1f} nodes "
                    f"({o['cpu_nodes_per_step']:.1f} on the CPU) "
                    f"{100 * o['us_per_step'] / total:5.1f} % of kernel time"
                )
    summary = {"src": str(args.src), "sentences": len(sources), "results": results}
    line = json.dumps(summary)
    if args.json:
        args.json.write_text(line + "\n", encoding="utf-8")
    print(line)


if __name__ == "__main__":
    main()
