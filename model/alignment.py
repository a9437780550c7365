"""Word alignments from eflomal (Östling and Tiedemann, 2016), independent of any translation
model: what guided alignment trains a cross-attention head on (model/training/, Garg et al.
2019), and the reference the tag-placement benchmark judges the service's tags against
(benchmarks/tag_placement.py).

    python -m model.alignment --src train.en.gz --tgt train.de.gz --out train.align.gz

writes one line per pair, "i-j" links of whitespace words (source word i, target word j), the
Pharaoh format `python -m model.train --alignments` reads.

eflomal is an unsupervised Bayesian IBM model (IBM1, HMM and fertility, trained by Gibbs
sampling) that sees nothing but the sentence pairs, so it needs far more text than a test set:
pass `extra` pairs (Multi30k's 29,000 training pairs) and only the first len(sources)
alignments come back. test2016's 1,000 pairs with those took 27-28 s a run on a 2-core AMD EPYC.

Words in and out are whitespace-separated words. For the aligner each word is cut into pieces
that split punctuation off words (`\\w+|[^\\w\\s]`: "grass." is "grass" and "."), so that "grass."
and "grass" share statistics; a whitespace word is then aligned to every word that its pieces
are aligned to. Punctuation glued to a word does not count there, only its word pieces do:
"something." / "etwas anstarrt." would otherwise link "something." to "anstarrt." through the
two full stops. A word that is only punctuation ("-", "&") keeps its links. eflomal lowercases.

eflomal aligns in both directions (target from source, source from target); the two are
symmetrised with grow-diag-final-and (Koehn et al., 2005, as Moses and fast_align's atools
do): start from their intersection, grow into neighbouring links of the union (diagonals
included) that cover a word not yet aligned, then add the remaining union links whose source
and target words are both still unaligned.

eflomal has no seed: each run draws its samplers' state from /dev/urandom, so two runs differ
(`python -m benchmarks.reference_alignment` measures by how much).
"""

from __future__ import annotations

import argparse
import gzip
import itertools
import re
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

import eflomal

from model.data import read_lines

Alignment = set[tuple[int, int]]  # (source word index, target word index)
_PIECE = re.compile(r"\w+|[^\w\s]")
_WORD = re.compile(r"\w")
# The 8 neighbours of a link, grow-diag's order: sides first, then diagonals.
_NEIGHBOURS = ((-1, 0), (0, -1), (1, 0), (0, 1), (-1, -1), (-1, 1), (1, -1), (1, 1))


def align(
    sources: list[list[str]],
    targets: list[list[str]],
    *,
    extra: tuple[list[list[str]], list[list[str]]] | None = None,
) -> list[Alignment]:
    """Symmetrised eflomal alignments of each (source, target) pair, as (source word, target
    word) index pairs; `extra` pairs are aligned in the same run for their statistics only."""
    if len(sources) != len(targets):
        raise ValueError(f"{len(sources)} sources but {len(targets)} targets")
    extra_sources, extra_targets = extra if extra is not None else ([], [])
    if len(extra_sources) != len(extra_targets):
        raise ValueError(f"extra: {len(extra_sources)} sources but {len(extra_targets)} targets")
    all_sources = [*sources, *extra_sources]
    all_targets = [*targets, *extra_targets]
    source_pieces = [_pieces(words) for words in all_sources]
    target_pieces = [_pieces(words) for words in all_targets]
    with tempfile.TemporaryDirectory(prefix="eflomal-") as tmp:
        forward, reverse = Path(tmp) / "forward", Path(tmp) / "reverse"
        eflomal.Aligner().align(
            [" ".join(pieces) for pieces, _ in source_pieces],
            [" ".join(pieces) for pieces, _ in target_pieces],
            links_filename_fwd=str(forward),
            links_filename_rev=str(reverse),
        )
        forward_links = _read_links(forward, len(sources))
        reverse_links = _read_links(reverse, len(sources))
    alignments = []
    for k in range(len(sources)):
        (src, src_word), (tgt, tgt_word) = source_pieces[k], target_pieces[k]
        links = _grow_diag_final_and(forward_links[k], reverse_links[k], len(src), len(tgt))
        words: Alignment = set()
        for i, j in links:
            source, target = src_word[i], tgt_word[j]
            if source is not None and target is not None:
                words.add((source, target))
        alignments.append(words)
    return alignments


