"""Session-wide fixtures: the Multi30k location, a tiny checkpoint built once per session, and
the ONNX bundles exported from it (fp32, fp16, int8), shared by the export and service tests;
and small random Marian checkpoints in transformers' format (benchmarks/marian_checkpoint.py),
imported and exported once per session."""

from __future__ import annotations

import importlib.util
import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from benchmarks.paths import MULTI30K, REPO
from benchmarks.servers import RedisServer
from export.onnx_export import export_bundle
from model.data import read_lines
from model.importers.marian import import_checkpoint as import_marian
from model.tokenizer import TOKENIZER_FILE, train_tokenizer
from model.transformer import CONFIG_FILE, EOS_ID, ModelConfig, Transformer, load_model, save_model

SHIPPED_CHECKPOINT = REPO / "checkpoints" / "multi30k-en-de"

# Small enough to build and decode in seconds, with every architectural part present.
TINY_TEST_CONFIG = dict(
    d_model=32, d_ff=64, h=4, n_encoder_layers=2, n_decoder_layers=2, dropout=0.1, max_positions=48
)


@pytest.fixture(scope="session", autouse=True)
def _thai_splitter_loaded() -> None:
    """PyThaiNLP's CRFCut (service/text/segment.py) loads on the first Thai text, ~0.35 s:
    once, here, and not inside an example that hypothesis times against its deadline. Where
    PyThaiNLP is not installed (the GPU machine's python, which runs `pytest -m gpu` with only the
    serving wheels), nothing is loaded: the Thai tests then fail on their own."""
    if importlib.util.find_spec("pythainlp") is None:
        return
    from service.text.segment import split

    split("สวัสดีครับ ขอบคุณครับ")


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """Debian's redis-server on a free loopback port, for the session (benchmarks/servers.py),
    persistent as deploy/ runs it (what was written survives its stop and start); skipped where
    it is not installed."""
    try:
        server = RedisServer(tmp_path_factory.mktemp("redis"), persistent=True)
    except FileNotFoundError as e:
        pytest.skip(str(e))
    server.start()
    yield server
    server.stop()


def emptied(redis_server: RedisServer) -> str:
    """The session's Redis, running (a fault test may have stopped or frozen it) and empty:
    its URL."""
    if redis_server.process is None or redis_server.process.poll() is not None:
        redis_server.start()
    else:
        redis_server.thaw()
    redis_server.flush()
    return redis_server.url


@pytest.fixture
def redis_url(redis_server: RedisServer) -> str:
    """The session's Redis, running and empty (emptied)."""
    return emptied(redis_server)


@pytest.fixture(scope="session")
def multi30k() -> Path:
    if not (MULTI30K / "train.en.gz").is_file():
        pytest.skip(f"Multi30k not found at {MULTI30K} (set MULTI30K_DIR)")
    return MULTI30K


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory: pytest.TempPathFactory, multi30k: Path) -> Path:
    """A checkpoint directory (config.json, model.safetensors, tokenizer.json) with random
    weights and a real BPE trained on 2000 Multi30k lines: what export and serving consume."""
    out = tmp_path_factory.mktemp("tiny_checkpoint")
    src = read_lines(multi30k / "train.en.gz")[:2000]
    tgt = read_lines(multi30k / "train.de.gz")[:2000]
    tokenizer = train_tokenizer(src + tgt, vocab_size=600)
    tokenizer.save(str(out / TOKENIZER_FILE))
    torch.manual_seed(0)
    config = ModelConfig(vocab_size=tokenizer.get_vocab_size(), **TINY_TEST_CONFIG)  # type: ignore[arg-type]
    save_model(
        Transformer(config).eval(),
        out,
        {"source_language": "en", "target_language": "de", "note": "random weights, tests only"},
    )
    return out


N_SENTENCES = 20


@pytest.fixture(scope="session")
def shipped_bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The shipped model as `python -m service` serves it (fp32 bundle, exported once)."""
    out = tmp_path_factory.mktemp("shipped_bundle")
    export_bundle(SHIPPED_CHECKPOINT, out)
    return out


# A shortlist small enough that sentences' ids differ (100 frequent, 20 per source id).
SHORTLIST_SIZES = {"shortlist_frequent": 100, "shortlist_per_token": 20}


@pytest.fixture(scope="session")
def shortlist_bundle(tmp_path_factory: pytest.TempPathFactory, multi30k: Path) -> Path:
    """The shipped model's fp32 bundle with a vocabulary shortlist counted on Multi30k's
    training data (export/shortlist.py)."""
    out = tmp_path_factory.mktemp("shortlist_bundle")
    corpus = (multi30k / "train.en.gz", multi30k / "train.de.gz")
    export_bundle(SHIPPED_CHECKPOINT, out, shortlist=corpus, **SHORTLIST_SIZES)  # type: ignore[arg-type]
    return out


@pytest.fixture(scope="session")
def shipped_de_en_bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The shipped German -> English model's fp32 bundle, exported once."""
    out = tmp_path_factory.mktemp("shipped_de_en_bundle")
    export_bundle(REPO / "checkpoints" / "multi30k-de-en", out)
    return out


