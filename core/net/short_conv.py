"""LFM2's short gated convolution, the token mixer: a causal depthwise convolution of K taps
between two input-dependent gates.

    B, C, x = split(x_in W_in)          # three d-wide projections, in that order
    u_t     = B_t * x_t                 # the input gate, channel by channel
    y_t     = C_t * sum_{j<K} w_j * u_{t-j}   # the depthwise filter w (d x K), then the output gate
    out     = y W_out

Each channel c mixes positions by C_t[c] w_c[t - s] B_s[c] for t - K < s <= t: a band of K
positions, one map per channel (d of them), with no heads to share it. So the layer has no
head map: it records its filter (d x K, the taps in time order, the last tap weighing the
current position) and its output, and says what it is (`kind`).

Without a cache the whole sequence is convolved at once; with a cache dict (the recurrent
form of generation) the K-1 last gated inputs are kept ("conv", B x d x K-1) and go first.
The parameters keep transformers' names (in_proj, conv, out_proj).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn as nn

from .hooks import point
from .linear import Linear
from .mixer import Mixer
from .recorder import Rec


@dataclass(frozen=True)
class ShortConvSpec:
    """d_model channels, a filter of `kernel` taps; `bias` on the projections and the conv."""

    d_model: int
    kernel: int = 3
    bias: bool = False

    @classmethod
    def from_config(cls, cfg) -> "ShortConvSpec":
        """From a ModelConfig: d_model, and cfg.mixer = {"kind": "short_conv", "conv" (3), "bias" (False)}."""
        m = dict(cfg.mixer or {})
        return cls(d_model=int(cfg.d_model), kernel=int(m.get("conv", 3)), bias=bool(m.get("bias", False)))

    def __post_init__(self):
        for field in ("d_model", "kernel"):
            if int(getattr(self, field)) < 1:
                raise ValueError(f"ShortConvSpec.{field} must be a positive integer, got {getattr(self, field)!r}")


NO_MAP = ("a short convolution has no head map: each of its d channels mixes the last K positions "
          "with its own filter and gates, so it records its filter (d x K) instead")


class ShortConvMixer(Mixer):
    """forward(x (B, n, d), rec=None, cache=None) -> (B, n, d). Built from a ShortConvSpec or
    a ModelConfig whose `mixer` holds the kind's settings (ShortConvSpec.from_config)."""

    kind = "short_conv"
    n_heads = 0  # no head map

    def __init__(self, cfg, index: int = 0):
        super().__init__()
        spec = cfg if isinstance(cfg, ShortConvSpec) else ShortConvSpec.from_config(cfg)
        self.spec = spec
        d = spec.d_model
        self.in_proj = Linear(d, 3 * d, bias=spec.bias)
        self.conv = nn.Conv1d(d, d, spec.kernel, groups=d, bias=spec.bias)
        self.out_proj = Linear(d, d, bias=spec.bias)

    def recorded_names(self):
        return ["filter", "out"]

    def state_shapes(self):
        """The fixed-size state a cache keeps per sequence: the last K-1 gated inputs."""
        return {"conv": (self.spec.d_model, self.spec.kernel - 1)}

    def weights(self, x: torch.Tensor) -> torch.Tensor:
        raise ValueError(NO_MAP)

    def filter(self) -> torch.Tensor:
        """The depthwise filter, (d, K): channel c's taps, the last one on the current position."""
        return self.conv.weight[:, 0, :]

    def forward(self, x: torch.Tensor, rec: Rec = None, cache: Optional[dict] = None) -> torch.Tensor:
        k = self.spec.kernel
        gate_in, gate_out, xs = self.in_proj(x).chunk(3, dim=-1)  # B, C, x: (b, n, d) each
        u = (gate_in * xs).transpose(1, 2)  # (b, d, n)
        past = None if cache is None else cache.get("conv")
        if past is None:
            past = u.new_zeros(u.shape[0], u.shape[1], k - 1)
        full = torch.cat([past, u], dim=-1)  # (b, d, K-1+n)
        if cache is not None:
            cache["conv"] = full[..., full.shape[-1] - (k - 1):]
        y = gate_out * self.conv(full).transpose(1, 2)  # (b, n, d)
        if rec is not None:
            rec("filter", self.filter(), batched=False)
        return point(rec, "out", self.out_proj(y))
