"""A token mixer's recurrence step by step, in float64 numpy, written here from the formulas
(the independent side of Inside a head's checks on a mixer layer; core/net/gated_delta.py and
core/net/mamba2.py compute the same in float32, in chunks).

Gated DeltaNet, per head, from the rule's recorded inputs (q scaled by d_k^-1/2, k L2-normed):
    S_t = exp(g_t) (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T        (d_k x d_v)
        = exp(g_t) S_{t-1} + beta_t k_t (v_t - r_t)^T,   r_t = exp(g_t) S_{t-1}^T k_t (the key removal)
    o_t = S_t^T q_t
    A[t, s] = beta_s k_s . P_{s+1} ... P_t q_t,  P_r = exp(g_r) (I - beta_r k_r k_r^T)
The decay g_t = -exp(A_log) softplus(x_t W_a + dt_bias) and beta_t = sigmoid(x_t W_b) are
recomputed from the layer's normed input and the checkpoint's weights.

Kimi Delta Attention, the same with a decay per key channel, g_t a vector of d_k:
    S_t = (I - beta_t k_t k_t^T) diag(exp(g_t)) S_{t-1} + beta_t k_t v_t^T
        = diag(exp(g_t)) S_{t-1} + beta_t k_t (v_t - r_t)^T,   r_t = S_{t-1}^T (exp(g_t) * k_t)
    A[t, s] = beta_s k_s . M_{s+1}^T ... M_t^T q_t,  M_r^T = diag(exp(g_r)) (I - beta_r k_r k_r^T)
with g_t = -exp(A_log_h) softplus(x_t W_fa^T W_fb^T + dt_bias) (dt_bias per channel) recomputed
from the layer's normed input (kimi_delta_gates).

Mamba2, per head (P channels, a state of N), from C (= q), B (= k), x (= v), the log decay
dt_t a_h (itself recomputed from the normed input, in_proj's dt rows, dt_bias and A_log) and
a_h = -exp(A_log_h) from the checkpoint:
    S_t = exp(dt_t a_h) S_{t-1} + dt_t x_t B_t^T      (P x N)
    y_t = S_t C_t + D_h x_t
    A[t, s] = (C_t . B_s) exp(sum_{r=s+1..t} dt_r a_h) dt_s
Every function is pure: arrays in, arrays out."""

from __future__ import annotations

from typing import Dict

import numpy as np

from viz.figures.checks import Check, max_abs_diff, tolerance

TOL = 1e-4  # relative to max(1, largest |value|): float32 chunked against float64 step by step


def _f(x) -> np.ndarray:
    return np.asarray(x.detach().cpu().double().numpy() if hasattr(x, "detach") else x, dtype=np.float64)


def gated_delta_steps(q, k, v, g, beta) -> Dict[str, np.ndarray]:
    """One head's recurrence: q, k (n x d_k), v (n x d_v), beta (n), g (n; or n x d_k, a decay
    per key channel: Kimi Delta Attention). Returns S (n x d_k x d_v, the state after each
    step), decay exp(g) (as g), beta (n), removal r_t (n x d_v), out o_t (n x d_v) and A (n x n,
    unrolled as the product of the steps' maps, not from the states)."""
    q, k, v, g, beta = map(_f, (q, k, v, g, beta))
    n, dk = k.shape
    S = np.zeros((dk, v.shape[1]))
    states, removal, out = [], [], []
    for t in range(n):
        e = np.exp(g[t]) * np.ones(dk)  # the decay of each key channel (one number for all in Gated DeltaNet)
        r = S.T @ (e * k[t])
        S = e[:, None] * S + beta[t] * np.outer(k[t], v[t] - r)
        states.append(S.copy())
        removal.append(r)
        out.append(S.T @ q[t])
    a = np.zeros((n, n))
    for t in range(n):
        u = q[t].copy()  # P_{s+1}^T ... P_t^T q_t, built from the right
        for s in range(t, -1, -1):
            a[t, s] = beta[s] * k[s] @ u
            u = np.exp(g[s]) * (u - beta[s] * k[s] * (k[s] @ u))
    return dict(S=np.array(states), decay=np.exp(g), beta=beta, removal=np.array(removal), out=np.array(out), A=a)


