"""Kimi Delta Attention (KDA, Kimi Linear): the gated delta rule with a decay per key channel,
in float32, in the chunked and the recurrent form (core/net/mixer.py: the interface; the rule
itself is core/net/gated_delta.py's chunked_rule / recurrent_rule with g of H x n x d_k).

From the layer's normed input x (n x d), per position t and head h (H heads, one head count,
d_k = d_v = d):
    [q | k | v] = SiLU(causal depthwise conv1d([x W_q | x W_k | x W_v]))   width `conv`, no bias
    q, k        each head L2-normed (x / sqrt(|x|^2 + 1e-6)), q times d^-1/2
    g_t         = -exp(A_log_h) softplus(x W_fa W_fb + dt_bias)   the log decay per channel (H x d),
                  W_fa d -> d_k and W_fb d_k -> H d a low-rank pair, dt_bias per channel, A_log per head
    beta_t      = sigmoid(x W_b)                                 the write strength (H)
    S_t         = (I - beta_t k_t k_t^T) diag(exp(g_t)) S_{t-1} + beta_t k_t v_t^T      (d x d)
    heads_t     = S_t^T q_t                                      recorded `.heads`
    out         = (RMSNorm(heads_t) * w * sigmoid(x W_ga W_gb)) W_out   the gated norm per head,
                  its gate low-rank (W_ga d -> d_k, W_gb d_k -> H d) and a sigmoid

Recorded as every gated delta rule's (q, k, v, beta, weights, heads, out), except that `.decay`
is H x n x d_k here: g_t per key channel. The exact implicit attention (`.weights`) is
    A[t, s] = beta_s k_s . P_{s+1}^T ... P_t^T q_t,   P_r^T = diag(exp(g_r)) (I - beta_r k_r k_r^T)
computed as the chunked rule's output on the n unit values: signed, lower-triangular.
With a cache dict the layer keeps the convolution's last conv - 1 inputs ("conv") and S
("state"): one new position is the recurrent form, several the chunked form from the kept state.
"""

from __future__ import annotations

import math
from typing import Dict, Optional, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F

from .config import ModelConfig
from .gated_delta import DeltaRuleMixer, l2norm
from .hooks import point
from .linear import Linear
from .recorder import Rec


class KimiDeltaAttention(DeltaRuleMixer):
    kind = "kimi_delta"

    def __init__(self, cfg: ModelConfig, index: int = 0):
        super().__init__()
        m = cfg.mixer
        d = cfg.d_model
        self.n_heads, self.dk, self.width = int(m["heads"]), int(m["d_k"]), int(m["conv"])
        if int(m.get("d_v", self.dk)) != self.dk:
            raise ValueError(f"kimi_delta: d_v ({m['d_v']}) must equal d_k ({self.dk}): one head size")
        self.dv = self.dk
        # the chunked form's pairwise per-channel decay costs n C d_k: C = 16 runs ~2.5x faster than
        # 64 at d_k 64 (n 512-1024, one CPU thread), where Gated DeltaNet's scalar decay prefers 64
        self.chunk = int(m.get("chunk", 16))
        self.map_chunk = self.chunk
        self.eps = float(m.get("norm_eps", cfg.norm_eps))
        self.dim = self.n_heads * self.dk
        self.w_q = Linear(d, self.dim, bias=False)
        self.w_k = Linear(d, self.dim, bias=False)
        self.w_v = Linear(d, self.dim, bias=False)
        bound = 1.0 / math.sqrt(self.width)
        self.conv = nn.Parameter(torch.empty(3 * self.dim, self.width).uniform_(-bound, bound))  # depthwise filters
        self.w_fa = Linear(d, self.dk, bias=False)  # the forget gate, low rank
        self.w_fb = Linear(self.dk, self.dim, bias=False)
        self.A_log = nn.Parameter(torch.empty(self.n_heads).uniform_(1, 16).log())
        self.dt_bias = nn.Parameter(torch.full((self.dim,), math.log(math.expm1(0.01))))  # softplus^-1(0.01)
        self.w_b = Linear(d, self.n_heads, bias=False)
        self.w_ga = Linear(d, self.dk, bias=False)  # the output gate, low rank
        self.w_gb = Linear(self.dk, self.dim, bias=False)
        self.norm_weight = nn.Parameter(torch.ones(self.dk))  # the gated RMSNorm's gain
        self.w_out = Linear(self.dim, d, bias=False)

    def state_shapes(self) -> Dict[str, Tuple[int, ...]]:
        return {"conv": (3 * self.dim, self.width - 1), "state": (self.n_heads, self.dk, self.dv)}

    def decay(self, x) -> torch.Tensor:
        """g (B, H, n, d_k) from x (B, n, d): -exp(A_log) softplus(x W_fa W_fb + dt_bias), float32."""
        b, n, _ = x.shape
        f = self.w_fb(self.w_fa(x)).float() + self.dt_bias.float()
        g = -self.A_log.float().exp()[:, None] * F.softplus(f.view(b, n, self.n_heads, self.dk))
        return g.transpose(1, 2)

    def rule_inputs(self, x, cache: Optional[dict] = None):
        """(q, k, v, g, beta) as the rule reads them from x (B, n, d): q, k, v (B, H, n, d_k),
        g (B, H, n, d_k), beta (B, H, n), all float32. With a cache, the convolution continues
        from cache["conv"] and leaves its last inputs there."""
        b, n, _ = x.shape
        mixed = torch.cat([self.w_q(x), self.w_k(x), self.w_v(x)], dim=-1).float().transpose(1, 2)  # (B, C, n)
        conv = self.short_conv(mixed, cache)  # (B, C, n)
        q, k, v = (t.reshape(b, n, self.n_heads, self.dk).transpose(1, 2)
                   for t in torch.split(conv.transpose(1, 2), [self.dim] * 3, dim=-1))
        q = l2norm(q) * self.dk ** -0.5
        k = l2norm(k)
        beta = torch.sigmoid(self.w_b(x).float()).transpose(1, 2)
        return q, k, v, self.decay(x), beta

    def forward(self, x, rec: Rec = None, cache: Optional[dict] = None):
        b, n, _ = x.shape
        heads = self.run_rule(x, rec, cache)  # (B, H, n, d)
        y = self.head_norm(heads)
        gate = self.w_gb(self.w_ga(x)).float().view(b, n, self.n_heads, self.dk).transpose(1, 2)
        y = (y * torch.sigmoid(gate)).transpose(1, 2).reshape(b, n, self.dim).to(x.dtype)
        return point(rec, "out", self.w_out(y))
