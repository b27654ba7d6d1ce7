"""Parity: our core against PyTorch's own implementations of the same maths, in float64.

torch.nn.Transformer (post-norm, ReLU, the notes' block), torch.nn.MultiheadAttention and
F.scaled_dot_product_attention are independent implementations; our weights are copied
into them and every output is compared.
"""

import math

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from core import ModelConfig, Recorder, Transformer, causal_mask, padding_mask, scaled_dot_product_attention
from core.net.multihead import MultiHeadAttention

TOL = 1e-5


def _copy_mha(ours: MultiHeadAttention, ref: nn.MultiheadAttention):
    with torch.no_grad():
        ref.in_proj_weight.copy_(torch.cat([ours.w_q.weight, ours.w_k.weight, ours.w_v.weight]))
        ref.in_proj_bias.copy_(torch.cat([ours.w_q.bias, ours.w_k.bias, ours.w_v.bias]))
        ref.out_proj.weight.copy_(ours.w_o.weight)
        ref.out_proj.bias.copy_(ours.w_o.bias)


def _copy_layer(ours, ref, cross: bool):
    _copy_mha(ours.self_attn, ref.self_attn)
    if cross:
        _copy_mha(ours.cross_attn, ref.multihead_attn)
    with torch.no_grad():
        ref.linear1.weight.copy_(ours.ffn.w_1.weight)
        ref.linear1.bias.copy_(ours.ffn.w_1.bias)
        ref.linear2.weight.copy_(ours.ffn.w_2.weight)
        ref.linear2.bias.copy_(ours.ffn.w_2.bias)
        refs = [ref.norm1, ref.norm2] + ([ref.norm3] if cross else [])
        for r, o in zip(refs, ours.norms):
            r.weight.copy_(o.weight)
            r.bias.copy_(o.bias)


def _random_pair(seed=0, d=32, h=4, m=64, n_enc=2, n_dec=2):
    cfg = ModelConfig(d_model=d, n_heads=h, d_ff=m, n_layers=n_enc, n_decoder_layers=n_dec,
                      src_vocab_size=50, tgt_vocab_size=40, max_len=64)
    torch.manual_seed(seed)
    ours = Transformer(cfg).double().eval()
    # Give LayerNorms non-trivial parameters so their copy is tested too.
    with torch.no_grad():
        for mod in ours.modules():
            if isinstance(mod, nn.LayerNorm):
                mod.weight.uniform_(0.5, 1.5)
                mod.bias.uniform_(-0.2, 0.2)
    ref = nn.Transformer(d_model=d, nhead=h, num_encoder_layers=n_enc, num_decoder_layers=n_dec,
                         dim_feedforward=m, dropout=0.0, activation="relu", batch_first=True,
                         norm_first=False).double().eval()
    ref.encoder.norm = None  # the notes' stack has no extra LayerNorm after the last layer
    ref.decoder.norm = None
    for o, r in zip(ours.encoder, ref.encoder.layers):
        _copy_layer(o, r, cross=False)
    for o, r in zip(ours.decoder, ref.decoder.layers):
        _copy_layer(o, r, cross=True)
    return cfg, ours, ref


@pytest.mark.parametrize("seed", [0, 1])
def test_encoder_decoder_matches_nn_transformer(seed):
    cfg, ours, ref = _random_pair(seed)
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(4, cfg.src_vocab_size, (3, 7), generator=g)
    tgt = torch.randint(4, cfg.tgt_vocab_size, (3, 5), generator=g)
    rec = Recorder()
    with torch.no_grad():
        logits = ours(src, tgt)
        ours(src[:1], tgt[:1], rec=rec)
        x_src = ours.src_embed(src)
        x_tgt = ours.tgt_embed(tgt)
        mask = nn.Transformer.generate_square_subsequent_mask(5, dtype=torch.float64)
        ref_out = ref(x_src, x_tgt, tgt_mask=mask)
        ref_mem = ref.encoder(x_src)
        ref_logits = ours.out_proj(ref_out)
    assert (ours.encode(src) - ref_mem).abs().max().item() < TOL
    assert (logits - ref_logits).abs().max().item() < TOL
    # the traced (explicit) path gives the same numbers as the fused one
    assert (rec.tensors["decoder.1.out"] - ref_out[0]).abs().max().item() < TOL
    assert (rec.tensors["encoder.1.out"] - ref_mem[0]).abs().max().item() < TOL
    assert (rec.tensors["logits"] - ref_logits[0]).abs().max().item() < TOL


