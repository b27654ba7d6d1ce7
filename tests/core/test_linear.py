"""core/net/linear.py: the network's linears through oneDNN on a CPU (packed or not, the
FFN's activation fused) give torch's linear to float rounding, fall back to it where they
must (autograd, float64), and never serve a stale packed weight."""

import pytest
import torch
import torch.nn.functional as F

import core.net.linear as lin
from core.net.linear import EAGER, Linear, use_onednn

pytestmark = pytest.mark.skipif(lin._ONEDNN is None, reason="this torch has no oneDNN")


def _layer(d_in=384, d_out=1536, pack=True, seed=0):
    """A Linear through oneDNN, on a packed weight (pack) or the plain one."""
    torch.manual_seed(seed)
    m = Linear(d_in, d_out)
    with torch.no_grad():
        m.weight.normal_(0, 0.05)
        m.bias.normal_(0, 0.1)
    m.onednn = True
    if not pack:
        m._packed = lambda: m.weight
    return m


def _err64(y, x, m, act=None):
    ref = F.linear(x.double(), m.weight.double(), m.bias.double())
    ref = ref if act is None else EAGER[act](ref)
    return (y.double() - ref).abs().max().item()


@pytest.mark.parametrize("pack", [False, True])
@pytest.mark.parametrize("rows", [1, 7, 128, 300])
def test_onednn_is_torch_linear_to_rounding(pack, rows):
    """Against a float64 product, oneDNN's error is of the size of torch's own (both sum the
    same 384 products in float32, in different orders)."""
    m = _layer(pack=pack)
    x = torch.randn(2, rows, 384)
    with torch.inference_mode():
        assert m._fast(x)
        y, ref = m(x), F.linear(x, m.weight, m.bias)
    assert y.shape == ref.shape == (2, rows, 1536)
    assert not torch.equal(y, torch.zeros_like(y))
    assert _err64(y, x, m) < 4 * max(_err64(ref, x, m), 1e-6)
    assert (y - ref).abs().max().item() < 2e-5


@pytest.mark.parametrize("act", sorted(EAGER))
def test_fused_activation_is_the_activation_after_the_linear(act):
    m = _layer(pack=True)
    x = torch.randn(1, 64, 384)
    with torch.inference_mode():
        fused = m.act(x, act)
        apart = EAGER[act](F.linear(x, m.weight, m.bias))
    assert _err64(fused, x, m, act) < 4 * max(_err64(apart, x, m, act), 1e-6)
    assert (fused - apart).abs().max().item() < 2e-5


def test_packed_and_unpacked_agree_bit_for_bit():
    x = torch.randn(1, 50, 384)
    plain, packed = _layer(pack=False), _layer(pack=True)
    with torch.inference_mode():
        assert torch.equal(plain(x), packed(x))
        assert packed.__dict__["_kept"][1].is_mkldnn  # the packed copy was the one used


def test_a_changed_weight_is_packed_again():
    """The packed copy follows the weight: an in-place change (an optimiser step,
    load_state_dict) and a new tensor both give the new product, not the old one."""
    m = _layer(pack=True)
    x = torch.randn(1, 20, 384)
    with torch.inference_mode():
        before = m(x)
    with torch.no_grad():
        m.weight.mul_(2.0)  # in place: same storage, new version
    with torch.inference_mode():
        doubled = m(x)
    assert torch.allclose(doubled - m.bias, 2 * (before - m.bias), atol=1e-4)
    m.load_state_dict({"weight": torch.zeros(1536, 384), "bias": torch.ones(1536)})
    with torch.inference_mode():
        assert torch.equal(m(x), torch.ones(1, 20, 1536))
    m.weight = torch.nn.Parameter(torch.eye(1536, 384))  # a new tensor
    with torch.inference_mode():
        assert torch.allclose(m(x), torch.cat([x, torch.zeros(1, 20, 1152)], -1) + 1, atol=1e-6)


def test_a_weight_made_in_inference_mode_is_used_unpacked():
    """Inference tensors have no version counter, so a packed copy could go stale unseen."""
    with torch.inference_mode():
        m = _layer()
        x = torch.randn(1, 8, 384)
        y = m(x)
        assert "_kept" not in m.__dict__
        m.weight.mul_(2.0)
        assert torch.allclose(m(x) - m.bias, 2 * (y - m.bias), atol=1e-4)


