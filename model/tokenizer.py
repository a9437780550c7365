"""Joint byte-level BPE over source and target text (Hugging Face `tokenizers`).

Byte-level BPE never needs <unk>: any Unicode input round-trips, so the service cannot lose
characters the training corpus never showed. The special tokens have fixed ids (pad 0, bos 1,
eos 2, unk 3) that the model, the export and the service all rely on.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

from model.transformer import BOS_ID, EOS_ID, PAD_ID, UNK_ID

TOKENIZER_FILE = "tokenizer.json"
SPECIAL_TOKENS = {PAD_ID: "<pad>", BOS_ID: "<s>", EOS_ID: "</s>", UNK_ID: "<unk>"}


def _new_tokenizer() -> Tokenizer:
    tokenizer = Tokenizer(models.BPE(unk_token=SPECIAL_TOKENS[UNK_ID]))
    # Normalisation is part of the file, so serving applies exactly what training saw.
    tokenizer.normalizer = normalizers.Sequence(
        [normalizers.NFKC(), normalizers.Replace(Regex(r"\s+"), " "), normalizers.Strip()]
    )
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
    # ByteLevel decoding restores the prefix space added above; strip it again.
    tokenizer.decoder = decoders.Sequence(
        [decoders.ByteLevel(), decoders.Strip(content=" ", left=1, right=0)]
    )
    return tokenizer


def train_tokenizer(texts: Iterable[str], vocab_size: int, min_frequency: int = 2) -> Tokenizer:
    """Train one BPE vocabulary on both sides of the parallel text."""
    tokenizer = _new_tokenizer()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=[SPECIAL_TOKENS[i] for i in sorted(SPECIAL_TOKENS)],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer)
    return _checked(tokenizer)


def _checked(tokenizer: Tokenizer) -> Tokenizer:
    """Fixed special ids, and user text that spells "</s>" stays text.

    `encode_special_tokens` is not stored in tokenizer.json: every loader must set it (the
    service's engine does the same), or a client could inject an end-of-sentence token.
    """
    tokenizer.encode_special_tokens = True
    for token_id, token in SPECIAL_TOKENS.items():
        if tokenizer.token_to_id(token) != token_id:
            raise ValueError(
                f"tokenizer maps {token} to {tokenizer.token_to_id(token)}, not {token_id}"
            )
    return tokenizer


def load_tokenizer(path: str | Path) -> Tokenizer:
    path = Path(path)
    if path.is_dir():
        path = path / TOKENIZER_FILE
    if not path.is_file():
        raise FileNotFoundError(f"no tokenizer file at {path}")
    return _checked(Tokenizer.from_file(str(path)))


def normalize(tokenizer: Tokenizer, text: str) -> str:
    """The text as the tokenizer sees it; decode(encode(text)) gives back exactly this."""
    normalizer = tokenizer.normalizer
    return normalizer.normalize_str(text) if normalizer is not None else text
