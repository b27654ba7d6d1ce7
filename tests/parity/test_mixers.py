"""Token mixers that are not softmax attention (core/net/mixer.py), starting with Gated DeltaNet
(core/net/gated_delta.py).

The framework, on a small random network of our own (a gated delta layer, then a softmax layer
with an output gate):
- a mixer layer has `mixer` instead of `self_attn`, sub-layers ["mixer", "ffn"], and records
  `{stack}.{i}.mixer.*` names that parse and print back;
- `.heads` equals the gated delta rule stepped here in numpy (float64) from the recorded
  q, k, v, decay and beta, and `.weights` equals A[t, s] = beta_s k_s . P_{s+1} ... P_t q_t
  multiplied out here in numpy, P_r = exp(g_r) (I - beta_r k_r k_r^T);
- A has nothing above the diagonal and A @ v equals `.heads`;
- the chunked and the recurrent forms agree (the figure is printed), and greedy decoding with
  the cache (the recurrent form, one token at a time) gives the logits of the full pass;
- layer_info / layer_kinds say what each layer is.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from core import trace_names as tn
from core.net.config import ModelConfig
from core.net.gated_delta import chunked_rule, recurrent_rule
from core.net.model import Transformer
from core.net.recorder import Recorder

TOL = 1e-4
N = 30


def _net(seed: int = 0, chunk: int = 8) -> Transformer:
    torch.manual_seed(seed)
    cfg = ModelConfig(kind="decoder", d_model=32, n_heads=4, n_kv_heads=2, d_head=8, d_ff=48, n_layers=2,
                      tgt_vocab_size=50, positional="rope", norm="rmsnorm", norm_placement="pre",
                      activation="swiglu", bias=False, final_norm=True, rotary_dim=4, attn_gate=True,
                      layer_types=["linear_attention", "full_attention"],
                      mixer={"kind": "gated_delta", "heads": 4, "k_heads": 2, "d_k": 8, "d_v": 6, "conv": 4,
                             "chunk": chunk})
    net = Transformer(cfg).eval()
    m = net.decoder[0].mixer
    with torch.no_grad():  # decays of every size (some heads forget in a few steps), strong writes
        m.A_log.copy_(torch.tensor([-3.0, -1.0, 0.0, 1.0]))
        m.dt_bias.copy_(torch.tensor([-1.0, 0.0, 0.5, 1.0]))
        m.w_qkv.weight.mul_(4.0)
        m.w_b.weight.mul_(3.0)
    return net


@pytest.fixture(scope="module")
def run():
    net = _net()
    ids = torch.randint(0, 50, (1, N), generator=torch.Generator().manual_seed(1))
    rec = Recorder()
    with torch.no_grad():
        logits = net(tgt=ids, rec=rec)
    return net, ids, rec.tensors, logits


def numpy_rule(q, k, v, g, beta):
    """The gated delta rule stepped in float64: S_t = e^g_t (I - b k k^T) S_{t-1} + b k v^T, o_t = S_t^T q_t."""
    q, k, v, g, beta = (np.asarray(t, dtype=np.float64) for t in (q, k, v, g, beta))
    H, n, dk = k.shape
    out = np.zeros((H, n, v.shape[-1]))
    for h in range(H):
        S = np.zeros((dk, v.shape[-1]))
        for t in range(n):
            P = np.exp(g[h, t]) * (np.eye(dk) - beta[h, t] * np.outer(k[h, t], k[h, t]))
            S = P @ S + beta[h, t] * np.outer(k[h, t], v[h, t])
            out[h, t] = S.T @ q[h, t]
    return out


def numpy_implicit(q, k, g, beta):
    """A[h, t, s] = beta_s k_s . P_{s+1} ... P_t q_t, multiplied out (u = q_t, then u = P_r u for r = t..s+1)."""
    q, k, g, beta = (np.asarray(t, dtype=np.float64) for t in (q, k, g, beta))
    H, n, dk = k.shape
    A = np.zeros((H, n, n))
    for h in range(H):
        for t in range(n):
            u = q[h, t].copy()
            for s in range(t, -1, -1):
                A[h, t, s] = beta[h, s] * k[h, s] @ u
                u = np.exp(g[h, s]) * (u - beta[h, s] * k[h, s] * (k[h, s] @ u))  # P_s u (P_s symmetric)
    return A


def test_names_and_kinds(run):
    net, _, rec, _ = run
    layer = net.decoder[0]
    assert layer.self_attn is None and layer.mixer is not None and layer.sublayers() == ["mixer", "ffn"]
    local = layer.recorded_names()
    assert [n for n in local if n.startswith("mixer.")] == [f"mixer.{s}" for s in
                                                            ("q", "k", "v", "decay", "beta", "weights", "heads", "out")]
    for n in local:
        full = tn.at("decoder", 0, n)
        assert full in rec, full
        assert str(tn.parse(full)) == full
    assert tn.parse("decoder.0.mixer.weights").part == "mixer" and tn.is_map("decoder.0.mixer.weights")
    assert tn.is_stored("decoder.0.mixer.heads") and not tn.is_stored("decoder.0.mixer.weights")
    assert "decoder.1.self_attn.gate" in rec and net.decoder[1].mixer is None
    info = net.layer_info("decoder")
    assert info[0]["mixer"] == "gated_delta" and info[0]["kind"] == "linear" == net.layer_kinds()[0]
    assert info[0]["state"] == {"conv": (2 * 16 + 24, 3), "state": (4, 8, 6)}
    assert info[1]["mixer"] == "softmax" and info[1]["output_gate"] and net.layer_kinds()[1] == "global"
    with pytest.raises(ValueError, match="not softmax attention"):
        net.attn_spec("decoder", 0)


def test_heads_and_map_match_numpy(run):
    _, _, rec, _ = run
    q, k, v, g, beta = (rec[f"decoder.0.mixer.{s}"] for s in ("q", "k", "v", "decay", "beta"))
    heads, A = rec["decoder.0.mixer.heads"], rec["decoder.0.mixer.weights"]
    assert A.shape == (4, N, N) and heads.shape == (4, N, 6)
    want = numpy_rule(q, k, v, g, beta)
    scale = np.abs(want).max()
    assert float(np.abs(heads.double().numpy() - want).max()) < TOL * scale
    want_A = numpy_implicit(q, k, g, beta)
    d = float(np.abs(A.double().numpy() - want_A).max())
    assert d < TOL * np.abs(want_A).max(), d
    assert float(A.triu(1).abs().max()) == 0.0
    assert float((A @ v - heads).abs().max()) < TOL * float(heads.abs().max())
    assert float(A.min()) < -0.01  # signed: the key removal subtracts


def test_chunked_and_recurrent_forms_agree(run):
    net, _, _, _ = run
    m = net.decoder[0].mixer
    x = torch.randn(2, 70, 32, generator=torch.Generator().manual_seed(3))  # several chunks of 8, one partial
    with torch.no_grad():
        q, k, v, g, beta = m.rule_inputs(x)
        o1, s1 = chunked_rule(q, k, v, g, beta, 8)
        o2, s2 = recurrent_rule(q, k, v, g, beta)
    d = float((o1 - o2).abs().max())
    print(f"chunked vs recurrent: max |diff| {d:.3g} (heads up to {float(o2.abs().max()):.3g})")
    assert d < 1e-5 and float((s1 - s2).abs().max()) < 1e-5


def test_generation_with_the_cache(run):
    net, ids, _, logits = run
    cache = {}
    steps = []
    with torch.no_grad():
        hidden = net.decode(ids[:, :10], cache=cache)
        steps.append(net.project(hidden))
        for t in range(10, N):
            steps.append(net.project(net.decode(ids[:, t:t + 1], cache=cache)))
    got = torch.cat(steps, dim=1)
    d = float((got - logits).abs().max())
    print(f"cached (recurrent) vs full pass logits: max |diff| {d:.3g}")
    assert d < TOL
    assert set(cache[0]["mixer"]) == {"conv", "state"} and cache[0]["mixer"]["state"].shape == (1, 4, 8, 6)
    assert torch.equal(got.argmax(-1), logits.argmax(-1))


def test_bad_mixer_settings():
    with pytest.raises(ValueError, match="need a mixer"):
        ModelConfig(kind="decoder", n_layers=1, layer_types=["linear_attention"])
    with pytest.raises(ValueError, match="mixer kind 'nope' is not known"):
        Transformer(ModelConfig(kind="decoder", n_layers=1, tgt_vocab_size=5, layer_types=["linear_attention"],
                                mixer={"kind": "nope"}))