def covering_span(alignment: Alignment, source_span: tuple[int, int]) -> tuple[int, int] | None:
    """The smallest target span [start, end) covering every target word aligned to a word of
    source_span [start, end); None when none is aligned."""
    start, end = source_span
    targets = [j for i, j in alignment if start <= i < end]
    return (min(targets), max(targets) + 1) if targets else None


def _pieces(words: Sequence[str]) -> tuple[list[str], list[int | None]]:
    """The aligner's tokens of a sentence and, for each, the index of the word it came from;
    None for punctuation glued to a word, whose links do not count for the word."""
    pieces: list[str] = []
    owner: list[int | None] = []
    for index, word in enumerate(words):
        found = _PIECE.findall(word)
        has_word_piece = any(_WORD.match(piece) for piece in found)
        for piece in found:
            pieces.append(piece)
            counts = not has_word_piece or _WORD.match(piece) is not None
            owner.append(index if counts else None)
    return pieces, owner


def _read_links(path: Path, n: int) -> list[Alignment]:
    """The first n lines of an eflomal links file ("i-j" pairs, source index first, in both
    directions' files)."""
    links: list[Alignment] = []
    with path.open(encoding="utf-8") as f:
        for line in itertools.islice(f, n):
            pairs = (link.split("-") for link in line.split())
            links.append({(int(i), int(j)) for i, j in pairs})
    if len(links) != n:
        raise RuntimeError(f"eflomal wrote {len(links)} alignments to {path.name}, expected {n}")
    return links


def _grow_diag_final_and(
    forward: Alignment, reverse: Alignment, n_source: int, n_target: int
) -> Alignment:
    union = forward | reverse
    links = forward & reverse
    source_aligned = {i for i, _ in links}
    target_aligned = {j for _, j in links}

    def add(i: int, j: int) -> None:
        links.add((i, j))
        source_aligned.add(i)
        target_aligned.add(j)

    grown = True
    while grown:  # grow-diag: until no neighbour of a link can be added
        grown = False
        for i, j in sorted(links):
            for di, dj in _NEIGHBOURS:
                p, q = i + di, j + dj
                new = (p, q) in union and (p, q) not in links
                if new and (p not in source_aligned or q not in target_aligned):
                    add(p, q)
                    grown = True
    for direction in (forward, reverse):  # final-and
        for i, j in sorted(direction):
            if i not in source_aligned and j not in target_aligned:
                add(i, j)
    if any(i >= n_source or j >= n_target for i, j in links):
        raise RuntimeError(f"eflomal linked past a sentence's {n_source}x{n_target} words")
    return links


def format_links(links: Alignment) -> str:
    """Pharaoh format: "i-j" pairs, sorted."""
    return " ".join(f"{i}-{j}" for i, j in sorted(links))


def parse_links(line: str) -> Alignment:
    """A Pharaoh line back into links; ValueError names what is not an "i-j" pair."""
    links: Alignment = set()
    for link in line.split():
        i, sep, j = link.partition("-")
        if not (sep and i.isdigit() and j.isdigit()):
            raise ValueError(f"{link!r} is not an i-j link")
        links.add((int(i), int(j)))
    return links


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m model.alignment",
        description="Word-align parallel text with eflomal (links for guided alignment).",
    )
    p.add_argument("--src", required=True, help="source text, one sentence per line (.gz ok)")
    p.add_argument("--tgt", required=True, help="target text, line by line with --src")
    p.add_argument("--out", required=True, type=Path, help="Pharaoh links, one line per pair")
    args = p.parse_args(argv)
    sources, targets = read_lines(args.src), read_lines(args.tgt)
    if len(sources) != len(targets):
        print(
            f"error: {len(sources)} source lines but {len(targets)} target lines", file=sys.stderr
        )
        return 2
    links = align([s.split() for s in sources], [t.split() for t in targets])
    opener = gzip.open if args.out.suffix == ".gz" else open
    with opener(args.out, "wt", encoding="utf-8") as f:
        f.writelines(format_links(pair) + "\n" for pair in links)
    return 0


if __name__ == "__main__":
    sys.exit(main())
