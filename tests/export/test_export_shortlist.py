"""export/shortlist.py and the shortlist's decoder step: what is counted, what the graph scores
with it, and the bundle files that carry it."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from export.onnx_export import main
from export.parity import check_parity, open_bundle
from export.shortlist import count_shortlist
from model.transformer import load_model
from service.bundle.decoding import DecodingOptions
from service.bundle.manifest import (
    LOG_PROBS,
    MANIFEST_FILE,
    SHORTLIST,
    SHORTLIST_FILE,
    SHORTLIST_MASK,
    BundleError,
    file_entry,
    load_bundle,
)
from service.inference.engine import Engine
from service.inference.shortlist import Shortlist
from tests.conftest import SHIPPED_CHECKPOINT


def test_counts_the_most_frequent_ids_and_each_source_ids_most_common_translations() -> None:
    # Target 9 is in every pair (frequent); 5 goes with source 1 three times, 6 twice, 7 once.
    pairs = [
        ([1, 2], [9, 5, 6]),
        ([1], [9, 5, 6, 6]),
        ([1, 3], [9, 5, 7]),
        ([3, 3], [9, 8, 4]),
        ([3], [9, 8, 4]),
        ([2], [9, 4]),
    ]
    shortlist = count_shortlist(pairs, 5, 10, frequent=1, per_token=2, excluded=[4])
    # 6 is seen 3 times, 5 and 4 too, but 9 six times; 4 is excluded everywhere.
    assert shortlist.frequent.tolist() == [9]
    by_source = {
        s: shortlist.targets[shortlist.offsets[s] : shortlist.offsets[s + 1]].tolist()
        for s in range(5)
    }
    # Source 1: 5 (3 pairs), 6 (2 pairs), 7 (1 pair: under two, never); per_token 2.
    # Source 3: 8 (2 pairs; a repeated id counts once a pair), 5 and 7 once; 4 excluded.
    # Source 2: 5, 6 once each (under two); 4 excluded.
    assert by_source == {0: [], 1: [5, 6], 2: [], 3: [8], 4: []}
    narrower = count_shortlist(pairs, 5, 10, frequent=2, per_token=1)
    # Ties go to the lower id: 4, 5 and 6 are each seen three times.
    assert narrower.frequent.tolist() == [4, 9]
    assert narrower.targets[narrower.offsets[1] : narrower.offsets[2]].tolist() == [5]
    with pytest.raises(ValueError, match="frequent"):
        count_shortlist(pairs, 5, 10, frequent=0, per_token=1)


def _with_shortlist(bundle: Path, out: Path, **arrays: np.ndarray) -> Path:
    """A copy of `bundle` with these shortlist arrays in its file (the manifest's hash too)."""
    out.mkdir()
    for path in bundle.iterdir():
        (out / path.name).write_bytes(path.read_bytes())
    with (out / SHORTLIST_FILE).open("wb") as f:
        np.savez(f, **arrays)
    manifest = json.loads((out / MANIFEST_FILE).read_text())
    entry = file_entry(out / SHORTLIST_FILE)
    manifest["files"][SHORTLIST_FILE] = {"sha256": entry.sha256, "size": entry.size}
    (out / MANIFEST_FILE).write_text(json.dumps(manifest))
    return out


def test_a_shortlist_of_every_id_scores_as_the_full_vocabulary(
    tmp_path: Path, shortlist_bundle: Path, shipped_bundle: Path, val_src: list[str]
) -> None:
    """The graph itself: a shortlist that lets every sentence produce every id gives the full
    bundle's translations and scores (the projection and log-softmax over the same ids,
    gathered instead of multiplied whole)."""
    vocab = load_model(SHIPPED_CHECKPOINT).config.vocab_size
    every = _with_shortlist(
        shortlist_bundle, tmp_path / "every", frequent=np.arange(vocab),
        offsets=np.zeros(vocab + 1, np.int64), targets=np.zeros(0, np.int64),
    )  # fmt: skip
    shortlisted = Engine.load(every, device="cpu", intra_op_threads=1)
    full = Engine.load(shipped_bundle, device="cpu", intra_op_threads=1)
    sources = full.encode(val_src[:12])
    for options in (DecodingOptions(), DecodingOptions(beam_size=4, num_hypotheses=2)):
        got, expected = shortlisted.generate(sources, options), full.generate(sources, options)
        for a, b in zip(got, expected, strict=True):
            assert [h.ids for h in a] == [h.ids for h in b]
            assert [h.score for h in a] == pytest.approx([h.score for h in b], abs=1e-4)


def test_the_bundle_carries_the_shortlist_and_its_step_takes_it(shortlist_bundle: Path) -> None:
    bundle = load_bundle(shortlist_bundle)
    manifest = bundle.manifest
    assert manifest.shortlist is not None
    assert manifest.shortlist.file == SHORTLIST_FILE and SHORTLIST_FILE in manifest.files
    assert manifest.shortlist.frequent == 100 and manifest.shortlist.per_token == 20
    names = manifest.decoder_step.input_names
    assert names[names.index("top_k") + 1 : names.index("top_k") + 3] == [SHORTLIST, SHORTLIST_MASK]
    assert manifest.decoder_step.tensor(LOG_PROBS).shape == ["rows", "shortlist"]
    shortlist = Shortlist.load(bundle)
    assert shortlist is not None
    assert manifest.special_ids.eos in shortlist.frequent
    assert len(shortlist.frequent) == 100  # </s> among them: every target ends with it


def test_a_malformed_shortlist_is_refused(shortlist_bundle: Path, tmp_path: Path) -> None:
    broken = _with_shortlist(  # one source id short
        shortlist_bundle, tmp_path / "broken", frequent=np.array([2]), offsets=np.zeros(10),
        targets=np.zeros(0),
    )  # fmt: skip
    with pytest.raises(BundleError, match="does not map the 8000 source ids"):
        Engine.load(broken, device="cpu")


def test_parity_with_the_model_is_checked_without_the_shortlist(shortlist_bundle: Path) -> None:
    with pytest.raises(BundleError, match="without --shortlist"):
        check_parity(load_model(SHIPPED_CHECKPOINT), open_bundle(shortlist_bundle), [[5, 2]])


def test_the_export_command_counts_a_shortlist(tmp_path: Path, multi30k: Path) -> None:
    missing = tmp_path / "missing.de"
    code = main(
        ["--checkpoint", str(SHIPPED_CHECKPOINT), "--out", str(tmp_path / "b"),
         "--shortlist", str(multi30k / "val.en.gz"), str(missing)]
    )  # fmt: skip
    assert code == 2  # a clear error, nothing half-written that loads
    with pytest.raises(BundleError, match="missing"):
        load_bundle(tmp_path / "b")
    code = main(
        ["--checkpoint", str(SHIPPED_CHECKPOINT), "--out", str(tmp_path / "b"),
         "--shortlist", str(multi30k / "val.en.gz"), str(multi30k / "val.de.gz"),
         "--shortlist-frequent", "50", "--shortlist-per-token", "5"]
    )  # fmt: skip
    assert code == 0
    manifest = load_bundle(tmp_path / "b").manifest
    assert manifest.shortlist is not None
    assert (manifest.shortlist.frequent, manifest.shortlist.per_token) == (50, 5)
    assert manifest.shortlist.corpus == "val.en.gz / val.de.gz"
