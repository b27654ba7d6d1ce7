"""The Mamba2 mixer (core/net/mamba2.py) against transformers' Mamba2Mixer (its torch path,
no kernels), on one tiny random layer: 4 heads in 2 groups, chunks of 8 over 29 positions
(three full chunks and a padded one), every parameter drawn at random so each one matters.

- the mixer's output, and `heads` (what transformers hands its gated norm, read by a hook),
  within 1e-4;
- the implicit attention A: nothing above the diagonal; A @ v + skip == heads within 1e-4 of
  heads' largest entry; and A equals a numpy loop over the recurrence written here;
- the chunked and the recurrent forms agree (and each step of a cached run continues the
  state the cache kept);
- breaking one piece moves the output far past the tolerance, so the parity could see it.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from core.net.mamba2 import Mamba2Mixer, Mamba2Spec, segsum
from core.net.recorder import Recorder

transformers = pytest.importorskip("transformers")
from transformers.models.mamba2 import modeling_mamba2 as hf_mamba2  # noqa: E402

TOL = 1e-4
N_POS = 29
SPEC = Mamba2Spec(d_model=16, n_heads=4, head_dim=8, d_state=6, n_groups=2, conv_kernel=4, chunk_size=8, eps=1e-5)


def _hf_layer() -> torch.nn.Module:
    cfg = transformers.Mamba2Config(
        hidden_size=SPEC.d_model, num_heads=SPEC.n_heads, head_dim=SPEC.head_dim, expand=2,
        state_size=SPEC.d_state, n_groups=SPEC.n_groups, conv_kernel=SPEC.conv_kernel,
        chunk_size=SPEC.chunk_size, layer_norm_epsilon=SPEC.eps, num_hidden_layers=1, vocab_size=32)
    torch.manual_seed(0)
    layer = hf_mamba2.Mamba2Mixer(cfg, layer_idx=0).eval()
    with torch.no_grad():  # every parameter away from its initial value
        for p in layer.parameters():
            p.copy_(torch.randn_like(p) * 0.3)
        layer.A_log.copy_(torch.linspace(-1.0, 0.7, SPEC.n_heads))
        layer.dt_bias.copy_(torch.linspace(-1.5, 0.5, SPEC.n_heads))
        layer.norm.weight.add_(1.0)
    return layer


@pytest.fixture(scope="module")
def pair():
    hf = _hf_layer()
    ours = Mamba2Mixer(SPEC).eval()
    ours.load_state_dict(hf.state_dict())
    x = torch.randn(1, N_POS, SPEC.d_model, generator=torch.Generator().manual_seed(1))
    seen = {}
    handle = hf.norm.register_forward_pre_hook(lambda m, args: seen.__setitem__("heads", args[0].detach()))
    with torch.no_grad():
        want = hf(x)
    handle.remove()
    rec = Recorder()
    with torch.no_grad():
        got = ours(x, rec=rec)
    heads_hf = seen["heads"].view(1, N_POS, SPEC.n_heads, SPEC.head_dim)[0].transpose(0, 1)  # (H, n, P)
    return hf, ours, x, want, got, rec.tensors, heads_hf


def test_output_and_heads_match_transformers(pair):
    _, _, _, want, got, t, heads_hf = pair
    assert want.abs().max() > 0.1  # a real signal, not zeros compared with zeros
    assert (got - want).abs().max().item() < TOL
    assert (t["heads"] - heads_hf).abs().max().item() < TOL


def test_recorded_shapes_and_names(pair):
    _, _, _, _, _, t, _ = pair
    h, n = SPEC.n_heads, N_POS
    assert t["q"].shape == (h, n, SPEC.d_state) and t["k"].shape == (h, n, SPEC.d_state)
    assert t["v"].shape == t["skip"].shape == t["heads"].shape == (h, n, SPEC.head_dim)
    assert t["decay"].shape == (h, n) and (t["decay"] < 0).all()
    assert t["out"].shape == (n, SPEC.d_model)
    per = h // SPEC.n_groups  # heads of one group read the same B and C
    assert torch.equal(t["k"][0], t["k"][per - 1]) and not torch.equal(t["k"][0], t["k"][per])


def test_implicit_attention_is_causal_and_rebuilds_heads(pair):
    _, ours, _, _, _, t, _ = pair
    A = ours.weights_from(t["q"], t["k"], t["decay"])
    assert A.shape == (SPEC.n_heads, N_POS, N_POS)
    assert A.triu(1).abs().max().item() == 0.0
    rebuilt = A @ t["v"] + t["skip"]
    scale = t["heads"].abs().max().item()
    assert (rebuilt - t["heads"]).abs().max().item() < TOL * scale
    assert torch.equal(ours.weights_from(t["q"], t["k"], t["decay"], head=2), A[2])
    with pytest.raises(ValueError, match="out of range"):
        ours.weights_from(t["q"], t["k"], t["decay"], head=SPEC.n_heads)


def test_implicit_attention_equals_the_recurrence_unrolled_in_numpy(pair):
    """A[t, s] from the state recurrence S_t = e^{dt_t a} S_{t-1} + dt_t x_t B_t^T read back:
    the weight of x_s in y_t is C_t . (prod_{r=s+1..t} e^{dt_r a}) dt_s B_s, in float64."""
    _, ours, _, _, _, t, _ = pair
    a = ours.rate().detach().double().numpy()
    q, k, decay = (t[name].double().numpy() for name in ("q", "k", "decay"))
    dt = decay / a[:, None]
    want = np.zeros((SPEC.n_heads, N_POS, N_POS))
    for h in range(SPEC.n_heads):
        for i in range(N_POS):
            carry = 1.0
            for j in range(i, -1, -1):
                want[h, i, j] = (q[h, i] @ k[h, j]) * carry * dt[h, j]
                carry *= np.exp(dt[h, j] * a[h])
    got = ours.weights_from(t["q"], t["k"], t["decay"]).detach().double().numpy()
    assert np.abs(got - want).max() < 1e-5 * np.abs(want).max()


def test_segsum_is_the_masked_running_sum():
    a = torch.tensor([0.5, -1.0, 2.0, 0.25])
    s = segsum(a)
    assert s[3, 0].item() == pytest.approx(-1.0 + 2.0 + 0.25) and s[2, 2].item() == 0.0
    assert torch.isneginf(s[0, 1]) and torch.isneginf(s[1, 3])


def test_chunked_equals_recurrent_and_the_cache_continues(pair):
    _, ours, x, _, got, t, _ = pair
    cache, rec = {}, Recorder()
    with torch.no_grad():
        whole = ours(x, rec=rec, cache=cache)  # recurrent over all positions
    gap = (whole - got).abs().max().item()
    assert gap < TOL, f"chunked vs recurrent: {gap:.2e}"
    assert (rec.tensors["heads"] - t["heads"]).abs().max().item() < TOL
    assert cache["ssm"].shape == (1, SPEC.n_heads, SPEC.head_dim, SPEC.d_state)
    assert cache["conv"].shape == (1, SPEC.conv_dim, SPEC.conv_kernel - 1)
    stepped, cache = [], {}
    with torch.no_grad():  # prefix, then one position at a time through the cache
        stepped.append(ours(x[:, :10], cache=cache))
        for i in range(10, N_POS):
            stepped.append(ours(x[:, i:i + 1], cache=cache))
    assert (torch.cat(stepped, dim=1) - got).abs().max().item() < TOL


@pytest.mark.parametrize("broken", ["D", "dt_bias", "conv1d.weight", "norm.weight"])
def test_each_parameter_moves_the_output(pair, broken):
    """Zeroing a piece in OUR copy moves the output far past the tolerance."""
    _, ours, x, want, _, _, _ = pair
    other = Mamba2Mixer(SPEC).eval()
    other.load_state_dict(ours.state_dict())
    with torch.no_grad():
        dict(other.named_parameters())[broken].mul_(0.5)
        moved = (other(x) - want).abs().max().item()
    assert moved > 100 * TOL


def test_the_map_three_ways_agree(pair):
    """Recorded under a maps recorder, computed from the input (weights(x)) and from the
    recorded q, k, decay (weights_from): the same map."""
    _, ours, x, _, _, t, _ = pair
    with torch.no_grad():
        from_input = ours.weights(x)[0]
        from_trace = ours.weights_from(t["q"], t["k"], t["decay"])
    assert from_input.shape == t["weights"].shape == (SPEC.n_heads, N_POS, N_POS)
    assert (from_input - t["weights"]).abs().max().item() < 1e-6
    assert (from_trace - t["weights"]).abs().max().item() < 1e-6
    quiet = Recorder(maps=False)
    with torch.no_grad():
        ours(x, rec=quiet)
    assert "weights" not in quiet.tensors and "heads" in quiet.tensors
    assert list(t) == [n for n in ours.recorded_names() if n in t] and set(t) == set(ours.recorded_names())


def test_settings_are_checked():
    with pytest.raises(ValueError, match="n_groups"):
        Mamba2Spec(d_model=8, n_heads=3, head_dim=4, d_state=2, n_groups=2)
    with pytest.raises(ValueError, match="d_state"):
        Mamba2Spec(d_model=8, n_heads=2, head_dim=4, d_state=0)

    class Cfg:
        d_model, norm_eps, mixer = 8, 1e-5, {"kind": "mamba2", "heads": 2, "head_dim": 4}

    with pytest.raises(ValueError, match="d_state"):
        Mamba2Spec.from_config(Cfg)
    Cfg.mixer = dict(Cfg.mixer, d_state=3, groups=2)
    spec = Mamba2Spec.from_config(Cfg)
    assert (spec.n_groups, spec.eps, spec.conv_kernel) == (2, 1e-5, 4)
    assert Mamba2Mixer(Cfg).state_shapes() == {"conv": (8 + 2 * 2 * 3, 3), "ssm": (2, 4, 3)}


@pytest.mark.parametrize("rms_norm, before", [(False, True), (True, True), (True, False)])
def test_falcon_h1_gates(rms_norm, before):
    """Falcon-H1's mixer (its multipliers at 1): y * silu(z) without a norm, RMSNorm(y) * silu(z),
    or Mamba2's RMSNorm(y * silu(z)), each against transformers' FalconH1Mixer within 1e-4."""
    from transformers.models.falcon_h1 import modeling_falcon_h1 as hf_falcon

    cfg = transformers.FalconH1Config(
        hidden_size=SPEC.d_model, mamba_d_ssm=SPEC.d_inner, mamba_n_heads=SPEC.n_heads, mamba_d_head=SPEC.head_dim,
        mamba_d_state=SPEC.d_state, mamba_n_groups=SPEC.n_groups, mamba_d_conv=SPEC.conv_kernel,
        mamba_chunk_size=SPEC.chunk_size, rms_norm_eps=SPEC.eps, mamba_rms_norm=rms_norm,
        mamba_norm_before_gate=before, num_hidden_layers=1, vocab_size=32, num_attention_heads=2,
        num_key_value_heads=1)
    torch.manual_seed(0)
    hf = hf_falcon.FalconH1Mixer(cfg, layer_idx=0).eval()
    hf.register_buffer("mup_vector", torch.ones(1, 1, hf.in_proj.out_features), persistent=False)
    with torch.no_grad():
        for p in hf.parameters():
            p.copy_(torch.randn_like(p) * 0.3)
        hf.A_log.copy_(torch.linspace(-1.0, 0.7, SPEC.n_heads))
        if rms_norm:
            hf.norm.weight.add_(1.0)
    gate = "gate_only" if not rms_norm else "norm_then_gate" if before else "gate_then_norm"
    ours = Mamba2Mixer(Mamba2Spec(**{**SPEC.__dict__, "gate": gate})).eval()
    ours.load_state_dict(hf.state_dict())
    assert (ours.norm is None) == (not rms_norm)
    x = torch.randn(1, N_POS, SPEC.d_model, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        want, got = hf(x), ours(x)
        stepped = ours(x, cache={})
    assert want.abs().max() > 0.1
    assert (got - want).abs().max().item() < TOL and (stepped - want).abs().max().item() < TOL