@pytest.fixture(scope="session")
def fp32_bundle(tiny_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("bundle_fp32")
    export_bundle(tiny_checkpoint, out)
    return out


@pytest.fixture(scope="session")
def gather_bundle(tiny_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """fp32 with the portable cache (service/bundle/manifest.py): the CUDA graph, run on the CPU."""
    out = tmp_path_factory.mktemp("bundle_gather")
    export_bundle(tiny_checkpoint, out, cache="gather")
    return out


@pytest.fixture(scope="session")
def int8_bundle(tiny_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("bundle_int8")
    export_bundle(tiny_checkpoint, out, dtype="int8")
    return out


@pytest.fixture(scope="session")
def fp16_bundle(tiny_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("bundle_fp16")
    export_bundle(tiny_checkpoint, out, dtype="fp16")
    return out


@pytest.fixture(scope="session")
def eos_checkpoint(tiny_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny checkpoint edited so that searches end with </s> after 6 to 48 tokens.

    With random weights every hypothesis runs to max_positions, so finished rows would never
    leave the batch (Stepper.select) and parity would not cover that path. Making </s>'s
    embedding longer and pushing the last decoder norm's output towards it gives varied lengths.
    """
    model = load_model(tiny_checkpoint)
    with torch.no_grad():
        eos = model.embedding.weight[EOS_ID]
        model.decoder_layers[-1].sublayer[-1].norm.bias += eos / eos.norm()
        eos *= 4
    out = tmp_path_factory.mktemp("eos_checkpoint")
    meta = json.loads((tiny_checkpoint / CONFIG_FILE).read_text())
    meta.pop("model")
    save_model(model, out, meta)
    shutil.copyfile(tiny_checkpoint / TOKENIZER_FILE, out / TOKENIZER_FILE)
    return out


@pytest.fixture(scope="session")
def eos_bundle(eos_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("bundle_eos")
    export_bundle(eos_checkpoint, out)
    return out


@pytest.fixture(scope="session")
def eos_gather_bundle(eos_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("bundle_eos_gather")
    export_bundle(eos_checkpoint, out, cache="gather")
    return out


@pytest.fixture(scope="session")
def val_src(multi30k: Path) -> list[str]:
    return read_lines(multi30k / "val.en.gz")[:N_SENTENCES]


@pytest.fixture(scope="session")
def val_ref(multi30k: Path) -> list[str]:
    return read_lines(multi30k / "val.de.gz")[:N_SENTENCES]


# --- Marian (OPUS-MT-shaped) checkpoints: random weights, SentencePiece trained on Multi30k ---

MARIAN_LINES = 3000  # training lines per SentencePiece model
# With this seed the en-de model's greedy and beam searches end with </s> at varied lengths on
# the val sentences as well as at the length limit (tests/model/test_import_marian.py checks).
MARIAN_SEED = 0


def write_checkpoint(*args: Any, **kwargs: Any) -> Path:
    """benchmarks/marian_checkpoint.py's, imported only when a Marian test needs it: it needs
    transformers, which the GPU tests' machine may not have (`pytest -m gpu` imports this file)."""
    from benchmarks.marian_checkpoint import write_checkpoint

    return write_checkpoint(*args, **kwargs)


@pytest.fixture(scope="session")
def marian_dir(multi30k: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """en -> de, one shared vocabulary, as transformers' save_pretrained writes it."""
    return write_checkpoint(
        tmp_path_factory.mktemp("hf") / "opus-mt-en-de",
        read_lines(multi30k / "train.en.gz")[:MARIAN_LINES],
        read_lines(multi30k / "train.de.gz")[:MARIAN_LINES],
        seed=MARIAN_SEED,
    )


@pytest.fixture(scope="session")
def marian_separate_dir(multi30k: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """en -> fr with separate source and target vocabularies and embeddings."""
    return write_checkpoint(
        tmp_path_factory.mktemp("hf") / "opus-mt-en-fr",
        read_lines(multi30k / "train.en.gz")[:MARIAN_LINES],
        read_lines(multi30k / "train.fr.gz")[:MARIAN_LINES],
        target_language="fr",
        separate_vocabs=True,
        seed=MARIAN_SEED,
    )


@pytest.fixture(scope="session")
def marian_multi_dir(multi30k: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """de -> en and fr: a multi-target model that reads >>en<< or >>fr<< first."""
    targets = [*read_lines(multi30k / "train.en.gz"), *read_lines(multi30k / "train.fr.gz")]
    return write_checkpoint(
        tmp_path_factory.mktemp("hf") / "opus-mt-de-mul",
        read_lines(multi30k / "train.de.gz")[:MARIAN_LINES],
        targets[:: len(targets) // MARIAN_LINES],
        source_language="de",
        target_language="mul",
        target_codes=["en", "fr"],
        seed=MARIAN_SEED,
    )


@pytest.fixture(scope="session")
def marian_renormalized_dir(marian_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The en -> de model with renormalize_logits in its generation config, as some OPUS-MT
    uploads have: the suppressed pad token's probability goes to the other tokens."""
    out = tmp_path_factory.mktemp("hf") / "opus-mt-en-de-renormalized"
    shutil.copytree(marian_dir, out)
    generation = json.loads((out / "generation_config.json").read_text())
    generation["renormalize_logits"] = True
    (out / "generation_config.json").write_text(json.dumps(generation))
    return out


def _imported(directory: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("imported") / directory.name
    import_marian(directory, out)
    return out


@pytest.fixture(scope="session")
def marian_checkpoint(marian_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _imported(marian_dir, tmp_path_factory)


@pytest.fixture(scope="session")
def marian_separate_checkpoint(
    marian_separate_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Path:
    return _imported(marian_separate_dir, tmp_path_factory)


@pytest.fixture(scope="session")
def marian_renormalized_checkpoint(
    marian_renormalized_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Path:
    return _imported(marian_renormalized_dir, tmp_path_factory)


@pytest.fixture(scope="session")
def marian_multi_checkpoint(
    marian_multi_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Path:
    return _imported(marian_multi_dir, tmp_path_factory)


def _exported(checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("bundle") / checkpoint.name
    export_bundle(checkpoint, out)
    return out


@pytest.fixture(scope="session")
def marian_bundle(marian_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _exported(marian_checkpoint, tmp_path_factory)


@pytest.fixture(scope="session")
def marian_separate_bundle(
    marian_separate_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory
) -> Path:
    return _exported(marian_separate_checkpoint, tmp_path_factory)


@pytest.fixture(scope="session")
def marian_multi_bundle(
    marian_multi_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory
) -> Path:
    return _exported(marian_multi_checkpoint, tmp_path_factory)


@pytest.fixture(scope="session")
def marian_renormalized_bundle(
    marian_renormalized_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory
) -> Path:
    return _exported(marian_renormalized_checkpoint, tmp_path_factory)


# A multilingual sample (Latin with diacritics and combining marks, Cyrillic, Greek, CJK,
# Arabic, Devanagari, Thai, emoji): the M2M100 and NLLB tests' tokenizers learn it along with
# Multi30k, and their tokenization and parity tests translate it.
MULTILINGUAL_SAMPLE = [
    "A dog runs through the green park.",
    "Zwei Männer spielen Fußball auf dem Rasen.",
    "Une femme lit un livre près de la fenêtre.",
    "Café, naïve, fiancée: e\u0301te\u0301 décomposé.",
    "Привет, как дела? Собака бежит по снегу.",
    "Γειά σου κόσμε, ο σκύλος τρέχει.",
    "你好，世界。一只狗在公园里跑。",
    "今日は晴れです。犬が走っています。",
    "مرحبا بالعالم، الكلب يركض في الحديقة.",
    "नमस्ते दुनिया, कुत्ता पार्क में दौड़ता है।",
    "สวัสดีครับ สุนัขวิ่งในสวน",
    "Emoji 😀🎉👍 and a flag 🇩🇪 in text.",
]
M2M100_LINES = 600  # Multi30k lines per language the tokenizers learn from, besides the sample


def _m2m100_lines(multi30k: Path) -> list[str]:
    lines = [*MULTILINGUAL_SAMPLE]
    for language in ("en", "de", "fr"):
        lines += read_lines(multi30k / f"train.{language}.gz")[:M2M100_LINES]
    return lines


@pytest.fixture(scope="session")
def m2m100_dir(multi30k: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An M2M100-shaped random model (SentencePiece + vocab.json, the "wmt21" languages), as
    transformers' save_pretrained writes it."""
    from benchmarks.m2m100_checkpoint import write_checkpoint as write_m2m100

    return write_m2m100(
        tmp_path_factory.mktemp("hf") / "m2m100", _m2m100_lines(multi30k), family="m2m100"
    )


@pytest.fixture(scope="session")
def nllb_dir(multi30k: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An NLLB-200-shaped random model (tokenizer.json with the 202 language codes)."""
    from benchmarks.m2m100_checkpoint import write_checkpoint as write_m2m100

    return write_m2m100(
        tmp_path_factory.mktemp("hf") / "nllb", _m2m100_lines(multi30k), family="nllb"
    )


def _imported_m2m100(directory: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from model.importers.m2m100 import import_checkpoint as import_m2m100

    out = tmp_path_factory.mktemp("imported") / directory.name
    import_m2m100(directory, out)
    return out


@pytest.fixture(scope="session")
def m2m100_checkpoint(m2m100_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _imported_m2m100(m2m100_dir, tmp_path_factory)


@pytest.fixture(scope="session")
def nllb_checkpoint(nllb_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _imported_m2m100(nllb_dir, tmp_path_factory)


@pytest.fixture(scope="session")
def m2m100_bundle(m2m100_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("bundle") / "m2m100"
    export_bundle(m2m100_checkpoint, out)
    return out


@pytest.fixture(scope="session")
def nllb_bundle(nllb_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("bundle") / "nllb"
    export_bundle(nllb_checkpoint, out)
    return out
