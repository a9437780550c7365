"""The shipped models translate val as their model cards say (torch decoder, the service's
default length penalty): a swapped, truncated or mis-tokenized checkpoint fails here. Both are
what `python -m service` serves by default."""

from pathlib import Path

import pytest

from model.data import read_parallel
from model.evaluate import score_translations, translate
from model.tokenizer import load_tokenizer
from model.transformer import load_model
from service.settings import Settings
from tests.conftest import REPO

CHECKPOINTS = REPO / "checkpoints"
# Each model card's val bleu_lc_tok: beam 5 at the service's default length penalty, and greedy.
CARD_VAL = {
    ("en", "de"): {5: 41.95, 1: 41.09},
    ("de", "en"): {5: 42.26, 1: 41.18},
}
# Float rounding differs between CPUs (and thread counts) and can flip a few beam decisions.
TOLERANCE = 0.3


@pytest.fixture(scope="module", params=sorted(CARD_VAL), ids=lambda pair: "-".join(pair))
def shipped_and_val(request: pytest.FixtureRequest, multi30k: Path) -> tuple:
    """A shipped model, its tokenizer, val's sources and references, and the card's figures."""
    source, target = request.param
    checkpoint = CHECKPOINTS / f"multi30k-{source}-{target}"
    val = read_parallel(multi30k / f"val.{source}.gz", multi30k / f"val.{target}.gz")
    model, tokenizer = load_model(checkpoint), load_tokenizer(checkpoint)
    return model, tokenizer, *val, target, CARD_VAL[request.param]


@pytest.mark.parametrize("beam_size", [5, 1])
def test_the_shipped_models_score_their_cards_val_figures(
    shipped_and_val: tuple, beam_size: int
) -> None:
    model, tokenizer, src, ref, target, card = shipped_and_val
    length_penalty = Settings.model_fields["default_length_penalty"].default
    texts, _ = translate(
        model, tokenizer, src, beam_size=beam_size, length_penalty=length_penalty, batch_size=64
    )
    score = score_translations(texts, ref, target)["bleu_lc_tok"]
    assert score == pytest.approx(card[beam_size], abs=TOLERANCE)


def test_the_service_serves_every_shipped_direction_by_default() -> None:
    defaults = [Path(p).name for p in Settings().checkpoint]
    assert defaults == ["multi30k-en-de", "multi30k-de-en"]
    for name in defaults:
        checkpoint = CHECKPOINTS / name
        assert (checkpoint / "MODEL_CARD.md").is_file()
        assert (checkpoint / "model.safetensors").stat().st_size < 40 * 2**20
