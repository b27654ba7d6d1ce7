"""Gated DeltaNet (Yang et al. 2024), the token mixer of Qwen3.5's and Qwen3-Next's linear layers,
in float32, in the chunked (parallel) and the recurrent form (core/net/mixer.py: the interface).

From the layer's normed input x (n x d), per position t and value head h:
    [q | k | v] = SiLU(causal depthwise conv1d(x W_qkv))      width `conv`, no bias
    q, k        split into k_heads heads of d_k, each L2-normed (x / sqrt(|x|^2 + 1e-6)),
                repeated to the H value heads (H / k_heads consecutive heads share one), q
                times d_k^-1/2
    beta_t      = c sigmoid(x W_b)                             the write strength (H); c the spec's
                                                               "beta_scale", 1 (OLMo Hybrid: 2)
    g_t         = -exp(A_log) softplus(x W_a + dt_bias)        the log decay, <= 0 (H)
    S_t         = exp(g_t) (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T      (d_k x d_v)
    heads_t     = S_t^T q_t                                    recorded `.heads`
    out         = (RMSNorm(heads_t) * w * SiLU(x W_z)) W_out    the gated norm, per head over d_v

Unrolled, heads_t = sum_{s<=t} A[t, s] v_s with the exact implicit attention
    A[t, s] = beta_s k_s . P_{s+1} ... P_t q_t,   P_r = exp(g_r) (I - beta_r k_r k_r^T)
(`.weights`): signed, lower-triangular, the key removal included. Computed as the rule's
output when the values are the n unit vectors e_s (heads_t = A[t, :]), which is the same
linear map read column by column (unit_value_rule, each chunk on the columns already written):
O(n^2 (d_k + chunk)) a head, never a d_k x d_k product per cell.

The chunked form (no cache): within a chunk of C positions with state S_0 at its start and
gamma the cumulative log decay, the writes delta_j solve (I + L) delta = beta V - diag(beta
e^gamma) K S_0 with L[j, l] = beta_j e^(gamma_j - gamma_l) k_j . k_l (l < j): one unit lower
triangular solve; then heads_i = e^(gamma_i) S_0^T q_i + sum_{j<=i} e^(gamma_i - gamma_j)
(q_i . k_j) delta_j and S_C = e^(gamma_C) S_0 + sum_j e^(gamma_C - gamma_j) k_j delta_j^T.
The rule functions also take a decay per key channel, g (B, H, n, d_k) (Kimi Delta Attention,
core/net/kimi_delta.py): S_t = (I - beta_t k_t k_t^T) diag(exp(g_t)) S_{t-1} + beta_t k_t v_t^T,
the chunked form's pairwise decay then a (C, C, d_k) tensor (_chunk_channels says how).
With a cache dict (greedy decoding) the layer keeps S and the convolution's last conv - 1 inputs
there ("conv", "state") and continues from them: one new position is the recurrent form (S_t
stepped once); several (a prompt) the chunked form started from the kept state, which gives
the same numbers to float32 rounding in a fraction of the time.
"""

from __future__ import annotations

import math
from typing import Dict, List, Optional, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F

from .config import ModelConfig
from .hooks import point
from .linear import Linear
from .mixer import Mixer
from .recorder import Rec, records_maps


def l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """x / sqrt(|x|^2 + eps) over the last axis."""
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + eps)


def _chunk_scalar(qc, kc, vc, gc, bc, S) -> Tuple[torch.Tensor, torch.Tensor]:
    """One chunk of the rule with one decay a head: gc, bc (B, H, m), S the state at its start.
    Returns (heads of the chunk (B, H, m, d_v), the state at its end)."""
    m = kc.shape[-2]
    gamma = gc.cumsum(-1)  # (B, H, m)
    diff = gamma[..., :, None] - gamma[..., None, :]  # gamma_i - gamma_j
    lower = torch.ones(m, m, dtype=torch.bool, device=kc.device).tril()
    decay = torch.where(lower, diff, diff.new_tensor(float("-inf"))).exp()  # e^(gamma_i - gamma_j), j <= i
    kk = kc @ kc.transpose(-1, -2)
    system = torch.eye(m, device=kc.device) + (bc[..., :, None] * kk * decay).tril(-1)
    rhs = bc[..., None] * vc - (bc * gamma.exp())[..., None] * (kc @ S)
    delta = torch.linalg.solve_triangular(system, rhs, upper=False, unitriangular=True)  # (B, H, m, d_v)
    out = gamma.exp()[..., None] * (qc @ S) + ((qc @ kc.transpose(-1, -2)) * decay) @ delta
    tail = (gamma[..., -1:] - gamma).exp()  # e^(gamma_C - gamma_j)
    return out, gamma[..., -1].exp()[..., None, None] * S + (kc * tail[..., None]).transpose(-1, -2) @ delta


