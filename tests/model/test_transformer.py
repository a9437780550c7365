import math

import pytest
import torch
from torch import nn

from model.transformer import (
    PAD_ID,
    DecoderLayer,
    EncoderLayer,
    ModelConfig,
    Transformer,
    causal_mask,
    load_model,
    padding_mask,
    preset_config,
    save_model,
    scaled_dot_product_attention,
    sinusoidal_encoding,
)

torch.set_num_threads(1)
SMALL = dict(d_model=32, d_ff=64, h=4, n_encoder_layers=2, n_decoder_layers=2, max_positions=40)


def make_model(norm: str = "post", seed: int = 0, vocab: int = 50) -> Transformer:
    torch.manual_seed(seed)
    return Transformer(ModelConfig(vocab_size=vocab, norm=norm, **SMALL)).eval()  # type: ignore[arg-type]


def test_positional_encoding_matches_paper_formula() -> None:
    pe = sinusoidal_encoding(10, 4)
    # PE(pos, 2i) = sin(pos / 10000^(2i/d)), PE(pos, 2i+1) = cos(pos / 10000^(2i/d)), d = 4.
    assert pe[0].tolist() == [0.0, 1.0, 0.0, 1.0]
    assert pe[1, 0] == pytest.approx(math.sin(1.0))
    assert pe[1, 1] == pytest.approx(math.cos(1.0))
    assert pe[3, 2] == pytest.approx(math.sin(3 / 100))  # 10000^(2/4) = 100
    assert pe[3, 3] == pytest.approx(math.cos(3 / 100))
    assert pe[7, 2] == pytest.approx(0.0699428473, abs=1e-7)


def test_attention_gives_padded_keys_zero_weight() -> None:
    torch.manual_seed(0)
    q, k, v = torch.randn(3, 2, 2, 5, 8).unbind(0)
    ids = torch.tensor([[5, 6, 7, PAD_ID, PAD_ID], [5, 6, 7, 8, 9]])
    _, weights = scaled_dot_product_attention(q, k, v, padding_mask(ids))
    assert torch.all(weights[0, :, :, 3:] == 0)
    assert torch.all(weights[0, :, :, :3] > 0)
    assert torch.allclose(weights.sum(-1), torch.ones(2, 2, 5))


def test_causal_mask_blocks_the_future() -> None:
    torch.manual_seed(0)
    q, k, v = torch.randn(3, 1, 1, 6, 4).unbind(0)
    _, weights = scaled_dot_product_attention(q, k, v, causal_mask(6))
    for t in range(6):
        assert torch.all(weights[0, 0, t, t + 1 :] == 0)
        assert torch.all(weights[0, 0, t, : t + 1] > 0)


@pytest.mark.parametrize("norm", ["post", "pre"])
def test_extra_padding_does_not_change_the_encoding(norm: str) -> None:
    model = make_model(norm)
    src = torch.tensor([[5, 9, 11, 2]])
    padded = torch.tensor([[5, 9, 11, 2, PAD_ID, PAD_ID, PAD_ID]])
    a = model.encode(src, padding_mask(src))
    b = model.encode(padded, padding_mask(padded))
    assert torch.allclose(a, b[:, :4], atol=1e-6)


@pytest.mark.parametrize("norm", ["post", "pre"])
def test_decoder_position_t_never_sees_t_plus_1(norm: str) -> None:
    model = make_model(norm)
    src = torch.tensor([[5, 9, 11, 2]])
    tgt = torch.tensor([[1, 7, 8, 9, 10]])
    changed = tgt.clone()
    changed[0, 3:] = torch.tensor([20, 21])
    a, b = model(src, tgt), model(src, changed)
    assert torch.allclose(a[:, :3], b[:, :3], atol=1e-6)
    assert not torch.allclose(a[:, 3:], b[:, 3:], atol=1e-3)


@pytest.mark.parametrize("norm", ["post", "pre"])
def test_cached_steps_equal_full_decode(norm: str) -> None:
    """decode_step token by token == decode() on the whole prefix, with padded sources."""
    model = make_model(norm, seed=1)
    src = torch.tensor([[5, 9, 11, 12, 13, 2], [6, 7, 2, PAD_ID, PAD_ID, PAD_ID]])
    tgt = torch.tensor([[1, 14, 15, 16, 17, 18, 19], [1, 20, 21, 22, 23, 24, 25]])
    src_mask = padding_mask(src)
    with torch.no_grad():
        memory = model.encode(src, src_mask)
        full = model.decode(tgt, memory, src_mask).log_softmax(-1)  # (B, T, V)
        cache = model.init_cache(memory)
        assert cache.length == 0
        for t in range(tgt.size(1)):
            step, cache = model.decode_step(tgt[:, t], cache, src_mask)
            assert cache.length == t + 1
            assert (step - full[:, t]).abs().max().item() < 1e-5


