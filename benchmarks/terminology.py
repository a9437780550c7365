"""Glossary terms enforced in decoding, against terms mined from the reference translations.

    python -m benchmarks.terminology --bundle bundles/multi30k-en-de [--limit N] [--seed 0] \\
        [--beam-size 4] [--timed 100] [--repeat 3] [--extra-limit N] [--json OUT]

Multi30k's test2016 (from $MULTI30K_DIR, default ../shared/data/multi30k): eflomal
(model/alignment.py, an aligner independent of the model; Multi30k's training pairs as extra
text for its statistics) aligns each English sentence with its German reference. A term pair is
a source word linked to exactly one reference word that is linked to it alone, both of at least
three letters, the source word not a function word (`_FUNCTION`); one per sentence, drawn with
--seed. The sentence is translated in-process (the engine and the text pipeline, as the service
does) twice at --beam-size: plainly, and with its term pair as the glossary (matched,
constrained, the model's own words for the source term avoided: service/text/terms.py). Pairs
are split by whether the plain translation already holds the reference term as a word.

Reported, per kind and in all:
- exact term match (the WMT 2021 terminology task's measure): the translation holds the target
  term as a whole word; goals >= 99 % where the plain translation used it, >= 95 % where not;
- doubled (the term more often than the source term was found) and glued (only inside a
  longer word);
- BLEU (sacrebleu, 13a) of the translations with the glossary and without, on the sentences
  with a term, and how many translations the glossary left unchanged (where the plain one
  used the term, it should leave nearly all);
- decoding time with terms against without: the same sentences one at a time (batch 1, the
  first --timed) and 32 at a time (all), the engine's generate only, each the fastest of
  --repeat runs that alternate without and with (a shared machine's load comes and goes); and
  once, the greedy translations of the source terms alone that the avoided words come from (the
  service keeps them per model and term).
The last lines printed are a markdown table for benchmarks/RESULTS.md; --json writes every
number.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
import re
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import sacrebleu

from benchmarks.paths import multi30k_dir
from benchmarks.reference_alignment import EXTRA_SOURCE, EXTRA_TARGET, read_words
from model.alignment import align
from service.bundle.decoding import Constraints, DecodingOptions, Hypothesis
from service.glossaries import Entry
from service.inference.engine import Engine
from service.text import pipeline, terms
from service.text.terms import Terms

GOALS_PCT = {"used": 99.0, "new": 95.0}
_LETTERS = re.compile(r"[^\W\d_]{3,}")
_FUNCTION = frozenset(
    {"the", "and", "with", "are", "his", "her", "their", "its", "from", "into", "onto", "for",
     "while", "who", "that", "this", "these", "those", "there", "here", "has", "have", "was",
     "were", "been", "being", "one", "two", "three", "some", "other", "another", "each", "very",
     "but", "not", "all", "out"}
)  # fmt: skip


def mine(
    sources: list[list[str]], references: list[list[str]], extra: tuple[Any, Any], seed: int
) -> list[tuple[str, str] | None]:
    """One (source word, reference word) pair per sentence, or None (module docstring)."""
    alignments = align(sources, references, extra=extra)
    rng = random.Random(seed)
    pairs: list[tuple[str, str] | None] = []
    for source, reference, links in zip(sources, references, alignments, strict=True):
        candidates = []
        for i, word in enumerate(source):
            targets = [j for s, j in links if s == i]
            if len(targets) != 1 or [s for s, j in links if j == targets[0]] != [i]:
                continue
            src = _LETTERS.fullmatch(word.strip(".,;:!?\"'()"))
            tgt = _LETTERS.fullmatch(reference[targets[0]].strip(".,;:!?\"'()"))
            if src and tgt and src.group().lower() not in _FUNCTION:
                candidates.append((src.group(), tgt.group()))
        pairs.append(rng.choice(candidates) if candidates else None)
    return pairs


def occurrences(text: str, term: str) -> tuple[int, bool]:
    """How often `term` is a whole word of `text`, and whether it is inside a longer word."""
    whole = len(re.findall(rf"(?<!\w){re.escape(term)}(?!\w)", text))
    return whole, term in text and whole == 0


def translate(
    engine: Engine,
    texts: Sequence[str],
    options: DecodingOptions,
    glossaries: Sequence[Terms] | None,
    rendering: dict[str, str],
) -> tuple[list[str], list[Constraints] | None, list[int]]:
    """Each text's translation (one sentence each, as Multi30k's are), its constraints (with
    `glossaries`, one per text) and the encoded length; the pipeline as the runtime runs it."""
    prepared = pipeline.prepare(engine, texts, None, max_segment_characters=10_000)
    constraints = None
    if glossaries is not None:
        matched = [
            glossary.matches(engine, layout.inputs)
            for glossary, layout in zip(glossaries, prepared.layouts, strict=True)
        ]
        flat = [entries for own in matched for entries in own]
        constraints = terms.constraints(engine, flat, rendering.__getitem__)
    options = replace_beam(options, constraints)
    nbest = engine.generate(prepared.sources, options, constraints=constraints)
    out = [r.texts[0] for r in pipeline.assemble(engine, prepared, nbest, 1)]
    return out, constraints, [len(s) for s in prepared.sources]


def replace_beam(
    options: DecodingOptions, constraints: Sequence[Constraints] | None
) -> DecodingOptions:
    """As Prepared.decoding: sentences with terms get a beam."""
    if constraints and any(constraints) and options.beam_size < pipeline.TERMS_BEAM:
        return dataclasses.replace(options, beam_size=pipeline.TERMS_BEAM)
    return options


def timed(
    engine: Engine,
    sources: list[list[int]],
    options: DecodingOptions,
    constraints: list[Constraints] | None,
    batch: int,
) -> float:
    """Seconds of engine.generate over `sources`, `batch` at a time."""
    start = time.perf_counter()
    for i in range(0, len(sources), batch):
        own = None if constraints is None else constraints[i : i + batch]
        results: list[list[Hypothesis]] = engine.generate(
            sources[i : i + batch], options, constraints=own
        )
        assert len(results) == len(sources[i : i + batch])
    return time.perf_counter() - start


def _run(args: argparse.Namespace) -> dict[str, Any]:
    data = multi30k_dir()
    sources = read_words(data / "test_2016_flickr.en.gz")
    references = read_words(data / "test_2016_flickr.de.gz")
    if args.limit is not None:
        sources, references = sources[: args.limit], references[: args.limit]
    extra = (
        read_words(data / EXTRA_SOURCE, args.extra_limit),
        read_words(data / EXTRA_TARGET, args.extra_limit),
    )
    seconds: dict[str, float] = {}
    start = time.perf_counter()
    pairs = mine(sources, references, extra, args.seed)
    seconds["align"] = time.perf_counter() - start
    kept = [k for k, pair in enumerate(pairs) if pair is not None]
    texts = [" ".join(sources[k]) for k in kept]
    refs = [" ".join(references[k]) for k in kept]
    entries = [Entry(*pair) for pair in pairs if pair is not None]

    engine = Engine.load(args.bundle, device="cpu", max_batch_size=32)
    options = DecodingOptions(beam_size=args.beam_size, max_length_a=3.0, max_length_b=10)
    greedy = DecodingOptions(max_length_a=3.0, max_length_b=10)
    start = time.perf_counter()
    alone = engine.generate(engine.encode([e.source for e in entries]), greedy)
    rendering = {e.source: engine.decode(h[0].ids) for e, h in zip(entries, alone, strict=True)}
    seconds["term_translations"] = time.perf_counter() - start

    plain, _, _ = translate(engine, texts, options, None, rendering)
    glossaries = [Terms([entry]) for entry in entries]
    termed, constraints, _ = translate(engine, texts, options, glossaries, rendering)
    assert constraints is not None
    sentences = pipeline.prepare(engine, texts, None, max_segment_characters=10_000).sources

    kinds: dict[str, list[int]] = {"used": [], "new": []}
    for k, (entry, out) in enumerate(zip(entries, plain, strict=True)):
        kinds["used" if occurrences(out, entry.target)[0] else "new"].append(k)
    rows: dict[str, dict[str, Any]] = {}
    for kind, indices in [*kinds.items(), ("all", list(range(len(entries))))]:
        found = [occurrences(termed[k], entries[k].target) for k in indices]
        matched = [max(1, len(constraints[k].terms)) for k in indices]
        n = len(indices)
        rows[kind] = {
            "terms": n,
            "exact_pct": 100.0 * sum(1 for whole, _ in found if whole) / n if n else None,
            # More often than the source term was found (a term twice in the source: twice).
            "doubled": sum(1 for (whole, _), m in zip(found, matched, strict=True) if whole > m),
            "glued": sum(1 for _, glued in found if glued),
            "bleu_with": sacrebleu.corpus_bleu(
                [termed[k] for k in indices], [[refs[k] for k in indices]]
            ).score,
            "bleu_without": sacrebleu.corpus_bleu(
                [plain[k] for k in indices], [[refs[k] for k in indices]]
            ).score,
            "matched": sum(1 for k in indices if constraints[k]),
            "unchanged": sum(1 for k in indices if termed[k] == plain[k]),
        }
    timed_options = replace_beam(options, constraints)
    batch_one = slice(0, args.timed)
    for label, batch, part in (("batch_1", 1, batch_one), ("batch_32", 32, slice(None))):
        timed(engine, sentences[:8], options, None, batch)  # warm up
        runs = [
            (
                timed(engine, sentences[part], timed_options, None, batch),
                timed(engine, sentences[part], timed_options, constraints[part], batch),
            )
            for _ in range(args.repeat)
        ]
        seconds[f"{label}_without"] = min(without for without, _ in runs)
        seconds[f"{label}_with"] = min(with_terms for _, with_terms in runs)
    return {
        "bundle": str(args.bundle),
        "beam_size": args.beam_size,
        "seed": args.seed,
        "sentences": len(sources),
        "with_term": len(entries),
        "rows": rows,
        "goals_pct": GOALS_PCT,
        "seconds": seconds,
        "examples": [
            {"source": texts[k], "term": [entries[k].source, entries[k].target],
             "plain": plain[k], "with": termed[k]}
            for k in kinds["new"][:5]
        ],
        "misses": [
            {"source": texts[k], "term": [entries[k].source, entries[k].target],
             "plain": plain[k], "with": termed[k]}
            for k in range(len(entries))
            if occurrences(termed[k], entries[k].target)[0] != max(1, len(constraints[k].terms))
        ],
    }  # fmt: skip


def _print_report(report: dict[str, Any]) -> None:
    seconds = report["seconds"]
    print(f"{report['with_term']} of {report['sentences']} sentences with a term pair")
    for example in report["examples"]:
        print(f"  {example['term']}: {example['plain']}  ->  {example['with']}")
    print(
        "\n| terms | n | exact match | goal | doubled | glued | BLEU without | BLEU with "
        "| unchanged |\n|---|---|---|---|---|---|---|---|---|"
    )
    for kind, row in report["rows"].items():
        goal = report["goals_pct"].get(kind)
        goal_text = "-" if goal is None else f">= {goal:.0f} %"
        print(
            f"| {kind} | {row['terms']} | {row['exact_pct']:.1f} % | {goal_text} | "
            f"{row['doubled']} | {row['glued']} | {row['bleu_without']:.2f} | "
            f"{row['bleu_with']:.2f} | {row['unchanged']} |"
        )
    print("\n| decoding, beam 4 | without terms | with terms | ratio |\n|---|---|---|---|")
    for label in ("batch_1", "batch_32"):
        a, b = seconds[f"{label}_without"], seconds[f"{label}_with"]
        print(f"| {label.replace('_', ' ')} | {a:.2f} s | {b:.2f} s | {b / a:.2f}x |")
    print(f"\nthe source terms translated alone, once: {seconds['term_translations']:.2f} s")


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.terminology", description=__doc__.split("\n")[0]
    )
    p.add_argument("--bundle", type=Path, required=True)
    p.add_argument("--limit", type=int, default=None, help="the first N test2016 sentences")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--beam-size", type=int, default=4)
    p.add_argument("--timed", type=int, default=100, help="sentences timed at batch 1")
    p.add_argument("--repeat", type=int, default=3, help="timed runs; the fastest counts")
    p.add_argument("--extra-limit", type=int, default=None, help="training pairs for eflomal")
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)
    report = _run(args)
    _print_report(report)
    if args.json is not None:
        args.json.write_text(json.dumps(report, indent=2, ensure_ascii=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