def _chunk_channels(qc, kc, vc, gc, bc, S) -> Tuple[torch.Tensor, torch.Tensor]:
    """One chunk with a decay per key channel, gc (B, H, m, d_k). With gamma (m, d_k) the
    cumulative log decay and S_0 the start state: (I + L) delta = beta V - diag(beta)
    (K * e^gamma) S_0 with L[i, j] = beta_i sum_c k_ic k_jc e^(gamma_ic - gamma_jc) (j < i);
    heads_i = (q_i * e^gamma_i)^T S_0 + sum_{j<=i} [sum_c q_ic k_jc e^(gamma_ic - gamma_jc)] delta_j;
    S_C = e^gamma_C * S_0 + sum_j (k_j * e^(gamma_C - gamma_j)) delta_j^T. The pairwise decay
    is a (m, m, d_k) tensor masked to j <= i before its exponential (no e^gamma e^-gamma)."""
    m = kc.shape[-2]
    gamma = gc.cumsum(-2)  # (B, H, m, d_k)
    diff = gamma[..., :, None, :] - gamma[..., None, :, :]  # (B, H, m, m, d_k): gamma_ic - gamma_jc
    lower = torch.ones(m, m, dtype=torch.bool, device=kc.device).tril()[..., None]
    decay = torch.where(lower, diff, diff.new_tensor(float("-inf"))).exp()  # j <= i
    kd = decay * kc[..., None, :, :]  # [i, j, c] = k_jc e^(gamma_ic - gamma_jc), 0 for j > i
    kk = torch.einsum("...ijc,...ic->...ij", kd, kc)  # sum_c k_ic k_jc e^(gamma_ic - gamma_jc)
    system = torch.eye(m, device=kc.device) + (bc[..., :, None] * kk).tril(-1)
    rhs = bc[..., None] * (vc - (kc * gamma.exp()) @ S)
    delta = torch.linalg.solve_triangular(system, rhs, upper=False, unitriangular=True)  # (B, H, m, d_v)
    qk = torch.einsum("...ijc,...ic->...ij", kd, qc)  # (B, H, m, m), 0 above the diagonal
    out = (qc * gamma.exp()) @ S + qk @ delta
    tail = (gamma[..., -1:, :] - gamma).exp()  # e^(gamma_C - gamma_j), (B, H, m, d_k)
    return out, gamma[..., -1, :].exp()[..., None] * S + (kc * tail).transpose(-1, -2) @ delta


def chunked_rule(q, k, v, g, beta, chunk: int = 64, state=None) -> Tuple[torch.Tensor, torch.Tensor]:
    """The gated delta rule in chunks: q, k (B, H, n, d_k) (q scaled), v (B, H, n, d_v), beta
    (B, H, n), g (B, H, n) (one decay a head) or (B, H, n, d_k) (a decay per key channel: the
    Kimi delta rule, S_t = (I - beta_t k_t k_t^T) diag(e^g_t) S_{t-1} + beta_t k_t v_t^T); state
    (B, H, d_k, d_v) or None (zeros). Returns (heads (B, H, n, d_v), the last state). float32
    throughout."""
    step = _chunk_channels if g.dim() == 4 else _chunk_scalar
    b, h, n, dk = k.shape
    dv = v.shape[-1]
    S = q.new_zeros(b, h, dk, dv) if state is None else state.to(torch.float32)
    out = q.new_empty(b, h, n, dv)
    for c0 in range(0, n, chunk):
        c1 = min(n, c0 + chunk)
        out[:, :, c0:c1], S = step(q[:, :, c0:c1], k[:, :, c0:c1], v[:, :, c0:c1], g[:, :, c0:c1], beta[:, :, c0:c1], S)
    return out, S


def unit_value_rule(q, k, g, beta, chunk: int = 64) -> torch.Tensor:
    """The exact implicit attention A (B, H, n, n): chunked_rule's heads when the values are the
    n unit vectors e_s (heads_t = A[t, :]), from a zero state. Before chunk [c0, c1) only the
    values of positions < c0 have been written, so the state's columns from c1 on are zero and
    so is every output there: each chunk runs on its first c1 columns only, half the work of
    the full n x n values."""
    step = _chunk_channels if g.dim() == 4 else _chunk_scalar
    b, h, n, dk = k.shape
    eye = torch.eye(n, device=k.device, dtype=torch.float32)
    S = q.new_zeros(b, h, dk, 0)
    out = q.new_zeros(b, h, n, n)
    for c0 in range(0, n, chunk):
        c1 = min(n, c0 + chunk)
        S = F.pad(S, (0, c1 - S.shape[-1]))  # the chunk's own positions join as zero columns
        out[:, :, c0:c1, :c1], S = step(q[:, :, c0:c1], k[:, :, c0:c1], eye[c0:c1, :c1].expand(b, h, -1, -1),
                                        g[:, :, c0:c1], beta[:, :, c0:c1], S)
    return out