@pytest.mark.parametrize("norm", ["post", "pre"])
def test_beams_share_their_sentence_s_cross_keys_and_values(norm: str) -> None:
    """decode_step with 3 rows per sentence over one cross key/value row per sentence equals
    the same rows over 3 copies each (ordinary attention), before and after `select` drops a
    sentence and repeats a row."""
    model = make_model(norm, seed=2)
    src = torch.tensor([[5, 9, 11, 12, 2], [6, 7, 2, PAD_ID, PAD_ID]])  # (N=2, S)
    tgt = torch.randint(4, 50, (6, 5), generator=torch.Generator().manual_seed(0))  # (N*3, T)
    mask = padding_mask(src)  # (N, 1, 1, S)
    with torch.no_grad():
        memory = model.encode(src, mask)
        # One row per sentence for the first step, then 3 (beam search's expansion).
        first = torch.tensor([1, 1])
        a, shared = model.decode_step(first, model.init_cache(memory), mask)
        expand = torch.tensor([0, 0, 0, 1, 1, 1])
        shared = shared.select(expand, torch.tensor([0, 1]))
        copies_mask = mask.repeat_interleave(3, dim=0)
        b, copies = model.decode_step(
            first[expand], model.init_cache(memory.repeat_interleave(3, dim=0)), copies_mask
        )
        assert (a[expand] - b).abs().max().item() < 1e-5
        for t in range(tgt.size(1) - 1):
            a, shared = model.decode_step(tgt[:, t], shared, mask)
            b, copies = model.decode_step(tgt[:, t], copies, copies_mask)
            assert (a - b).abs().max().item() < 1e-5
        assert shared.cross_k[0].size(0) == 2 and copies.cross_k[0].size(0) == 6
        # Sentence 0 finishes; sentence 1 keeps its rows 5, 3, 3 (rows 3..5 are its beams).
        rows = torch.tensor([5, 3, 3])
        shared = shared.select(rows, torch.tensor([1]))
        copies = copies.select(rows, rows)
        a, _ = model.decode_step(tgt[rows, -1], shared, mask[1:])
        b, _ = model.decode_step(tgt[rows, -1], copies, copies_mask[rows])
    assert shared.cross_k[0].size(0) == 1
    assert (a - b).abs().max().item() < 1e-5
    # Each row really continues its own cache: rows 1 and 2 agree, row 0 does not.
    assert torch.equal(a[1], a[2]) and not torch.allclose(a[0], a[1])


def _copy_attention(ref: nn.MultiheadAttention, ours: torch.nn.Module) -> None:
    ref.in_proj_weight.copy_(torch.cat([ours.w_q.weight, ours.w_k.weight, ours.w_v.weight]))
    ref.in_proj_bias.copy_(torch.cat([ours.w_q.bias, ours.w_k.bias, ours.w_v.bias]))
    ref.out_proj.load_state_dict(ours.w_o.state_dict())


def _copy_rest(ref: nn.Module, ours: torch.nn.Module) -> None:
    """Feed-forward weights and (randomised, to be seen) LayerNorm parameters."""
    ref.linear1.load_state_dict(ours.feed_forward.w_1.state_dict())
    ref.linear2.load_state_dict(ours.feed_forward.w_2.state_dict())
    for i, residual in enumerate(ours.sublayer):
        residual.norm.weight.normal_(1.0, 0.1)
        residual.norm.bias.normal_(0.0, 0.1)
        getattr(ref, f"norm{i + 1}").load_state_dict(residual.norm.state_dict())


