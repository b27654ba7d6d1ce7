"""LFM2's short gated convolution (core/net/short_conv.py) against transformers'
Lfm2ShortConv (its torch path, no kernels), on one tiny random layer with biases: the output
within 1e-4, written out again in numpy here, and the cached (one position at a time) run
equal to the whole; the recorded filter is the conv's taps; breaking a piece moves the output
far past the tolerance."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from core.net.recorder import Recorder
from core.net.short_conv import ShortConvMixer, ShortConvSpec

transformers = pytest.importorskip("transformers")
from transformers.models.lfm2 import modeling_lfm2 as hf_lfm2  # noqa: E402

TOL = 1e-4
N_POS = 17
SPEC = ShortConvSpec(d_model=12, kernel=3, bias=True)


@pytest.fixture(scope="module")
def pair():
    cfg = transformers.Lfm2Config(hidden_size=SPEC.d_model, conv_L_cache=SPEC.kernel, conv_bias=SPEC.bias,
                                  num_hidden_layers=1, layer_types=["conv"], vocab_size=32,
                                  num_attention_heads=2, num_key_value_heads=1, intermediate_size=16)
    torch.manual_seed(0)
    hf = hf_lfm2.Lfm2ShortConv(cfg, layer_idx=0).eval()
    with torch.no_grad():
        for p in hf.parameters():
            p.copy_(torch.randn_like(p) * 0.5)
    ours = ShortConvMixer(SPEC).eval()
    ours.load_state_dict(hf.state_dict())
    x = torch.randn(1, N_POS, SPEC.d_model, generator=torch.Generator().manual_seed(1))
    rec = Recorder()
    with torch.no_grad():
        want, got = hf(x), ours(x, rec=rec)
    return hf, ours, x, want, got, rec.tensors


def test_output_matches_transformers(pair):
    _, _, _, want, got, t = pair
    assert want.abs().max() > 0.1
    assert (got - want).abs().max().item() < TOL
    assert torch.equal(t["out"], got[0])


def test_output_matches_numpy(pair):
    """The layer written out here in float64: B, C, x; u = B x; y_t = C_t sum_j w[K-1-j] u_{t-j}."""
    hf, _, x, _, got, _ = pair
    sd = {k: v.detach().double().numpy() for k, v in hf.state_dict().items()}
    xin = x[0].double().numpy()
    proj = xin @ sd["in_proj.weight"].T + sd["in_proj.bias"]
    d = SPEC.d_model
    b, c, v = proj[:, :d], proj[:, d:2 * d], proj[:, 2 * d:]
    u = b * v
    w = sd["conv.weight"][:, 0, :]  # (d, K)
    conv = np.tile(sd["conv.bias"], (N_POS, 1))
    for t in range(N_POS):
        for j in range(SPEC.kernel):
            if t - j >= 0:
                conv[t] += w[:, SPEC.kernel - 1 - j] * u[t - j]
    want = (c * conv) @ sd["out_proj.weight"].T + sd["out_proj.bias"]
    assert np.abs(got[0].double().numpy() - want).max() < TOL


def test_filter_and_kind(pair):
    hf, ours, _, _, _, t = pair
    assert ours.kind == "short_conv" and ours.recorded_names() == list(t)
    assert ours.state_shapes() == {"conv": (SPEC.d_model, SPEC.kernel - 1)}
    with pytest.raises(ValueError, match="no head map"):
        ours.weights(torch.zeros(1, 3, SPEC.d_model))
    assert t["filter"].shape == (SPEC.d_model, SPEC.kernel)
    assert torch.equal(t["filter"], hf.conv.weight[:, 0, :].detach())


def test_cached_steps_equal_the_whole(pair):
    _, ours, x, _, got, _ = pair
    cache, parts = {}, []
    with torch.no_grad():
        parts.append(ours(x[:, :5], cache=cache))
        for i in range(5, N_POS):
            parts.append(ours(x[:, i:i + 1], cache=cache))
    assert cache["conv"].shape == (1, SPEC.d_model, SPEC.kernel - 1)
    assert (torch.cat(parts, dim=1) - got).abs().max().item() < TOL


@pytest.mark.parametrize("broken", ["conv.weight", "in_proj.weight", "conv.bias"])
def test_each_piece_moves_the_output(pair, broken):
    _, ours, x, want, _, _ = pair
    other = ShortConvMixer(SPEC).eval()
    other.load_state_dict(ours.state_dict())
    with torch.no_grad():
        dict(other.named_parameters())[broken].mul_(0.5)
        assert (other(x) - want).abs().max().item() > 100 * TOL