def recurrent_rule(q, k, v, g, beta, state=None) -> Tuple[torch.Tensor, torch.Tensor]:
    """The gated delta rule one position at a time (same arguments and results as chunked_rule;
    g (B, H, n) or per key channel (B, H, n, d_k))."""
    b, h, n, dk = k.shape
    S = q.new_zeros(b, h, dk, v.shape[-1]) if state is None else state.to(torch.float32)
    outs = []
    for t in range(n):
        kt = k[:, :, t]
        S = S * g[:, :, t].exp()[..., None, None] if g.dim() == 3 else S * g[:, :, t].exp()[..., None]
        delta = (v[:, :, t] - (kt[..., None] * S).sum(-2)) * beta[:, :, t, None]  # beta (v - S^T k)
        S = S + kt[..., None] * delta[..., None, :]
        outs.append((S * q[:, :, t, :, None]).sum(-2))  # S^T q
    return torch.stack(outs, dim=2), S


class DeltaRuleMixer(Mixer):
    """What the delta-rule mixers share (GatedDeltaNet here, core/net/kimi_delta.py's Kimi Delta
    Attention): the names they record, their exact map (unit_value_rule) and running the rule in
    the form a call needs, its short convolution and the gated norm's RMSNorm. A subclass gives
    rule_inputs(x, cache) -> (q, k, v, g, beta), `chunk`, `map_chunk` (the chunk its map is
    computed in), `conv` (C x width filters), `width`, `eps` and `norm_weight`."""

    chunk: int = 64
    map_chunk: int = 64

    def recorded_names(self) -> List[str]:
        return ["q", "k", "v", "decay", "beta", "weights", "heads", "out"]

    def rule_inputs(self, x, cache: Optional[dict] = None):
        raise NotImplementedError

    def implicit_attention(self, q, k, g, beta) -> torch.Tensor:
        """A (B, H, n, n) from the rule's inputs: the chunked rule run on the unit values e_s."""
        return unit_value_rule(q, k, g, beta, self.map_chunk)

    def short_conv(self, mixed, cache: Optional[dict] = None) -> torch.Tensor:
        """SiLU of the causal depthwise convolution (self.conv, C x width) over mixed (B, C, n),
        float32; with a cache it continues from cache["conv"] and leaves its last inputs there."""
        past = None if cache is None else cache.get("conv")
        if past is None:
            past = mixed.new_zeros(mixed.shape[0], mixed.shape[1], self.width - 1)
        padded = torch.cat([past, mixed.float()], dim=-1)  # (B, C, width - 1 + n)
        if cache is not None:
            cache["conv"] = padded[:, :, padded.shape[-1] - (self.width - 1):]
        return F.silu(F.conv1d(padded, self.conv.float()[:, None, :], groups=padded.shape[1]))

    def head_norm(self, heads) -> torch.Tensor:
        """The gated norm's RMSNorm of each head's output (over d_v), times its gain."""
        return heads * torch.rsqrt(heads.pow(2).mean(-1, keepdim=True) + self.eps) * self.norm_weight.float()

    def weights(self, x) -> torch.Tensor:
        q, k, _, g, beta = self.rule_inputs(x)
        return self.implicit_attention(q, k, g, beta)

    def run_rule(self, x, rec: Rec = None, cache: Optional[dict] = None) -> torch.Tensor:
        """The rule's heads (B, H, n, d_v) on x, its inputs (and, under a recorder that records maps,
        its map) recorded, `.heads` a hook point: without a cache the chunked form; with one, a
        decoding step (one position) in the recurrent form and a prompt in the chunked form from
        the kept state, which is left in cache["state"]."""
        n = x.shape[1]
        q, k, v, g, beta = self.rule_inputs(x, cache)
        if rec:
            for name, t in (("q", q), ("k", k), ("v", v), ("decay", g), ("beta", beta)):
                rec(name, t)
            if records_maps(rec):
                rec("weights", self.implicit_attention(q, k, g, beta))
        if cache is None:
            heads, _ = chunked_rule(q, k, v, g, beta, self.chunk)
        elif n == 1:  # a decoding step: the recurrent form
            heads, cache["state"] = recurrent_rule(q, k, v, g, beta, cache.get("state"))
        else:  # a prompt read into the cache: the chunked form from the kept state
            heads, cache["state"] = chunked_rule(q, k, v, g, beta, self.chunk, cache.get("state"))
        return point(rec, "heads", heads)


