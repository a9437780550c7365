"""The training and evaluation CLIs, end to end, on a synthetic task and on bad inputs."""

import copy
import hashlib
import json
import random
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from model import evaluate, train
from model.data import Batch, Example
from model.training.loop import Trainer, learning_rate
from model.training.recipe import TrainConfig
from model.transformer import EOS_ID, ModelConfig, Transformer
from tests.conftest import REPO

SYMBOLS = ["a", "b", "c", "d", "e", "f", "g", "h", "i", "j", "k", "l"]


def _write_reverse_task(directory, n: int, seed: int) -> tuple:
    rng = random.Random(seed)
    src, tgt = [], []
    for _ in range(n):
        seq = [rng.choice(SYMBOLS) for _ in range(rng.randint(3, 7))]
        src.append(" ".join(seq))
        tgt.append(" ".join(reversed(seq)))
    paths = directory / f"rev{seed}.src", directory / f"rev{seed}.tgt"
    paths[0].write_text("\n".join(src) + "\n")
    paths[1].write_text("\n".join(tgt) + "\n")
    return paths


RECIPES = REPO / "recipes"

RECIPE = {
    # The tiny preset (4+4 layers, d_model 128, 4 heads), pre-norm, less dropout for a clean
    # task. Post-norm needs a lower peak: test_post_norm_learns_to_reverse_at_its_recipes_peak.
    "model": {"preset": "tiny", "dropout": 0.1, "max_positions": 32, "norm": "pre"},
    "training": {
        "max_tokens": 1024,
        "lr": 0.003,
        "warmup_updates": 100,
        "vocab_size": 64,
        "max_len": 16,
        "log_every": 25,
        "save_every": 50,
        "valid_every": 1000,
        # The last checkpoint alone swings between seeds and CPUs (greedy exact match at update
        # 800: 0.86 for seed 1 on an AMD EPYC, 0.94 on another CPU, 1.0 for seed 2; 0.93 for
        # seed 2 at 1,600); the average of the last four (650-800) had 1.0 for seeds 1-4.
        "average_last": 4,
        "valid_bleu_sentences": 100,
    },
}


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    d = tmp_path_factory.mktemp("reverse")
    train_src, train_tgt = _write_reverse_task(d, 4000, seed=1)
    valid_src, valid_tgt = _write_reverse_task(d, 200, seed=2)
    (d / "recipe.json").write_text(json.dumps(RECIPE))
    out = d / "run"
    common = [
        "--src-train", str(train_src), "--tgt-train", str(train_tgt),
        "--src-valid", str(valid_src), "--tgt-valid", str(valid_tgt),
        "--out", str(out), "--config", str(d / "recipe.json"),
    ]  # fmt: skip
    # Train 300 updates, then resume to 800: the second run must continue, not restart.
    assert train.main([*common, "--max-updates", "300"]) == 0
    first = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    # A crash after logging past the last checkpoint leaves rows that resuming must drop.
    with open(out / "metrics.jsonl", "a") as f:
        stale = {"update": 310, "split": "train", "loss": 9.9, "tokens_per_s": 1}
        f.write(json.dumps(stale) + "\n")
    assert train.main([*common, "--max-updates", "800", "--resume"]) == 0
    return d, out, first, (valid_src, valid_tgt)