@pytest.mark.parametrize("norm", ["post", "pre"])
def test_layers_equal_torch_reference_layers(norm: str) -> None:
    """Post-norm is LayerNorm(x + Sublayer(x)) as in the paper, pre-norm x + Sublayer(LayerNorm(x)):
    outputs and input gradients equal torch.nn's layers (norm_first) on the same weights."""
    torch.manual_seed(0)
    config = ModelConfig(vocab_size=100, d_model=32, d_ff=64, h=4, dropout=0.0, norm=norm)  # type: ignore[arg-type]
    enc, dec = EncoderLayer(config), DecoderLayer(config)
    options = dict(dropout=0.0, batch_first=True, norm_first=norm == "pre")
    ref_enc = nn.TransformerEncoderLayer(32, 4, 64, **options)  # type: ignore[arg-type]
    ref_dec = nn.TransformerDecoderLayer(32, 4, 64, **options)  # type: ignore[arg-type]
    with torch.no_grad():
        _copy_attention(ref_enc.self_attn, enc.self_attn)
        _copy_rest(ref_enc, enc)
        _copy_attention(ref_dec.self_attn, dec.self_attn)
        _copy_attention(ref_dec.multihead_attn, dec.cross_attn)
        _copy_rest(ref_dec, dec)
    src = torch.randint(4, 100, (3, 7))
    src[1, 5:] = PAD_ID
    xs = torch.randn(3, 7, 32, requires_grad=True)  # (B, S, d_model)
    xt = torch.randn(3, 6, 32, requires_grad=True)  # (B, T, d_model)
    memory = enc(xs, padding_mask(src))
    cross_k, cross_v = dec.cross_attn.project_kv(memory)
    out, _, _ = dec(xt, causal_mask(6), cross_k, cross_v, padding_mask(src))
    ref_memory = ref_enc(xs, src_key_padding_mask=src == PAD_ID)
    ref_out = ref_dec(
        xt,
        ref_memory,
        tgt_mask=nn.Transformer.generate_square_subsequent_mask(6, dtype=torch.bool),
        memory_key_padding_mask=src == PAD_ID,
        tgt_is_causal=True,
    )
    kept = (src != PAD_ID)[..., None]  # torch.nn leaves padded positions' outputs unspecified
    assert torch.allclose(memory * kept, ref_memory * kept, atol=1e-5)
    assert torch.allclose(out, ref_out, atol=1e-5)
    probe = torch.randn_like(out)
    ours = torch.autograd.grad((out * probe).sum(), [xs, xt])
    theirs = torch.autograd.grad((ref_out * probe).sum(), [xs, xt])
    for a, b in zip(ours, theirs, strict=True):
        assert torch.allclose(a, b, atol=1e-5)
    # Post-norm's stacks end in their last sub-layer's LayerNorm: no extra final norm.
    model = make_model(norm)
    final = (model.encoder_norm, model.decoder_norm)
    assert all(isinstance(m, nn.LayerNorm if norm == "pre" else nn.Identity) for m in final)


def test_output_projection_is_tied_to_the_embedding() -> None:
    model = make_model()
    names = [n for n, _ in model.named_parameters()]
    assert sum("embedding" in n for n in names) == 1
    x = torch.randn(3, 32)
    assert torch.allclose(model.output_logits(x), x @ model.embedding.weight.t())


def test_presets_and_config_validation() -> None:
    tiny = preset_config("tiny", vocab_size=8000)
    assert (tiny.d_model, tiny.d_ff, tiny.h, tiny.n_encoder_layers, tiny.dropout) == (
        128,
        256,
        4,
        4,
        0.3,
    )
    base = preset_config("base", vocab_size=8000)
    assert (base.d_model, base.d_ff, base.h, base.n_decoder_layers) == (512, 2048, 8, 6)
    with pytest.raises(ValueError, match="unknown preset 'huge'"):
        preset_config("huge", vocab_size=100)
    with pytest.raises(ValueError, match="divisible"):
        ModelConfig(vocab_size=100, d_model=30, h=4)
    with pytest.raises(ValueError, match="norm"):
        ModelConfig(vocab_size=100, norm="sandwich")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="unknown model config fields"):
        ModelConfig.from_dict({"vocab_size": 100, "d_modle": 64})
    with pytest.raises(Exception, match=r"frozen|cannot assign"):
        tiny.d_model = 64  # type: ignore[misc]


def test_too_many_positions_is_an_error() -> None:
    model = make_model()
    src = torch.full((1, 41), 5)
    with pytest.raises(ValueError, match="max_positions 40"):
        model.encode(src, padding_mask(src))


def test_save_then_load_gives_identical_outputs(tmp_path) -> None:
    model = make_model("pre", seed=3)
    save_model(model, tmp_path, {"source_language": "en"})
    loaded = load_model(tmp_path)
    assert loaded.config == model.config
    src = torch.tensor([[5, 9, 11, 2], [6, 2, PAD_ID, PAD_ID]])
    tgt = torch.tensor([[1, 7, 8], [1, 9, PAD_ID]])
    assert torch.equal(model(src, tgt), loaded(src, tgt))
    assert not list(tmp_path.glob("*.tmp"))


def test_load_model_names_the_missing_file(tmp_path) -> None:
    with pytest.raises(FileNotFoundError, match=r"config\.json"):
        load_model(tmp_path)
