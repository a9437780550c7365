"""The shipped model translates val as its model card says (torch decoder, the service's default
length penalty): a swapped, truncated or mis-tokenized checkpoint fails here."""

from pathlib import Path

import pytest

from model.data import read_parallel
from model.evaluate import score_translations, translate
from model.tokenizer import load_tokenizer
from model.transformer import load_model
from service.settings import Settings

SHIPPED = Path(__file__).resolve().parents[2] / "checkpoints" / "multi30k-en-de"
# The model card's val bleu_lc_tok: beam 5 at the service's default length penalty, and greedy.
CARD_VAL = {5: 41.95, 1: 41.09}
# Float rounding differs between CPUs (and thread counts) and can flip a few beam decisions.
TOLERANCE = 0.3


@pytest.fixture(scope="module")
def shipped_and_val(multi30k: Path) -> tuple:
    """The model and tokenizer, and val's sources and references, read once for both cases."""
    val = read_parallel(multi30k / "val.en.gz", multi30k / "val.de.gz")
    return load_model(SHIPPED), load_tokenizer(SHIPPED), *val


@pytest.mark.parametrize("beam_size", sorted(CARD_VAL))
def test_the_shipped_model_scores_its_cards_val_figures(
    shipped_and_val: tuple, beam_size: int
) -> None:
    model, tokenizer, src, ref = shipped_and_val
    length_penalty = Settings.model_fields["default_length_penalty"].default
    texts, _ = translate(
        model, tokenizer, src, beam_size=beam_size, length_penalty=length_penalty, batch_size=64
    )
    score = score_translations(texts, ref, "de")["bleu_lc_tok"]
    assert score == pytest.approx(CARD_VAL[beam_size], abs=TOLERANCE)