def test_outputs_and_provenance(trained) -> None:
    d, out, _, _ = trained
    for name in ("model.safetensors", "config.json", "tokenizer.json", "metrics.jsonl"):
        assert (out / name).is_file(), name
    # Only the checkpoints being averaged and the single-file resumable state are kept.
    averaged = [f"update_{n:06d}.safetensors" for n in (650, 700, 750, 800)]
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == [
        "last_state.safetensors",
        *averaged,
    ]
    assert (out / "training_curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    config = json.loads((out / "config.json").read_text())
    assert config["model"]["d_model"] == 128 and config["model"]["n_encoder_layers"] == 4
    assert config["training"]["max_updates"] == 800
    src = config["data"]["src_train"]
    assert src["sha256"] == hashlib.sha256((d / "rev1.src").read_bytes()).hexdigest()
    assert src["lines"] == 4000
    assert config["averaged_checkpoints"] == averaged
    assert not list(out.rglob("*.tmp"))


def test_resume_continues_from_the_saved_update(trained) -> None:
    _, out, first, _ = trained
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    train_updates = [r["update"] for r in rows if r["split"] == "train"]
    assert train_updates == list(range(25, 801, 25))  # no update logged twice, none missing
    assert max(r["update"] for r in first) == 300
    assert all(r["tokens_per_s"] > 0 for r in rows if r["split"] == "train")


def test_tiny_preset_learns_to_reverse(trained, tmp_path, capsys) -> None:
    _, out, _, (valid_src, valid_tgt) = trained
    hyp = tmp_path / "hyp.txt"
    args = ["--checkpoint", str(out), "--src", str(valid_src), "--ref", str(valid_tgt)]
    assert evaluate.main([*args, "--beam-size", "1", "--hyp-out", str(hyp)]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    refs = valid_tgt.read_text().splitlines()
    hyps = hyp.read_text().splitlines()
    exact = sum(h == r for h, r in zip(hyps, refs, strict=True)) / len(refs)
    assert exact >= 0.95, f"exact match {exact:.3f}"
    assert result["n_sentences"] == 200 and result["bleu"] > 90
    assert {"bleu", "bleu_lc_tok", "chrf", "seconds"} <= set(result)
    # Beam search and the uncached decoder agree with the greedy, cached result here.
    assert evaluate.main([*args, "--beam-size", "4", "--decoder", "uncached"]) == 0
    beam = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert beam["bleu"] == pytest.approx(result["bleu"], abs=2.0)


def _first_train_loss(out: Path) -> float:
    rows = map(json.loads, (out / "metrics.jsonl").read_text().splitlines())
    return next(r["loss"] for r in rows if r["split"] == "train")


def test_init_from_continues_the_trained_model(trained, tmp_path) -> None:
    """--init-from starts from a trained model's weights, model config and tokenizer: at
    learning rate 0 the result is that model bit for bit; with a small one it starts where the
    model was, far below the same 25 updates of the same architecture from scratch."""
    d, out, _, (valid_src, valid_tgt) = trained
    recipe = tmp_path / "continue.json"
    continued = {**RECIPE["training"], "warmup_updates": 10}
    recipe.write_text(json.dumps({"training": continued}))
    # From scratch the recipe names the model (--init-from takes the trained one's); without
    # it the default preset would train a 44M-parameter model, 100 s of this test.
    scratch_recipe = tmp_path / "scratch.json"
    scratch_recipe.write_text(json.dumps({"model": RECIPE["model"], "training": continued}))
    common = [
        "--src-train", str(d / "rev1.src"), "--tgt-train", str(d / "rev1.tgt"),
        "--src-valid", str(valid_src), "--tgt-valid", str(valid_tgt),
        "--max-updates", "25",
    ]  # fmt: skip
    frozen, tuned, scratch = tmp_path / "frozen", tmp_path / "tuned", tmp_path / "scratch"
    init = ["--init-from", str(out), "--config", str(recipe)]
    assert train.main([*common, *init, "--lr", "0", "--out", str(frozen)]) == 0
    before, after = load_file(out / "model.safetensors"), load_file(frozen / "model.safetensors")
    assert before.keys() == after.keys()
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert (frozen / "tokenizer.json").read_bytes() == (out / "tokenizer.json").read_bytes()
    config = json.loads((frozen / "config.json").read_text())
    assert config["model"] == json.loads((out / "config.json").read_text())["model"]
    sha = hashlib.sha256((out / "model.safetensors").read_bytes()).hexdigest()
    assert config["init_from"] == {"path": str(out), "sha256": sha}

    tune = [*common, *init, "--lr", "3e-4", "--out", str(tuned)]
    assert train.main(tune) == 0
    # Resuming such a run continues from its own saved state, not from the starting model again.
    assert train.main([*tune, "--max-updates", "50", "--resume"]) == 0
    rows = map(json.loads, (tuned / "metrics.jsonl").read_text().splitlines())
    assert [r["update"] for r in rows if r["split"] == "train"] == [25, 50]
    from_scratch = [*common, "--config", str(scratch_recipe), "--lr", "3e-4", "--out", str(scratch)]
    assert train.main(from_scratch) == 0
    assert json.loads((scratch / "config.json").read_text())["model"] == config["model"]
    assert _first_train_loss(tuned) < 0.5 * _first_train_loss(scratch)
    tuned_config = json.loads((tuned / "config.json").read_text())
    assert tuned_config["valid_after_averaging"]["bleu"] > 90
    assert json.loads((scratch / "config.json").read_text())["init_from"] is None


def test_init_from_needs_a_whole_model_and_no_second_architecture(trained, tmp_path, capsys):
    _, out, _, _ = trained
    src, tgt = _write_reverse_task(tmp_path, 20, seed=3)
    fresh = tmp_path / "out"
    code, err = _run_cli(_args(src, tgt, fresh, "--init-from", str(tmp_path)), capsys)
    assert code == 2 and "has no config.json" in err
    for name in ("config.json", "model.safetensors", "tokenizer.json"):
        (tmp_path / name).write_text("{}")
    code, err = _run_cli(_args(src, tgt, fresh, "--init-from", str(tmp_path)), capsys)
    assert code == 2 and "has no model section" in err
    init = ("--init-from", str(out))
    code, err = _run_cli(_args(src, tgt, fresh, *init, "--preset", "tiny"), capsys)
    assert code == 2 and "drop --preset" in err
    recipe, training_only = tmp_path / "recipe.json", tmp_path / "training.json"
    recipe.write_text(json.dumps(RECIPE))
    training_only.write_text(json.dumps({"training": RECIPE["training"]}))
    code, err = _run_cli(_args(src, tgt, fresh, *init, "--config", str(recipe)), capsys)
    assert code == 2 and "model section" in err
    # Weights that do not fit the config beside them.
    bad = tmp_path / "bad"
    shutil.copytree(out, bad, ignore=shutil.ignore_patterns("checkpoints"))
    config = json.loads((bad / "config.json").read_text())
    config["model"]["d_ff"] *= 2
    (bad / "config.json").write_text(json.dumps(config))
    bad_init = ("--init-from", str(bad), "--config", str(training_only))
    code, err = _run_cli(_args(src, tgt, fresh, *bad_init), capsys)
    assert code == 2 and "does not match its config" in err
    assert not fresh.exists()


@pytest.mark.slow
def test_post_norm_learns_to_reverse_at_its_recipes_peak(tmp_path, capsys) -> None:
    """The paper's post-norm, at the peak learning rate of its Multi30k recipe, must learn the
    task (the warmup shortened to fit a test). At the pre-norm recipe's peak of 0.005 it does
    not: 800 updates gave BLEU 0.6 and 0 % exact (0.003: 15.4; 0.002: 47.2; 0.001: 83.8 and
    52 % exact): one of the two reasons for the Multi30k runs' val BLEU 8-11 where pre-norm had
    40-42 (the other, its encoder's collapse, is in benchmarks/RESULTS.md)."""
    recipe_file = json.loads((RECIPES / "multi30k-en-de-tiny-post.json").read_text())
    assert recipe_file["model"]["norm"] == "post"
    recipe = copy.deepcopy(RECIPE)
    recipe["model"]["norm"] = "post"
    recipe["training"]["lr"] = recipe_file["training"]["lr"]
    train_src, train_tgt = _write_reverse_task(tmp_path, 4000, seed=1)
    valid_src, valid_tgt = _write_reverse_task(tmp_path, 200, seed=2)
    (tmp_path / "recipe.json").write_text(json.dumps(recipe))
    out = tmp_path / "run"
    assert train.main([
        "--src-train", str(train_src), "--tgt-train", str(train_tgt),
        "--src-valid", str(valid_src), "--tgt-valid", str(valid_tgt),
        "--out", str(out), "--config", str(tmp_path / "recipe.json"), "--max-updates", "800",
    ]) == 0  # fmt: skip
    hyp = tmp_path / "hyp.txt"
    args = ["--checkpoint", str(out), "--src", str(valid_src), "--ref", str(valid_tgt)]
    assert evaluate.main([*args, "--beam-size", "1", "--hyp-out", str(hyp)]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    refs = valid_tgt.read_text().splitlines()
    exact = sum(h == r for h, r in zip(hyp.read_text().splitlines(), refs, strict=True))
    assert result["bleu"] > 60 and exact / len(refs) >= 0.25, (result["bleu"], exact)


def test_learning_rate_schedule_peaks_at_warmup() -> None:
    config = TrainConfig(lr=0.005, warmup_updates=2000)
    assert learning_rate(1000, config) == pytest.approx(0.0025)
    assert learning_rate(2000, config) == pytest.approx(0.005)
    assert learning_rate(8000, config) == pytest.approx(0.0025)  # lr * sqrt(2000 / 8000)


def _rdrop_trainer(tmp_path, dropout: float, alpha: float) -> tuple[Trainer, Batch]:
    torch.manual_seed(0)
    config = ModelConfig(
        vocab_size=40, d_model=32, d_ff=64, h=4, n_encoder_layers=2, n_decoder_layers=2,
        dropout=dropout, norm="pre",
    )  # fmt: skip
    rng = random.Random(0)

    def sentence() -> list[int]:
        return [rng.randrange(4, 40) for _ in range(rng.randint(2, 9))] + [EOS_ID]

    examples = [Example(sentence(), sentence()) for _ in range(6)]
    recipe = TrainConfig(rdrop_alpha=alpha, label_smoothing=0.1)
    model = Transformer(config).train()
    trainer = Trainer(
        model, None, recipe, tmp_path, torch.device("cpu"), examples, [], [], [], "de"
    )
    return trainer, Batch.from_examples(examples)


def test_rdrop_loss_is_both_passes_cross_entropy_plus_alpha_times_their_kl(tmp_path) -> None:
    """R-Drop's objective, against torch's own kl_div and cross_entropy on the same two passes:
    L_NLL^1 + L_NLL^2 + alpha * (KL(p1 || p2) + KL(p2 || p1)) / 2 over 2N target tokens."""
    trainer, batch = _rdrop_trainer(tmp_path, dropout=0.3, alpha=5.0)
    torch.manual_seed(7)
    loss, n_tokens = trainer.training_loss(batch)
    assert n_tokens == 2 * batch.n_tgt_tokens
    torch.manual_seed(7)  # the same dropout masks
    logits = trainer.model(torch.cat([batch.src, batch.src]), torch.cat([batch.tgt_in] * 2))
    first, second = torch.log_softmax(logits, dim=-1).chunk(2)
    mask = batch.tgt_out != 0
    ce = sum(
        torch.nn.functional.cross_entropy(
            lp.flatten(0, 1), batch.tgt_out.flatten(), ignore_index=0, label_smoothing=0.1,
            reduction="sum",
        )
        for lp in (first, second)
    )  # fmt: skip
    kl_12 = torch.nn.functional.kl_div(second, first, log_target=True, reduction="none")
    kl_21 = torch.nn.functional.kl_div(first, second, log_target=True, reduction="none")
    kl = (kl_12.sum(-1)[mask].sum() + kl_21.sum(-1)[mask].sum()) / 2
    assert kl > 0.01  # dropout made the two passes differ
    assert loss.item() == pytest.approx((ce + 5.0 * kl).item(), rel=1e-5)
    loss.backward()  # and it trains: the KL term reaches the weights
    assert all(p.grad is not None for p in trainer.model.parameters() if p.requires_grad)


def test_rdrop_without_dropout_is_the_plain_cross_entropy(tmp_path) -> None:
    trainer, batch = _rdrop_trainer(tmp_path, dropout=0.0, alpha=5.0)
    rdrop, n_rdrop = trainer.training_loss(batch)
    plain, n_plain = trainer.loss(batch, label_smoothing=0.1)
    assert n_rdrop == 2 * n_plain
    assert rdrop.item() / n_rdrop == pytest.approx(plain.item() / n_plain, rel=1e-5)


def test_negative_rdrop_alpha_is_an_error(tmp_path, capsys) -> None:
    src, tgt = _write_reverse_task(tmp_path, 20, seed=3)
    code, err = _run_cli(_args(src, tgt, tmp_path / "out", "--rdrop-alpha", "-1"), capsys)
    assert code == 2 and "rdrop_alpha must be >= 0" in err
    assert not (tmp_path / "out").exists()


@pytest.fixture
def tiny_files(tmp_path):
    src, tgt = _write_reverse_task(tmp_path, 20, seed=3)
    return tmp_path, src, tgt


def _run_cli(args, capsys) -> tuple[int, str]:
    code = train.main(args)
    return code, capsys.readouterr().err


def _args(src, tgt, out, *extra):
    return ["--src-train", str(src), "--tgt-train", str(tgt), "--src-valid", str(src),
            "--tgt-valid", str(tgt), "--out", str(out), "--max-updates", "1", *extra]  # fmt: skip


def test_missing_file_is_a_clear_error_and_writes_nothing(tiny_files, capsys) -> None:
    d, _src, tgt = tiny_files
    code, err = _run_cli(_args(d / "missing.en", tgt, d / "out"), capsys)
    assert code == 2 and "no such file" in err and "missing.en" in err
    assert not (d / "out").exists()


def test_mismatched_lines_name_both_files(tiny_files, capsys) -> None:
    d, src, _tgt = tiny_files
    short = d / "short.tgt"
    short.write_text("a b\n")
    code, err = _run_cli(_args(src, short, d / "out"), capsys)
    assert code == 2 and "rev3.src has 20 lines" in err and "short.tgt has 1" in err
    assert not (d / "out").exists()


def test_empty_corpus_is_an_error(tiny_files, capsys) -> None:
    d, _, _ = tiny_files
    (d / "e.src").write_text("")
    (d / "e.tgt").write_text("")
    code, err = _run_cli(_args(d / "e.src", d / "e.tgt", d / "out"), capsys)
    assert code == 2 and "empty corpus" in err
    assert not (d / "out").exists()


def test_unknown_preset_and_existing_output_are_errors(tiny_files, capsys) -> None:
    d, src, tgt = tiny_files
    code, err = _run_cli(_args(src, tgt, d / "out", "--preset", "huge"), capsys)
    assert code == 2 and "unknown preset 'huge'" in err
    assert not (d / "out").exists()
    (d / "out").mkdir()
    (d / "out" / "keep.txt").write_text("x")
    code, err = _run_cli(_args(src, tgt, d / "out"), capsys)
    assert code == 2 and "not empty" in err
    assert [p.name for p in (d / "out").iterdir()] == ["keep.txt"]
    code, err = _run_cli(_args(src, tgt, d / "fresh", "--resume"), capsys)
    assert code == 2 and "no training state" in err


def test_evaluate_rejects_a_missing_checkpoint(tmp_path, capsys) -> None:
    code = evaluate.main(["--checkpoint", str(tmp_path), "--src", "x", "--ref", "y"])
    assert code == 2 and "config.json" in capsys.readouterr().err


# --- Guided alignment -------------------------------------------------------------------------


def _aligned_trainer(tmp_path, weight: float) -> tuple[Trainer, Batch]:
    torch.manual_seed(0)
    config = ModelConfig(
        vocab_size=40, d_model=32, d_ff=64, h=4, n_encoder_layers=2, n_decoder_layers=2,
        dropout=0.0, norm="pre", alignment_layer=1, alignment_head=2,
    )  # fmt: skip
    examples = [
        Example([5, 6, 7, EOS_ID], [8, 9, EOS_ID], ((0, 2), (1, 0), (1, 1))),
        Example([10, 11, EOS_ID], [12, 13, 14, EOS_ID], ((2, 0),)),
    ]
    recipe = TrainConfig(alignment_weight=weight, label_smoothing=0.1)
    model = Transformer(config).train()
    trainer = Trainer(
        model, None, recipe, tmp_path, torch.device("cpu"), examples, [], [], [], "de"
    )
    return trainer, Batch.from_examples(examples)


def test_guided_alignment_adds_the_heads_cross_entropy_against_the_links(tmp_path) -> None:
    """Garg et al. (2019): the label-smoothed cross-entropy plus weight x sum over linked target
    tokens of -sum_s G[t, s] log A[t, s], A the alignment head's weights, G the links spread
    evenly over a target token's source tokens."""
    trainer, batch = _aligned_trainer(tmp_path, weight=0.5)
    assert batch.alignment is not None
    expected_links = torch.zeros(2, 4, 4)
    expected_links[0, 0, 2] = 1.0
    expected_links[0, 1, 0] = expected_links[0, 1, 1] = 0.5
    expected_links[1, 2, 0] = 1.0
    assert torch.equal(batch.alignment, expected_links)
    loss, n_tokens = trainer.training_loss(batch)
    plain, _ = trainer.loss(batch, label_smoothing=0.1)
    src_mask = trainer.model.source_mask(batch.src)
    memory = trainer.model.encode(batch.src, src_mask)
    _, weights = trainer.model.decode_aligned(batch.tgt_in, memory, src_mask)  # (B, T, S)
    # The head (layer 1, head 2) as the attention computes it, by hand.
    layer = trainer.model.decoder_layers[1]
    assert weights.shape == (2, 4, 4)
    expected = -(expected_links * weights.clamp(min=1e-9).log()).sum()
    assert loss.item() == pytest.approx(plain.item() + 0.5 * expected.item(), rel=1e-5)
    assert n_tokens == batch.n_tgt_tokens
    loss.backward()
    assert layer.cross_attn.w_q.weight.grad is not None


def test_guided_alignment_teaches_the_head_the_links(tmp_path) -> None:
    """A few dozen updates on one batch bring the head's weight on the linked tokens up."""
    trainer, batch = _aligned_trainer(tmp_path, weight=1.0)
    optimizer = torch.optim.Adam(trainer.model.parameters(), lr=0.01)

    def on_links() -> float:
        with torch.no_grad():
            _, weights = trainer.model.forward_aligned(batch.src, batch.tgt_in)
        return float((weights * (batch.alignment > 0)).sum())

    before = on_links()
    for _ in range(40):
        loss, n_tokens = trainer.training_loss(batch)
        optimizer.zero_grad()
        (loss / n_tokens).backward()
        optimizer.step()
    assert on_links() > 2.9 > before  # 3 linked rows: nearly all their weight on the links


def test_alignments_train_through_the_cli_and_are_recorded(tmp_path, capsys) -> None:
    src, tgt = _write_reverse_task(tmp_path, 20, seed=3)
    lines = []
    for line in src.read_text().splitlines():
        n = len(line.split())
        lines.append(" ".join(f"{i}-{n - 1 - i}" for i in range(n)))  # the reversal's links
    links = tmp_path / "links.txt"
    links.write_text("\n".join(lines) + "\n")
    out = tmp_path / "out"
    code, err = _run_cli(
        _args(src, tgt, out, "--alignments", str(links), "--alignment-weight", "0.5",
              "--alignment-layer", "0", "--alignment-head", "1", "--preset", "tiny"),
        capsys,
    )  # fmt: skip
    assert code == 0, err
    config = json.loads((out / "config.json").read_text())
    assert config["training"]["alignment_weight"] == 0.5
    assert (config["model"]["alignment_layer"], config["model"]["alignment_head"]) == (0, 1)
    assert config["data"]["alignments"]["lines"] == 20


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--alignment-weight", "0.5"], "--alignments goes with guided alignment"),
        (["--train-aligner"], "give --init-from"),
        (["--train-aligner", "--alignment-weight", "1"], "trains the aligner alone"),
        (["--train-aligner", "--alignment-head", "1"], "no alignment_head with it"),
        (["--alignment-weight", "-1"], "alignment_weight must be >= 0"),
        (["--alignment-weight", "1", "--rdrop-alpha", "1"], "not combined"),
        (["--alignment-layer", "9"], "is not a decoder layer"),
    ],
)
def test_bad_guided_alignment_settings_are_clear_errors(
    tmp_path, capsys, extra: list[str], message: str
) -> None:
    src, tgt = _write_reverse_task(tmp_path, 20, seed=3)
    code, err = _run_cli(_args(src, tgt, tmp_path / "out", *extra), capsys)
    assert code == 2 and message in err
    assert not (tmp_path / "out").exists()


# --- The aligner ------------------------------------------------------------------------------


def _aligner_trainer(tmp_path, hidden: int = 0) -> tuple[Trainer, Batch]:
    torch.manual_seed(0)
    config = ModelConfig(
        vocab_size=40, d_model=32, d_ff=64, h=4, n_encoder_layers=2, n_decoder_layers=2,
        dropout=0.3, norm="pre", alignment_layer=1, aligner=True, aligner_hidden=hidden,
    )  # fmt: skip
    examples = [
        Example([5, 6, 7, EOS_ID], [8, 9, EOS_ID], ((0, 2), (1, 0), (1, 1))),
        Example([10, 11, EOS_ID], [12, 13, 14, EOS_ID], ((2, 0),)),
    ]
    model = Transformer(config)
    model.init_aligner()
    trainer = Trainer(
        model, None, TrainConfig(train_aligner=True), tmp_path, torch.device("cpu"), examples,
        [], [], [], "de",
    )  # fmt: skip
    return trainer, Batch.from_examples(examples)


@pytest.mark.parametrize("hidden", [0, 8])
def test_the_aligner_attends_with_its_own_query_over_all_heads_keys(tmp_path, hidden) -> None:
    """Its weights: softmax(aligner(q) . k / sqrt(d_model)), q the aligned layer's
    cross-attention input, k its keys with the heads side by side, padding masked; it starts
    as the layer's own query projection (a hidden layer adds nothing yet), and feeds nothing
    (the logits do not depend on it)."""
    trainer, batch = _aligner_trainer(tmp_path, hidden)
    model = trainer.model.eval()
    layer = model.decoder_layers[1]
    assert model.aligner is not None
    assert torch.equal(model.aligner.w_q.weight, layer.cross_attn.w_q.weight)
    x = torch.randn(3, 32)
    assert torch.equal(model.aligner(x), layer.cross_attn.w_q(x))
    src_mask = model.source_mask(batch.src)
    memory = model.encode(batch.src, src_mask)
    queries = []
    original = layer.cross_attn.attend

    def spy(x, k, v, mask):  # the layer's cross-attention input
        queries.append(x)
        return original(x, k, v, mask)

    layer.cross_attn.attend = spy
    logits, weights = model.decode_aligned(batch.tgt_in, memory, src_mask)
    del layer.cross_attn.attend
    keys = layer.cross_attn.w_k(memory)  # (B, S, d_model): the heads side by side
    scores = model.aligner(queries[0]) @ keys.transpose(1, 2) / 32**0.5
    expected = scores.masked_fill(~src_mask[:, 0], -1e9).softmax(-1)
    assert torch.allclose(weights, expected, atol=1e-6)
    assert weights[1, :, 3].abs().max() < 1e-6  # the second source's padding
    assert torch.equal(model.align(batch.tgt_in, memory, src_mask), weights)
    with torch.no_grad():
        changed = model.aligner.w_q if model.aligner.w_2 is None else model.aligner.w_2
        changed.weight.add_(torch.randn_like(changed.weight))
    again, moved = model.decode_aligned(batch.tgt_in, memory, src_mask)
    assert torch.equal(again, logits) and not torch.allclose(moved, weights)


@pytest.mark.parametrize("hidden", [0, 8])
def test_the_aligner_learns_the_read_tokens_links_alone(tmp_path, hidden) -> None:
    """Its loss scores row t against the links of tgt_out[t - 1] (the token row t reads); a few
    dozen updates bring its weight onto them, and no other weight gets a gradient."""
    trainer, batch = _aligner_trainer(tmp_path, hidden)
    assert batch.alignment is not None
    loss, n_tokens = trainer.training_loss(batch)
    src_mask = trainer.model.source_mask(batch.src)
    assert not trainer.model.training  # the frozen layers run without dropout
    with torch.no_grad():
        _, weights = trainer.model.forward_aligned(batch.src, batch.tgt_in)
    read = torch.zeros_like(batch.alignment)
    read[:, 1:] = batch.alignment[:, :-1]
    expected = -(read * weights.clamp(min=1e-9).log()).sum()
    assert src_mask.shape == (2, 1, 1, 4)
    assert loss.item() == pytest.approx(expected.item(), rel=1e-5)
    assert n_tokens == batch.n_tgt_tokens
    loss.backward()
    trained = {n for n, p in trainer.model.named_parameters() if p.grad is not None}
    layers = ["q", "1", "2"] if hidden else ["q"]
    assert trained == {f"aligner.w_{layer}.{p}" for layer in layers for p in ("weight", "bias")}

    def on_links() -> float:
        with torch.no_grad():
            _, weights = trainer.model.forward_aligned(batch.src, batch.tgt_in)
        return float((weights * (read > 0)).sum())

    before = on_links()
    for _ in range(60):
        loss, n_tokens = trainer.training_loss(batch)
        trainer.optimizer.zero_grad()
        (loss / n_tokens).backward()
        trainer.optimizer.step()
    assert on_links() > 2.9 > before  # 3 linked rows


@pytest.mark.parametrize("hidden", [0, 8])
def test_train_aligner_through_the_cli_changes_no_translation_weight(
    tmp_path, capsys, hidden
) -> None:
    """An --init-from model gets an aligner; a config's model section may give it a hidden
    layer (ALIGNMENT_FIELDS), and only the aligner's weights are new or changed."""
    src, tgt = _write_reverse_task(tmp_path, 20, seed=3)
    base = tmp_path / "base"
    code, err = _run_cli(_args(src, tgt, base, "--preset", "tiny"), capsys)
    assert code == 0, err
    lines = []
    for line in src.read_text().splitlines():
        n = len(line.split())
        lines.append(" ".join(f"{i}-{n - 1 - i}" for i in range(n)))
    links = tmp_path / "links.txt"
    links.write_text("\n".join(lines) + "\n")
    out = tmp_path / "out"
    recipe = tmp_path / "aligner.json"
    recipe.write_text(json.dumps({"model": {"aligner_hidden": hidden}, "training": {}}))
    code, err = _run_cli(
        [*_args(src, tgt, out, "--alignments", str(links), "--train-aligner"),
         "--init-from", str(base), "--max-updates", "3", "--lr", "0.01", "--config", str(recipe)],
        capsys,
    )  # fmt: skip
    assert code == 0, err
    config = json.loads((out / "config.json").read_text())
    assert config["model"]["aligner"] is True and config["training"]["train_aligner"] is True
    assert config["model"]["aligner_hidden"] == hidden
    before, after = load_file(base / "model.safetensors"), load_file(out / "model.safetensors")
    layers = ["q", "1", "2"] if hidden else ["q"]
    new = {f"aligner.w_{layer}.{p}" for layer in layers for p in ("weight", "bias")}
    assert set(after) - set(before) == new
    assert all(torch.equal(before[name], after[name]) for name in before)
    started_as = before["decoder_layers.2.cross_attn.w_q.weight"]  # the penultimate layer's
    assert not torch.equal(after["aligner.w_q.weight"], started_as)


def test_train_aligner_refuses_guided_alignment_on_an_aligner_model(tmp_path, capsys) -> None:
    """A model that aligns through its aligner has no head for guided alignment to train."""
    src, tgt = _write_reverse_task(tmp_path, 20, seed=3)
    base = tmp_path / "base"
    code, err = _run_cli(_args(src, tgt, base, "--preset", "tiny"), capsys)
    assert code == 0, err
    config = json.loads((base / "config.json").read_text())
    config["model"]["aligner"] = True
    (base / "config.json").write_text(json.dumps(config))
    links = tmp_path / "links.txt"
    links.write_text("0-0\n" * 20)
    code, err = _run_cli(
        [*_args(src, tgt, tmp_path / "out", "--alignments", str(links), "--alignment-weight", "1"),
         "--init-from", str(base)],
        capsys,
    )  # fmt: skip
    assert code == 2 and "--train-aligner instead" in err
    assert not (tmp_path / "out").exists()


def test_a_batch_without_links_gives_the_aligner_a_zero_loss(tmp_path) -> None:
    trainer, _ = _aligner_trainer(tmp_path)
    batch = Batch.from_examples([Example([5, 6, EOS_ID], [8, EOS_ID])])
    assert batch.alignment is None
    loss, n_tokens = trainer.training_loss(batch)
    assert loss.item() == 0.0 and n_tokens == 2
    loss.backward()  # nothing to learn, and nothing breaks
