"""Validation during training: the loss per target token on the validation pairs, and
sacreBLEU of greedy translations of (the first valid_bleu_sentences of) their source side."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from tokenizers import Tokenizer
from torch import Tensor

from model.data import Batch, Example, token_budget_batches
from model.evaluate import score_translations, translate
from model.transformer import Transformer

# A batch's summed loss and the number of target tokens it is summed over.
LossFunction = Callable[[Batch], tuple[Tensor, int]]


@dataclass(frozen=True)
class ValidationSet:
    examples: list[Example]  # the pairs encoded, for the loss
    src: list[str]  # the source side as text, translated for BLEU
    ref: list[str]  # the references
    target_language: str  # for BLEU's tokenized variant (model.evaluate.score_translations)


@torch.inference_mode()
def validate(
    model: Transformer,
    tokenizer: Tokenizer,
    data: ValidationSet,
    loss: LossFunction,
    *,
    max_tokens: int,
    bleu_sentences: int,
    device: torch.device,
) -> dict[str, float]:
    """nll, ppl and bleu; `loss` is the trainer's (its precision), without label smoothing.
    The model is back in the mode it was in afterwards."""
    training = model.training
    model.eval()
    total, tokens = 0.0, 0
    for indices in token_budget_batches(data.examples, max_tokens):
        batch = Batch.from_examples([data.examples[i] for i in indices]).to(device)
        batch_loss, n = loss(batch)
        total, tokens = total + float(batch_loss), tokens + n
    n_bleu = min(bleu_sentences, len(data.src))
    texts, _ = translate(model, tokenizer, data.src[:n_bleu], beam_size=1, batch_size=128)
    scores = score_translations(texts, data.ref[:n_bleu], data.target_language)
    model.train(training)
    return {"nll": total / tokens, "ppl": math.exp(total / tokens), "bleu": scores["bleu"]}
