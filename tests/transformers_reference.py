"""transformers' MarianMTModel and MarianTokenizer as the reference the Marian tests compare with,
and M2M100ForConditionalGeneration with its tokenizers as the M2M100 and NLLB tests'.

`generate` runs transformers' search under the conventions this project's search follows, so
that both must give the same tokens (README: Serve an OPUS-MT model):
- early_stopping=True: a sentence is done once it has beam_size finished hypotheses (the
  published models' default, False, keeps searching while a running beam could still win);
- forced_eos_token_id=None: at the length limit the hypothesis ends without a forced </s>
  (finish_reason "length"), and its score is normalised by its length without </s>;
- max_new_tokens = max_decoding_length. Scores are the sum of the log-probs (with </s>) divided
  by length ** length_penalty, the length counting </s>, in both.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import torch
from transformers import (
    AutoTokenizer,
    M2M100ForConditionalGeneration,
    MarianMTModel,
    MarianTokenizer,
)


@dataclass(frozen=True)
class Reference:
    model: MarianMTModel
    tokenizer: MarianTokenizer


@cache
def reference(directory: Path) -> Reference:
    """The checkpoint as transformers loads it (once per directory)."""
    return Reference(
        MarianMTModel.from_pretrained(directory).eval(),
        MarianTokenizer.from_pretrained(directory),
    )


def source_texts(texts: Sequence[str], target_token: str | None = None) -> list[str]:
    """How a MarianTokenizer user asks a multi-target model for a target: ">>fr<< text"."""
    return [text if target_token is None else f"{target_token} {text}" for text in texts]


@torch.inference_mode()
def generate(
    ref: Reference,
    texts: Sequence[str],
    *,
    beam_size: int,
    max_decoding_length: int,
    length_penalty: float = 1.0,
    target_token: str | None = None,
) -> list[tuple[list[int], float | None]]:
    """(token ids without the start token and </s>, the beam score or None) per text."""
    batch = ref.tokenizer(source_texts(texts, target_token), return_tensors="pt", padding=True)
    out = ref.model.generate(
        **batch,
        num_beams=beam_size,
        max_new_tokens=max_decoding_length,
        length_penalty=length_penalty,
        early_stopping=True,
        forced_eos_token_id=None,
        do_sample=False,
        output_scores=beam_size > 1,
        return_dict_in_generate=True,
    )
    return _results(out, ref.model.config, start=1, beams=beam_size)  # without the start token


def decode(ref: Reference, ids: Sequence[int]) -> str:
    return str(ref.tokenizer.decode(list(ids), skip_special_tokens=True))


# (family, source, the targets one batch mixes): M2M100's codes are ISO 639-1, NLLB's
# FLORES-200 (the random models of tests/conftest.py).
MULTILINGUAL_CASES = [
    ("m2m100", "en", ("de", "ru", "zh")),
    ("nllb", "eng_Latn", ("deu_Latn", "fra_Latn", "zho_Hans")),
]


@dataclass(frozen=True)
class MultilingualReference:
    """transformers' M2M100ForConditionalGeneration with its tokenizer (M2M100Tokenizer or
    NllbTokenizer, as AutoTokenizer picks by tokenizer_config.json)."""

    model: M2M100ForConditionalGeneration
    tokenizer: Any

    def language_id(self, language: str) -> int:
        """A language's token id: "de" -> "__de__" for M2M100, "deu_Latn" itself for NLLB."""
        token = getattr(self.tokenizer, "lang_code_to_token", {}).get(language, language)
        return int(self.tokenizer.convert_tokens_to_ids(token))

    def encode(self, texts: Sequence[str], source: str) -> list[list[int]]:
        self.tokenizer.src_lang = source
        return [list(ids) for ids in self.tokenizer(list(texts))["input_ids"]]


@cache
def multilingual_reference(directory: Path) -> MultilingualReference:
    return MultilingualReference(
        M2M100ForConditionalGeneration.from_pretrained(directory).eval(),
        AutoTokenizer.from_pretrained(directory),
    )


@torch.inference_mode()
def generate_multilingual(
    ref: MultilingualReference,
    texts: Sequence[str],
    *,
    source: str,
    target: str,
    beam_size: int,
    max_decoding_length: int,
    length_penalty: float = 1.0,
) -> list[tuple[list[int], float | None]]:
    """(token ids without the start token, the forced target token and </s>, the beam score or
    None) per text: generate with forced_bos_token_id, under `generate`'s conventions (the
    forced token is one of max_new_tokens, as the service counts it on top of the limit)."""
    ref.tokenizer.src_lang = source
    batch = ref.tokenizer(list(texts), return_tensors="pt", padding=True)
    out = ref.model.generate(
        **batch,
        forced_bos_token_id=ref.language_id(target),
        num_beams=beam_size,
        max_new_tokens=max_decoding_length + 1,
        length_penalty=length_penalty,
        early_stopping=True,
        forced_eos_token_id=None,
        do_sample=False,
        output_scores=beam_size > 1,
        return_dict_in_generate=True,
    )
    # without the decoder's start token and the forced target token
    return _results(out, ref.model.config, start=2, beams=beam_size)


def generate_mixed(
    ref: MultilingualReference,
    texts: Sequence[str],
    *,
    source: str,
    targets: Sequence[str],
    beam_size: int,
    max_decoding_length: int,
    length_penalty: float = 1.0,
) -> tuple[list[str], list[tuple[list[int], float | None]]]:
    """Text i into targets[i % len(targets)] (the tests' batches of mixed targets): those
    targets, and `generate_multilingual`'s result for each text alone."""
    wanted = [targets[i % len(targets)] for i in range(len(texts))]
    expected = [
        generate_multilingual(
            ref, [text], source=source, target=target, beam_size=beam_size,
            max_decoding_length=max_decoding_length, length_penalty=length_penalty,
        )[0]
        for text, target in zip(texts, wanted, strict=True)
    ]  # fmt: skip
    return wanted, expected


def _results(
    out: Any, config: Any, *, start: int, beams: int
) -> list[tuple[list[int], float | None]]:
    """generate's rows as (ids from `start` up to </s> or padding, the beam score or None)."""
    results = []
    for i, row in enumerate(out.sequences.tolist()):
        ids = row[start:]
        for end, token in enumerate(ids):
            if token in (config.eos_token_id, config.pad_token_id):
                ids = ids[:end]
                break
        results.append((ids, float(out.sequences_scores[i]) if beams > 1 else None))
    return results
