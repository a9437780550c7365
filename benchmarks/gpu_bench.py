"""The engine on a GPU: fp32 and fp16, CUDA graphs off and on, against torch and CTranslate2.

    python -m benchmarks.gpu_bench [--checkpoint checkpoints/multi30k-en-de] \\
        [--src ../shared/data/multi30k/test_2016_flickr.en.gz] [--n 1000] \\
        [--batch-sizes 1 8 32 64 128 256] [--beam-sizes 1 4] [--repeat 3] [--json FILE]

It exports the checkpoint's fp32 and fp16 bundles with the gather cache, the one CUDA runs
(unless --bundle-fp32 / --bundle-fp16 are given), and the CPU's fp32 bundle (--bundle-cpu),
then runs benchmarks/engine_bench.py's systems for a GPU, each in its own process:
engine-fp32 (the reference), engine-fp32-graphs, engine-fp16, engine-fp16-graphs, torch-cached
and torch-uncached on --device (cuda by default), and engine-fp32-cpu, whose outputs the GPU's
are held to; `--systems` adds CTranslate2 in float16 and int8_float16 (ct2-fp16,
ct2-int8-fp16; ctranslate2 with CUDA installed). It prints engine_bench's table, then the
issue's goals beside what was measured, and writes the JSON summary (--json, default
gpu_bench.json). Without CUDA (--device cpu) it runs the same systems on the CPU, which checks
the command, not the GPU.
"""

from __future__ import annotations

import sys
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from benchmarks.engine_bench import emit, parser, run, tokens_per_s, without_outputs

GPU_SYSTEMS = (
    "engine-fp32",
    "engine-fp32-graphs",
    "engine-fp16",
    "engine-fp16-graphs",
    "engine-fp32-cpu",
    "torch-cached",
    "torch-uncached",
)


def _agreement(a: dict[str, Any], b: dict[str, Any]) -> float | None:
    """The fraction of sentences, over every configuration both ran, with equal outputs."""
    pairs = {(x["batch_size"], x["beam_size"]): x["outputs"] for x in a.get("runs", [])}
    same = total = 0
    for run_ in b.get("runs", []):
        other = pairs.get((run_["batch_size"], run_["beam_size"]))
        if other is not None:
            same += sum(x == y for x, y in zip(run_["outputs"], other, strict=True))
            total += len(other)
    return same / total if total else None


def goals(summary: dict[str, Any]) -> list[str]:
    """The issue's goals, each with what this run measured."""
    by_name = {r["system"]: r for r in summary["results"]}
    speeds = tokens_per_s(summary)

    def speed(system: str, batch: int, beam: int) -> float | None:
        return speeds.get((system, batch, beam))

    def step_ms(system: str) -> float | None:
        for run_ in by_name.get(system, {}).get("runs", []):
            if run_["ms_per_step"] is not None:
                return float(run_["ms_per_step"])
        return None

    def show(value: float | None, fmt: str) -> str:
        return "n/a" if value is None else format(value, fmt)

    def best(values: Iterable[float | None], pick: Callable[..., float]) -> float | None:
        measured = [v for v in values if v is not None]
        return pick(measured) if measured else None

    gpu_engines = [s for s in GPU_SYSTEMS if s.startswith("engine-") and not s.endswith("-cpu")]
    lines = ["| goal | measured (best engine on the device) |", "|---|---|"]
    step = best((step_ms(s) for s in gpu_engines), min)
    lines.append(f"| batch-1 greedy step <= 0.25 ms | {show(step, '.3f')} ms |")
    b1 = best((speed(s, 1, 1) for s in gpu_engines), max)
    lines.append(f"| greedy >= 4,000 tok/s at batch 1 | {show(b1, ',.0f')} |")
    fp16 = best((speed(s, 256, 1) for s in ("engine-fp16", "engine-fp16-graphs")), max)
    lines.append(f"| greedy fp16 >= 100,000 tok/s at batch 256 | {show(fp16, ',.0f')} |")
    beam = best((speed(s, 64, 4) for s in gpu_engines), max)
    lines.append(f"| beam 4 >= 40,000 tok/s at batch 64 | {show(beam, ',.0f')} |")
    uncached = speed("torch-uncached", 64, 4)
    ratio = beam / uncached if beam is not None and uncached else None
    lines.append(f"| engine >= 15x torch uncached, batch 64 beam 4 | {show(ratio, '.1f')}x |")
    rivals = [
        (engine / ct2, f"{system} batch {batch}")
        for system in ("ct2-fp16", "ct2-int8-fp16")
        for batch in (1, 32)
        if (ct2 := speed(system, batch, 4))
        and (engine := best((speed(s, batch, 4) for s in gpu_engines), max)) is not None
    ]
    worst = min(rivals, default=None)
    lines.append(
        "| engine >= 1.0x CTranslate2 (fp16, int8-fp16), beam 4, batch 1 and 32 | "
        + ("n/a" if worst is None else f"{worst[0]:.2f}x at worst ({worst[1]})")
        + " |"
    )
    cpu = by_name.get("engine-fp32-cpu", {})
    for system, goal in (("engine-fp32", 0.995), ("engine-fp16", 0.99)):
        agree = _agreement(cpu, by_name.get(system, {}))
        lines.append(f"| {system} equals the CPU engine on >= {goal:.1%} | {show(agree, '.2%')} |")
    for dtype in ("fp32", "fp16"):
        same = _agreement(
            by_name.get(f"engine-{dtype}", {}), by_name.get(f"engine-{dtype}-graphs", {})
        )
        lines.append(f"| {dtype}: CUDA graphs on equal off | {show(same, '.2%')} |")
    return lines


def main(argv: list[str] | None = None) -> int:
    p = parser(
        "python -m benchmarks.gpu_bench",
        "The engine on a GPU: fp32/fp16, CUDA graphs off/on, torch and CTranslate2 on it.",
        GPU_SYSTEMS,
        exports=True,
    )
    p.set_defaults(
        n=1000, device="cuda", batch_sizes=[1, 8, 32, 64, 128, 256], json=Path("gpu_bench.json")
    )
    args = p.parse_args(argv)
    if args.repeat < 1:
        p.error("--repeat must be at least 1")
    with tempfile.TemporaryDirectory(prefix="gpu_bench_") as tmp:
        for name, dtype, cache in (
            ("fp32", "fp32", "gather"),
            ("fp16", "fp16", "gather"),
            ("cpu", "fp32", "indirection"),
        ):
            if getattr(args, f"bundle_{name}") is None:
                from export.onnx_export import export_bundle

                out = Path(tmp) / name
                export_bundle(args.checkpoint, out, dtype=dtype, cache=cache)  # type: ignore[arg-type]
                setattr(args, f"bundle_{name}", out)
        summary = run(args)
    lines = goals(summary)
    print("\n".join(lines))
    emit({**without_outputs(summary), "goals": lines}, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
