"""Kimi Linear (core/loaders/families/kimi_linear.py): Kimi Delta Attention layers
(core/net/kimi_delta.py, the gated delta rule with a decay per key channel) with multi-head
latent attention layers that have no positions (core/net/latent.py).

The rule (core/net/gated_delta.py with g (B, H, n, d_k)):
- the chunked and the recurrent forms agree with each other and with the rule stepped here in
  numpy (float64), from a zero state and from a kept one; the figures are printed;
- the exact implicit attention (the chunked rule run on unit values) has nothing above the
  diagonal and A @ v equals the heads.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from core.net.gated_delta import chunked_rule, recurrent_rule

TOL = 1e-4


def _rule_inputs(seed: int = 0, b: int = 1, h: int = 3, n: int = 37, dk: int = 8, dv: int = 5):
    g_ = torch.Generator().manual_seed(seed)
    q = torch.nn.functional.normalize(torch.randn(b, h, n, dk, generator=g_), dim=-1) * dk ** -0.5
    k = torch.nn.functional.normalize(torch.randn(b, h, n, dk, generator=g_), dim=-1)
    v = torch.randn(b, h, n, dv, generator=g_)
    # decays per channel from a few steps to the whole text; strong writes
    rate = torch.logspace(-3, 0.5, dk)[torch.randperm(dk, generator=g_)]
    g = -torch.rand(b, h, n, dk, generator=g_) * rate
    beta = 0.2 + 0.8 * torch.rand(b, h, n, generator=g_)
    return q, k, v, g, beta


def numpy_rule(q, k, v, g, beta, state=None):
    """S_t = (I - beta_t k_t k_t^T) diag(e^g_t) S_{t-1} + beta_t k_t v_t^T, heads_t = S_t^T q_t, in float64."""
    q, k, v, g, beta = (np.asarray(t, dtype=np.float64) for t in (q, k, v, g, beta))
    b, h, n, dk = k.shape
    S = np.zeros((b, h, dk, v.shape[-1])) if state is None else np.array(state, dtype=np.float64)
    out = np.zeros(v.shape)
    for t in range(n):
        for i in range(b):
            for j in range(h):
                kt = k[i, j, t][:, None]
                P = np.eye(dk) - beta[i, j, t] * kt @ kt.T
                S[i, j] = P @ (np.exp(g[i, j, t])[:, None] * S[i, j]) + beta[i, j, t] * kt @ v[i, j, t][None]
                out[i, j, t] = S[i, j].T @ q[i, j, t]
    return out, S


def test_per_channel_rule_forms_agree_with_numpy():
    q, k, v, g, beta = _rule_inputs()
    ref, ref_S = numpy_rule(q, k, v, g, beta)
    scale = np.abs(ref).max()
    o1, s1 = chunked_rule(q, k, v, g, beta, 8)
    o2, s2 = recurrent_rule(q, k, v, g, beta)
    chunk_vs_numpy = np.abs(o1.double().numpy() - ref).max() / scale
    rec_vs_numpy = np.abs(o2.double().numpy() - ref).max() / scale
    chunk_vs_rec = (o1 - o2).abs().max().item() / scale
    state = np.abs(s1.double().numpy() - ref_S).max() / np.abs(ref_S).max()
    print(f"\nper-channel rule: chunked vs numpy {chunk_vs_numpy:.2e}, recurrent vs numpy {rec_vs_numpy:.2e}, "
          f"chunked vs recurrent {chunk_vs_rec:.2e}, last state {state:.2e} (of the largest entry)")
    assert max(chunk_vs_numpy, rec_vs_numpy, chunk_vs_rec, state) < TOL
    # from a kept state: the second half continues the first
    half = 20
    _, kept = recurrent_rule(*(t[:, :, :half] for t in (q, k, v, g, beta)))
    o3, _ = chunked_rule(*(t[:, :, half:] for t in (q, k, v, g, beta)), 8, kept)
    assert np.abs(o3.double().numpy() - ref[:, :, half:]).max() / scale < TOL
    # the decay matters: the same rule with one decay a head (the channels' mean) is far off
    far, _ = chunked_rule(q, k, v, g.mean(-1), beta, 8)
    assert np.abs(far.double().numpy() - ref).max() / scale > 100 * TOL


def test_per_channel_implicit_attention():
    q, k, v, g, beta = _rule_inputs(seed=1)
    n = k.shape[2]
    eye = torch.eye(n).expand(*k.shape[:2], n, n)
    A = chunked_rule(q, k, eye, g, beta, 8)[0]  # heads_t = A[t, :] when the values are e_s
    heads = chunked_rule(q, k, v, g, beta, 8)[0]
    assert (A.triu(1) == 0).all()
    av = ((A @ v) - heads).abs().max().item() / heads.abs().max().item()
    print(f"\nper-channel implicit attention: A @ v vs heads {av:.2e} (of the largest entry)")
    assert av < TOL
    # a cell multiplied out: A[t, s] = beta_s k_s . P_{s+1}^T ... P_t^T q_t, P_r^T = diag(e^g_r)(I - beta_r k_r k_r^T)
    qn, kn, gn, bn = (t[0, 0].double().numpy() for t in (q, k, g, beta))
    t_, s_ = 30, 11
    x = qn[t_]
    for r in range(t_, s_, -1):
        x = np.exp(gn[r]) * (x - bn[r] * kn[r] * (kn[r] @ x))
    cell = bn[s_] * kn[s_] @ x
    assert abs(A[0, 0, t_, s_].item() - cell) < TOL * max(1.0, abs(cell))
