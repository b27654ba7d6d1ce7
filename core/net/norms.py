"""RMSNorm, shared by the layer (core/net/layers.py) and the attention's QK-norm
(core/net/multihead.py)."""

from __future__ import annotations

import torch
import torch.nn as nn


class RMSNorm(nn.Module):
    """x / sqrt(mean(x^2) + eps) * g (Zhang & Sennrich 2019); gain=False: no g (Llama 4's
    L2 norm of q and k)."""

    def __init__(self, d: int, eps: float, gain: bool = True):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d)) if gain else None
        self.eps = eps

    def forward(self, x):
        y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return y if self.weight is None else y * self.weight
