import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from model.data import read_lines
from model.tokenizer import SPECIAL_TOKENS, load_tokenizer, normalize, train_tokenizer


@pytest.fixture(scope="module")
def tokenizer(multi30k, tmp_path_factory):
    src = read_lines(multi30k / "train.en.gz")[:1000]
    tgt = read_lines(multi30k / "train.de.gz")[:1000]
    tok = train_tokenizer(src + tgt, vocab_size=800)
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    tok.save(str(path))
    return load_tokenizer(path)


def test_special_tokens_have_fixed_ids(tokenizer) -> None:
    for token_id, token in SPECIAL_TOKENS.items():
        assert tokenizer.token_to_id(token) == token_id
    assert tokenizer.get_vocab_size() == 800


def test_joint_vocabulary_covers_both_languages(tokenizer) -> None:
    en = tokenizer.encode("A man is walking")
    de = tokenizer.encode("Ein Mann geht")
    assert len(en.ids) <= 5 and len(de.ids) <= 4


def test_normalization_is_nfkc_and_whitespace(tokenizer) -> None:
    assert normalize(tokenizer, "  Ein\u00a0 Hund\t\nläuft ﬁ  ") == "Ein Hund läuft fi"


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=60))
def test_round_trip_gives_back_the_normalized_text(tokenizer, text: str) -> None:
    ids = tokenizer.encode(text).ids
    assert tokenizer.decode(ids) == normalize(tokenizer, text)
    assert 3 not in ids  # byte-level BPE never needs <unk>


def test_special_token_spellings_in_user_text_stay_text(tokenizer) -> None:
    ids = tokenizer.encode("ein </s> <s> <pad> Hund").ids
    assert not set(ids) & set(SPECIAL_TOKENS)
    assert tokenizer.decode(ids) == "ein </s> <s> <pad> Hund"


def test_load_rejects_missing_file(tmp_path) -> None:
    with pytest.raises(FileNotFoundError, match="no tokenizer file"):
        load_tokenizer(tmp_path)