class GatedDeltaNet(DeltaRuleMixer):
    kind = "gated_delta"

    def __init__(self, cfg: ModelConfig, index: int = 0):
        super().__init__()
        m = cfg.mixer
        d = cfg.d_model
        self.n_heads, self.k_heads = int(m["heads"]), int(m.get("k_heads", m["heads"]))
        if self.n_heads % self.k_heads:
            raise ValueError(f"gated_delta: heads ({self.n_heads}) must be a multiple of k_heads ({self.k_heads})")
        self.dk, self.dv, self.width = int(m["d_k"]), int(m["d_v"]), int(m["conv"])
        self.chunk = int(m.get("chunk", 64))
        self.map_chunk = min(self.chunk, max(self.dk, 16))
        self.eps = float(m.get("norm_eps", cfg.norm_eps))
        self.beta_scale = float(m.get("beta_scale", 1.0))  # beta in (0, beta_scale)
        if not self.beta_scale > 0:
            raise ValueError(f"gated_delta: beta_scale must be positive, not {self.beta_scale}")
        self.key_dim, self.value_dim = self.k_heads * self.dk, self.n_heads * self.dv
        channels = 2 * self.key_dim + self.value_dim
        self.w_qkv = Linear(d, channels, bias=False)
        self.w_z = Linear(d, self.value_dim, bias=False)
        self.w_b = Linear(d, self.n_heads, bias=False)
        self.w_a = Linear(d, self.n_heads, bias=False)
        bound = 1.0 / math.sqrt(self.width)
        self.conv = nn.Parameter(torch.empty(channels, self.width).uniform_(-bound, bound))  # depthwise filters
        self.A_log = nn.Parameter(torch.empty(self.n_heads).uniform_(0.01, 16).log())
        self.dt_bias = nn.Parameter(torch.ones(self.n_heads))
        self.norm_weight = nn.Parameter(torch.ones(self.dv))  # the gated RMSNorm's gain
        self.w_out = Linear(self.value_dim, d, bias=False)

    def state_shapes(self) -> Dict[str, Tuple[int, ...]]:
        return {"conv": (2 * self.key_dim + self.value_dim, self.width - 1),
                "state": (self.n_heads, self.dk, self.dv)}

    def rule_inputs(self, x, cache: Optional[dict] = None):
        """(q, k, v, g, beta) as the rule reads them from x (B, n, d): q, k (B, H, n, d_k), v
        (B, H, n, d_v), g, beta (B, H, n), all float32. With a cache, the convolution continues
        from cache["conv"] and leaves its last inputs there."""
        b, n, _ = x.shape
        conv = self.short_conv(self.w_qkv(x).float().transpose(1, 2), cache)  # (B, C, n)
        q, k, v = torch.split(conv.transpose(1, 2), [self.key_dim, self.key_dim, self.value_dim], dim=-1)
        rep = self.n_heads // self.k_heads
        q = l2norm(q.reshape(b, n, self.k_heads, self.dk)).repeat_interleave(rep, dim=2).transpose(1, 2)
        k = l2norm(k.reshape(b, n, self.k_heads, self.dk)).repeat_interleave(rep, dim=2).transpose(1, 2)
        q = q * self.dk ** -0.5
        v = v.reshape(b, n, self.n_heads, self.dv).transpose(1, 2)
        beta = torch.sigmoid(self.w_b(x).float()).transpose(1, 2)
        if self.beta_scale != 1.0:
            beta = beta * self.beta_scale
        g = (-self.A_log.float().exp() * F.softplus(self.w_a(x).float() + self.dt_bias.float())).transpose(1, 2)
        return q, k, v, g, beta

    def forward(self, x, rec: Rec = None, cache: Optional[dict] = None):
        b, n, _ = x.shape
        heads = self.run_rule(x, rec, cache)  # (B, H, n, d_v)
        y = self.head_norm(heads)
        z = self.w_z(x).float().view(b, n, self.n_heads, self.dv).transpose(1, 2)
        y = (y * F.silu(z)).transpose(1, 2).reshape(b, n, self.value_dim).to(x.dtype)
        return point(rec, "out", self.w_out(y))