def test_autograd_and_float64_take_torch_linear():
    """Attribution differentiates through the network: with a gradient wanted (or float64),
    the layer is torch's linear, and the gradient is its gradient."""
    m = _layer(pack=True)
    x = torch.randn(1, 5, 384, requires_grad=True)
    assert not m._fast(x)
    y = m.act(x, "gelu")
    y.sum().backward()
    x2 = x.detach().clone().requires_grad_(True)
    F.gelu(F.linear(x2, m.weight, m.bias)).sum().backward()
    assert torch.equal(x.grad, x2.grad)
    m64 = _layer(pack=False).double()
    assert not m64._fast(torch.randn(3, 384, dtype=torch.float64))


def test_without_onednn_the_layer_is_torch_linear(monkeypatch):
    monkeypatch.setattr(lin, "_ONEDNN", None)
    m = _layer(pack=True)
    x = torch.randn(1, 9, 384)
    with torch.inference_mode():
        assert torch.equal(m(x), F.linear(x, m.weight, m.bias))
        assert torch.equal(m.act(x, "silu"), F.silu(F.linear(x, m.weight, m.bias)))


def test_only_small_models_turn_it_on(minilm):
    net = torch.nn.Sequential(Linear(384, 1536), Linear(1536, 384))
    assert not any(m.onednn for m in net)  # off unless a model turns it on
    assert use_onednn(net)  # 4.5 MiB of weights
    assert all(m.onednn for m in net)
    assert not use_onednn(net, budget=2**20)
    assert not any(m.onednn or m._fast(torch.randn(4, 384)) for m in net)
    assert all(m.onednn for m in minilm.net.modules() if isinstance(m, Linear))


def test_a_hook_sees_the_linear_output_not_the_activation():
    """A forward hook on W_1 (a user's, or a test's fault) sees x W_1^T + b_1 and what it
    returns goes into the activation, as with nn.Linear."""
    m = _layer()
    x = torch.randn(1, 16, 384)
    seen = []
    handle = m.register_forward_hook(lambda mod, inp, out: seen.append(out) or out * 2)
    try:
        with torch.inference_mode():
            hooked = m.act(x, "gelu")
    finally:
        handle.remove()
    with torch.inference_mode():
        lin_out = F.linear(x, m.weight, m.bias)
    assert len(seen) == 1 and (seen[0] - lin_out).abs().max() < 2e-5
    assert (hooked - F.gelu(2 * lin_out)).abs().max() < 5e-5


def test_minilm_trace_is_the_same_with_torch_gemm(minilm, monkeypatch):
    """The whole traced pass through oneDNN against the same pass on torch's GEMM: every
    layer's output and the attention weights agree to float rounding."""
    text = "the quick brown fox jumps over the lazy dog"
    fast = minilm.trace(text)
    monkeypatch.setattr(lin, "_ONEDNN", None)
    slow = minilm.trace(text)
    for i in range(fast.layers("encoder")):
        for name in (f"encoder.{i}.out", f"encoder.{i}.self_attn.weights"):
            a, b = fast[name], slow[name]
            assert (a - b).abs().max().item() < 1e-4 * max(1.0, b.abs().max().item()), name


@pytest.mark.parametrize("pack", [False, True])
def test_a_heads_rows_are_the_full_products_columns(pack):
    """core/head_maps.py projects one head at a time: its q must be bit for bit those columns
    of the layer's projection, so the long paths equal the full maps exactly."""
    m = _layer(384, 384, pack=pack)
    x = torch.randn(300, 384)
    with torch.inference_mode():
        full = m(x)
        for h in (0, 5, 11):
            assert torch.equal(m.rows(x, 32 * h, 32 * (h + 1)), full[:, 32 * h:32 * (h + 1)]), h
    x.requires_grad_(True)  # torch's GEMM: the same rule
    assert torch.equal(m.rows(x, 64, 96).detach(), F.linear(x, m.weight, m.bias)[:, 64:96].detach())