def _softplus(x: np.ndarray) -> np.ndarray:
    """log(1 + e^x), x itself past 20 (as the models' softplus)."""
    return np.where(x > 20, x, np.log1p(np.exp(np.minimum(x, 20))))


def gated_delta_gates(x, w_a, w_b, A_log, dt_bias, beta_scale: float = 1.0) -> Dict[str, np.ndarray]:
    """g (H x n) and beta (H x n) from the mixer's input x (n x d) and the weights; beta_scale
    the factor on sigmoid(x W_b) (OLMo Hybrid: 2)."""
    x, w_a, w_b, A_log, dt_bias = map(_f, (x, w_a, w_b, A_log, dt_bias))
    pre = x @ w_a.T + dt_bias
    g = -np.exp(A_log) * _softplus(pre)
    beta = beta_scale / (1.0 + np.exp(-(x @ w_b.T)))
    return dict(g=g.T, beta=beta.T)


def kimi_delta_gates(x, w_fa, w_fb, w_b, A_log, dt_bias) -> Dict[str, np.ndarray]:
    """g (H x n x d_k) and beta (H x n) of Kimi Delta Attention from the layer's normed input x
    (n x d) and the weights: g = -exp(A_log_h) softplus(x W_fa^T W_fb^T + dt_bias), beta =
    sigmoid(x W_b^T)."""
    x, w_fa, w_fb, w_b, A_log, dt_bias = map(_f, (x, w_fa, w_fb, w_b, A_log, dt_bias))
    H = A_log.size
    pre = (x @ w_fa.T) @ w_fb.T + dt_bias  # n x H d_k
    g = -np.exp(A_log.reshape(-1))[:, None, None] * _softplus(pre).reshape(x.shape[0], H, -1).transpose(1, 0, 2)
    beta = 1.0 / (1.0 + np.exp(-(x @ w_b.T)))
    return dict(g=g, beta=beta.T)


def mamba2_decay(x, w_dt, dt_bias, A_log, dt_limit=(0.0, float("inf"))) -> np.ndarray:
    """The log decay dt_t a_h (H x n) from the layer's normed input x (n x d) and the
    checkpoint's weights: dt = clamp(softplus(x W_dt + dt_bias)), W_dt the last H rows of
    in_proj, a = -exp(A_log)."""
    x, w_dt, dt_bias, A_log = map(_f, (x, w_dt, dt_bias, A_log))
    pre = x @ w_dt.T + dt_bias
    dt = np.clip(_softplus(pre), *dt_limit)
    return (dt * -np.exp(A_log)).T


def mamba2_steps(C, B, x, log_decay, a, D=None) -> Dict[str, np.ndarray]:
    """One head's scan: C, B (n x N), x (n x P), log_decay = dt_t a (n), a (the head's rate,
    negative), D (the skip's factor, or None). Returns S (n x P x N), decay exp(dt a) (n), dt
    (n), out y_t (n x P, the skip included) and A (n x n, from its closed form)."""
    C, B, x, ld = map(_f, (C, B, x, log_decay))
    dt = ld / float(a)
    n, N = B.shape
    S = np.zeros((x.shape[1], N))
    states, out = [], []
    for t in range(n):
        S = np.exp(ld[t]) * S + dt[t] * np.outer(x[t], B[t])
        states.append(S.copy())
        out.append(S @ C[t] + (0.0 if D is None else float(D) * x[t]))
    cum = np.concatenate([[0.0], np.cumsum(ld)])
    a_map = np.zeros((n, n))
    for t in range(n):
        for s in range(t + 1):
            a_map[t, s] = (C[t] @ B[s]) * np.exp(cum[t + 1] - cum[s + 1]) * dt[s]
    return dict(S=np.array(states), decay=np.exp(ld), dt=dt, out=np.array(out), A=a_map)


def check(label: str, shown, ref, rtol: float = TOL) -> Check:
    """`shown` (the trace's) against `ref` (this module's), within rtol x max(1, largest |ref|)."""
    return Check(label, max_abs_diff(shown, ref), tolerance(ref, rtol))