def test_padding_matches_nn_transformer_and_unpadded_runs():
    cfg, ours, ref = _random_pair(3)
    lengths = [7, 4, 2]
    src = torch.zeros(3, 7, dtype=torch.long)
    g = torch.Generator().manual_seed(0)
    for b, n in enumerate(lengths):
        src[b, :n] = torch.randint(4, cfg.src_vocab_size, (n,), generator=g)
    src_pad = src == 0
    tgt = torch.randint(4, cfg.tgt_vocab_size, (3, 5), generator=g)
    with torch.no_grad():
        logits = ours(src, tgt, src_pad=src_pad)
        x_src, x_tgt = ours.src_embed(src), ours.tgt_embed(tgt)
        mask = nn.Transformer.generate_square_subsequent_mask(5, dtype=torch.float64)
        ref_out = ref(x_src, x_tgt, tgt_mask=mask, src_key_padding_mask=src_pad, memory_key_padding_mask=src_pad)
        assert (logits - ours.out_proj(ref_out)).abs().max().item() < TOL
        for b, n in enumerate(lengths):  # each padded row equals the sentence run alone
            alone = ours(src[b : b + 1, :n], tgt[b : b + 1])
            assert (alone[0] - logits[b]).abs().max().item() < TOL


@pytest.mark.parametrize("masked", ["none", "causal", "padding", "both"])
def test_multihead_attention_matches_nn_multiheadattention(masked):
    cfg = ModelConfig(d_model=24, n_heads=3, d_ff=8, kind="encoder", src_vocab_size=5)
    torch.manual_seed(5)
    ours = MultiHeadAttention(cfg).double()
    ref = nn.MultiheadAttention(24, 3, batch_first=True).double()
    _copy_mha(ours, ref)
    x = torch.randn(2, 6, 24, dtype=torch.float64)
    pad = torch.tensor([[False] * 6, [False] * 4 + [True] * 2])
    causal = causal_mask(6, dtype=torch.float64)
    pad_add = padding_mask(pad, 6, torch.float64)  # (2, 6, 6)
    mask = {"none": None, "causal": causal, "padding": pad_add, "both": causal + pad_add}[masked]
    ours_mask = None if mask is None else (mask if mask.dim() == 2 else mask[:, None])
    ref_mask = None if mask is None else (mask if mask.dim() == 2 else mask.repeat_interleave(3, dim=0))
    rec = Recorder()
    with torch.no_grad():
        fused = ours(x, x, ours_mask)
        traced = ours(x, x, ours_mask, rec=rec)
        ref_out, ref_w = ref(x, x, x, attn_mask=ref_mask, need_weights=True, average_attn_weights=False)
    assert (fused - ref_out).abs().max().item() < TOL
    assert (traced - ref_out).abs().max().item() < TOL
    assert (rec.tensors["weights"] - ref_w[0]).abs().max().item() < TOL


@pytest.mark.parametrize("with_mask", [False, True])
def test_attention_function_matches_sdpa(with_mask):
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 4, 5, 8, dtype=torch.float64) for _ in range(3))
    mask = causal_mask(5, dtype=torch.float64) if with_mask else None
    rec = Recorder()
    ours = scaled_dot_product_attention(q, k, v, mask, record=lambda n, t: rec(n, t))
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    assert (ours - ref).abs().max().item() < TOL
    # and the recorded steps are the formula, written out independently
    scores = torch.einsum("bhqd,bhkd->bhqk", q, k)
    assert torch.allclose(rec.tensors["scores"], scores[0])
    assert torch.allclose(rec.tensors["scaled"], scores[0] / math.sqrt(8))
    if with_mask:
        assert torch.isneginf(rec.tensors["masked"][:, 0, 1:]).all()
