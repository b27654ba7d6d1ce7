"""Mamba2 (Dao & Gu 2024), the token mixer, in float32: a selective state space whose scan
is, exactly, a masked attention with no softmax.

One layer, per head h (P channels of x), with a state S (P x N) per head:

    z, xBC, dt = split(x_in W_in)                      # gate, conv input, one step size per head
    x, B, C    = split(silu(causal depthwise conv(xBC)))  # B and C: one per group, shared by H/G heads
    dt_t       = clamp(softplus(dt_t + dt_bias))       # the step of position t, per head
    a_h        = -exp(A_log_h)                         # the head's (negative) rate
    S_t        = exp(dt_t a_h) S_{t-1} + dt_t x_t B_t^T
    y_t        = S_t C_t + D_h x_t                     # heads; then RMSNorm(y * silu(z)) per group (GATES), W_out

Unrolled, y_t = sum_{s<=t} A[t, s] x_s + D_h x_t with the implicit attention

    A[h, t, s] = (C_t . B_s) exp(sum_{r=s+1..t} dt_r a_h) dt_s     (s <= t; 0 above the diagonal)

`implicit_attention` computes it on demand in O(n^2 N) per head, exact to float32: the decay
products are sums of log decays taken by a masked cumulative sum (`segsum`), never the
difference of two long running sums.

The scan runs in one of two forms that give the same numbers up to float rounding
(tests/parity/test_mamba2_mixer.py measures the gap):
- chunked (`ssd_chunked`, the default): within a chunk of L positions the masked attention
  above, between chunks the state carried forward, O(n L N) per head;
- recurrent (`ssd_step`, with a cache dict): one state update per position, the form of
  generation; the cache keeps the last K-1 conv inputs ("conv", B x channels x K-1) and the
  state ("ssm", B x H x P x N).

Recorded (under the layer's mixer scope, batch first): q = C and k = B per head (H x n x N,
each group's broadcast to its heads), v = x (H x n x P), decay = dt_t a_h (H x n), skip =
D_h x (H x n x P), heads = the scan's output with the skip, before the gated norm (H x n x P,
a hook point), out (n x d, a hook point). The parameters keep transformers' names (in_proj,
conv1d, dt_bias, A_log, D, norm.weight, out_proj), so a checkpoint's mixer loads as it is.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F

from .hooks import point
from .linear import Linear
from .mixer import Mixer
from .recorder import Rec, records_maps


# how the gate z meets the heads y before out_proj: Mamba2's RMSNorm(y * silu(z)) (per group);
# Falcon-H1's RMSNorm(y) * silu(z) (mamba_norm_before_gate), or y * silu(z) without a norm
# (mamba_rms_norm False: the mixer has no `norm` then)
GATES = ("gate_then_norm", "norm_then_gate", "gate_only")


@dataclass(frozen=True)
class Mamba2Spec:
    """A Mamba2 mixer's shape: d_model in and out; H heads of P channels (d_inner = H P);
    a state of N per head; G groups of B and C (H divisible by G); a conv of K taps."""

    d_model: int
    n_heads: int
    head_dim: int
    d_state: int
    n_groups: int = 1
    conv_kernel: int = 4
    chunk_size: int = 256
    eps: float = 1e-6
    bias: bool = False  # in_proj and out_proj
    conv_bias: bool = True
    dt_limit: Tuple[float, float] = (0.0, math.inf)
    gate: str = "gate_then_norm"  # how z gates the heads: see GATES

    @classmethod
    def from_config(cls, cfg) -> "Mamba2Spec":
        """From a ModelConfig: d_model and norm_eps, and cfg.mixer = {"kind": "mamba2", "heads",
        "head_dim", "d_state", "groups" (1), "conv" (4), "chunk" (256), "norm_eps" (cfg's),
        "bias" (False), "conv_bias" (True), "dt_limit" ([0, inf]), "gate" (GATES[0])}."""
        m = dict(cfg.mixer or {})
        missing = [key for key in ("heads", "head_dim", "d_state") if key not in m]
        if missing:
            raise ValueError(f"a mamba2 mixer needs {missing} in ModelConfig.mixer, got {sorted(m)}")
        lo, hi = m.get("dt_limit", (0.0, math.inf))
        return cls(d_model=int(cfg.d_model), n_heads=int(m["heads"]), head_dim=int(m["head_dim"]),
                   d_state=int(m["d_state"]), n_groups=int(m.get("groups", 1)), conv_kernel=int(m.get("conv", 4)),
                   chunk_size=int(m.get("chunk", 256)), eps=float(m.get("norm_eps", cfg.norm_eps)),
                   bias=bool(m.get("bias", False)), conv_bias=bool(m.get("conv_bias", True)),
                   dt_limit=(float(lo), float(hi)), gate=str(m.get("gate", "gate_then_norm")))

    def __post_init__(self):
        for field in ("d_model", "n_heads", "head_dim", "d_state", "n_groups", "conv_kernel", "chunk_size"):
            if int(getattr(self, field)) < 1:
                raise ValueError(f"Mamba2Spec.{field} must be a positive integer, got {getattr(self, field)!r}")
        if self.gate not in GATES:
            raise ValueError(f"Mamba2Spec.gate must be one of {GATES}, got {self.gate!r}")
        if self.n_heads % self.n_groups:
            raise ValueError(f"Mamba2Spec: n_heads ({self.n_heads}) must be a multiple of n_groups ({self.n_groups})")

    @property
    def d_inner(self) -> int:
        return self.n_heads * self.head_dim

    @property
    def conv_dim(self) -> int:
        return self.d_inner + 2 * self.n_groups * self.d_state


def segsum(a: torch.Tensor) -> torch.Tensor:
    """(..., n) -> (..., n, n): out[t, s] = sum_{r=s+1..t} a_r for s <= t (0 on the diagonal),
    -inf above it. Each entry is its own masked cumulative sum, so a long run of decays never
    cancels against another (exp of it is the decay from s to t, and 0 where s > t)."""
    n = a.shape[-1]
    terms = a[..., :, None].expand(*a.shape, n)  # [r, s] = a_r, (..., n, n)
    below = torch.ones(n, n, dtype=torch.bool, device=a.device).tril(-1)  # r > s
    out = terms.masked_fill(~below, 0.0).cumsum(dim=-2)  # [t, s] = sum_{s<r<=t} a_r
    causal = torch.ones(n, n, dtype=torch.bool, device=a.device).tril()
    return out.masked_fill(~causal, -math.inf)


def implicit_attention(q: torch.Tensor, k: torch.Tensor, decay: torch.Tensor, dt: torch.Tensor,
                       shared: int = 1) -> torch.Tensor:
    """The scan as attention: A[t, s] = (q_t . k_s) exp(sum_{r=s+1..t} decay_r) dt_s for
    s <= t, 0 above the diagonal. q, k (..., n, N) (Mamba2's C and B), decay and dt (..., n)
    -> (..., n, n). heads = A @ v + skip. `shared`: how many consecutive maps (heads) have the
    same q and k (the heads of one group of B and C): their q k^T, the n x n x N product, is
    made once for them."""
    if q.shape != k.shape or q.shape[:-1] != decay.shape or decay.shape != dt.shape:
        raise ValueError(f"implicit_attention: q {tuple(q.shape)} and k {tuple(k.shape)} must be (..., n, N), "
                         f"decay {tuple(decay.shape)} and dt {tuple(dt.shape)} (..., n)")
    n = q.shape[-2]
    lead = q.shape[:-2]
    qs, ks = q.reshape(-1, n, q.shape[-1]), k.reshape(-1, n, k.shape[-1])
    ds, ts = decay.reshape(-1, n), dt.reshape(-1, n)
    maps = []
    for m in range(qs.shape[0]):  # one map at a time: its n x n temporaries, never H of them at once
        if m % shared == 0:
            scores = qs[m] @ ks[m].T  # (n, n): C_t . B_s, the same for the group's heads
        maps.append(scores * torch.exp(segsum(ds[m])) * ts[m][None, :])
    return torch.stack(maps).view(*lead, n, n)


def ssd_chunked(x, dt, a, B, C, chunk: int, state: Optional[torch.Tensor] = None):
    """The scan, chunk by chunk. x (b, n, H, P), dt (b, n, H), a (H,), B and C (b, n, H, N);
    state (b, H, P, N) or None (zeros). Returns y (b, n, H, P) without the D skip, and the
    state after the last position."""
    b, n, h, p = x.shape
    pad = (-n) % chunk
    if pad:  # zero steps at the end: no input, no decay, outputs cut off below
        x, B, C = (F.pad(t, (0, 0, 0, 0, 0, pad)) for t in (x, B, C))
        dt = F.pad(dt, (0, 0, 0, pad))
    c = (n + pad) // chunk
    xs = (x * dt[..., None]).reshape(b, c, chunk, h, p)  # dt_s x_s
    Bs, Cs = B.reshape(b, c, chunk, h, -1), C.reshape(b, c, chunk, h, -1)
    loga = (dt * a).view(b, c, chunk, h).permute(0, 3, 1, 2)  # (b, H, c, L): log decay per step
    cum = loga.cumsum(-1)  # (b, H, c, L): log decay from the chunk's start through l

    # within a chunk: the masked attention, (b, c, l, s, H)
    decay_ls = torch.exp(segsum(loga)).permute(0, 2, 3, 4, 1)
    scores = torch.einsum("bclhn,bcshn->bclsh", Cs, Bs)
    y = torch.einsum("bclsh,bcshp->bclhp", scores * decay_ls, xs)

    # what each chunk adds to the state by its end, (b, c, H, P, N)
    to_end = torch.exp(cum[..., -1:] - cum).permute(0, 2, 3, 1)  # (b, c, L, H)
    adds = torch.einsum("bclhn,bclhp->bchpn", Bs * to_end[..., None], xs)

    # between chunks: the state entering each chunk, carried forward
    s = x.new_zeros(b, h, p, Bs.shape[-1]) if state is None else state.to(x.dtype)
    chunk_decay = torch.exp(cum[..., -1])  # (b, H, c)
    starts = []
    for i in range(c):
        starts.append(s)
        s = chunk_decay[:, :, i, None, None] * s + adds[:, i]
    entering = torch.stack(starts, dim=1)  # (b, c, H, P, N)
    from_start = torch.exp(cum).permute(0, 2, 3, 1)  # (b, c, L, H): decay from the chunk's start
    y = y + torch.einsum("bclhn,bchpn->bclhp", Cs, entering) * from_start[..., None]
    return y.reshape(b, c * chunk, h, p)[:, :n], s


def ssd_step(x, dt, a, B, C, state: torch.Tensor):
    """One position of the scan. x (b, H, P), dt (b, H), a (H,), B and C (b, H, N), state
    (b, H, P, N). Returns y (b, H, P) without the D skip, and the new state."""
    state = torch.exp(dt * a)[..., None, None] * state + (dt[..., None] * x)[..., None] * B[:, :, None, :]
    return state @ C[..., None], state  # y: (b, H, P, 1) -> squeezed by the caller


def ssd_recurrent(x, dt, a, B, C, state: Optional[torch.Tensor] = None):
    """The scan one position at a time (ssd_step over the sequence): the same arguments and
    results as ssd_chunked."""
    b, n, h, p = x.shape
    s = x.new_zeros(b, h, p, B.shape[-1]) if state is None else state.to(x.dtype)
    ys = []
    for t in range(n):
        y, s = ssd_step(x[:, t], dt[:, t], a, B[:, t], C[:, t], s)
        ys.append(y[..., 0])
    return torch.stack(ys, dim=1), s


def group_rms_norm(y: torch.Tensor, weight: torch.Tensor, groups: int, eps: float) -> torch.Tensor:
    """y RMS-normed over each of `groups` equal slices of the last axis, times weight."""
    parts = y.view(*y.shape[:-1], groups, y.shape[-1] // groups)
    parts = parts * torch.rsqrt(parts.pow(2).mean(-1, keepdim=True) + eps)
    return parts.view(y.shape) * weight


def gated_rms_norm(y: torch.Tensor, z: torch.Tensor, weight: torch.Tensor, groups: int, eps: float,
                   gate: str = GATES[0]) -> torch.Tensor:
    """The mixer's output gate and norm (GATES): Mamba2's group_rms_norm(y * silu(z)), or
    group_rms_norm(y) * silu(z), or y * silu(z) alone (weight None)."""
    if gate == "gate_then_norm":
        return group_rms_norm(y * F.silu(z), weight, groups, eps)
    if gate == "norm_then_gate":
        return group_rms_norm(y, weight, groups, eps) * F.silu(z)
    return y * F.silu(z)


class GatedRMSNorm(nn.Module):
    """gated_rms_norm with its gain (`weight`, d_inner), as a module (the checkpoint's `norm`)."""

    def __init__(self, d: int, groups: int, eps: float, gate: str = GATES[0]):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
        self.groups, self.eps, self.gate = groups, eps, gate

    def forward(self, y, z):
        return gated_rms_norm(y, z, self.weight, self.groups, self.eps, self.gate)


class Mamba2Mixer(Mixer):
    """The Mamba2 token mixer: forward(x (B, n, d), rec=None, cache=None) -> (B, n, d).
    With a cache dict the recurrent form runs and the dict keeps its state (filled on first
    use); otherwise the chunked form. Built from a Mamba2Spec, or from a ModelConfig whose
    `mixer` holds the kind's settings (Mamba2Spec.from_config)."""

    kind = "mamba2"

    def __init__(self, cfg, index: int = 0):
        super().__init__()
        s = cfg if isinstance(cfg, Mamba2Spec) else Mamba2Spec.from_config(cfg)
        self.spec = s
        self.n_heads = s.n_heads
        self.per_group = s.n_heads // s.n_groups  # consecutive heads that read one group's B and C
        self.in_proj = Linear(s.d_model, s.d_inner + s.conv_dim + s.n_heads, bias=s.bias)
        self.conv1d = nn.Conv1d(s.conv_dim, s.conv_dim, s.conv_kernel, groups=s.conv_dim, bias=s.conv_bias)
        self.dt_bias = nn.Parameter(torch.zeros(s.n_heads))
        self.A_log = nn.Parameter(torch.zeros(s.n_heads))
        self.D = nn.Parameter(torch.ones(s.n_heads))
        # the gated norm (its gain is the checkpoint's norm.weight); gate_only: no norm, no gain
        self.norm = GatedRMSNorm(s.d_inner, s.n_groups, s.eps, s.gate) if s.gate != "gate_only" else None
        self.out_proj = Linear(s.d_inner, s.d_model, bias=s.bias)

    def recorded_names(self):
        """What a recorded pass keeps under the mixer, in order (weights: under a maps recorder)."""
        return ["q", "k", "v", "decay", "weights", "skip", "heads", "out"]

    def state_shapes(self):
        """The fixed-size state a cache keeps per sequence: the conv's last inputs and the scan's state."""
        s = self.spec
        return {"conv": (s.conv_dim, s.conv_kernel - 1), "ssm": (s.n_heads, s.head_dim, s.d_state)}

    def rate(self) -> torch.Tensor:
        """a_h = -exp(A_log_h), (H,): each head's decay per unit of dt."""
        return -torch.exp(self.A_log.float())

    def _conv(self, xbc: torch.Tensor, cache: Optional[dict]) -> torch.Tensor:
        """silu(causal depthwise conv) of xbc (b, n, channels). With a cache: the K-1 inputs
        it keeps go first, and it keeps the last K-1 after."""
        k = self.spec.conv_kernel
        seq = xbc.transpose(1, 2)  # (b, channels, n)
        past = None if cache is None else cache.get("conv")
        if past is None:
            past = seq.new_zeros(seq.shape[0], seq.shape[1], k - 1)
        full = torch.cat([past, seq], dim=-1)  # (b, channels, K-1+n)
        if cache is not None:
            cache["conv"] = full[..., full.shape[-1] - (k - 1):]
        return F.silu(self.conv1d(full)).transpose(1, 2)  # (b, n, channels)

    def scan_inputs(self, x: torch.Tensor, cache: Optional[dict] = None):
        """(z, x, dt, B, C) as the scan reads them from the input (b, n, d): the gate z (b, n,
        d_inner), x (b, n, H, P), dt (b, n, H), and B, C (b, n, H, N), each group's broadcast
        to its heads. With a cache the conv continues from it and leaves its last inputs there."""
        s = self.spec
        b, n, _ = x.shape
        h, g, N = s.n_heads, s.n_groups, s.d_state
        z, xbc, dt = self.in_proj(x).split([s.d_inner, s.conv_dim, h], dim=-1)
        xs, Bg, Cg = self._conv(xbc, cache).split([s.d_inner, g * N, g * N], dim=-1)
        dt = F.softplus(dt + self.dt_bias).clamp(*s.dt_limit)  # (b, n, H)
        Bh = Bg.view(b, n, g, N).repeat_interleave(h // g, dim=2)  # (b, n, H, N): group -> its heads
        Ch = Cg.view(b, n, g, N).repeat_interleave(h // g, dim=2)
        return z, xs.view(b, n, h, s.head_dim), dt, Bh, Ch

    def forward(self, x: torch.Tensor, rec: Rec = None, cache: Optional[dict] = None) -> torch.Tensor:
        s = self.spec
        b, n, _ = x.shape
        z, xs, dt, Bh, Ch = self.scan_inputs(x, cache)
        a = self.rate()
        if rec is not None:
            q, k, decay = Ch.transpose(1, 2), Bh.transpose(1, 2), (dt * a).transpose(1, 2)  # (b, H, n, N), (b, H, n)
            rec("q", q)
            rec("k", k)
            rec("v", xs.transpose(1, 2))  # (b, H, n, P)
            rec("decay", decay)
            if records_maps(rec):
                rec("weights", implicit_attention(q, k, decay, dt.transpose(1, 2), self.per_group))
        if cache is None:
            y, _ = ssd_chunked(xs, dt, a, Bh, Ch, s.chunk_size)
        else:
            y, cache["ssm"] = ssd_recurrent(xs, dt, a, Bh, Ch, cache.get("ssm"))
        skip = self.D[:, None] * xs  # (b, n, H, P)
        if rec is not None:
            rec("skip", skip.transpose(1, 2))
        heads = point(rec, "heads", (y + skip).transpose(1, 2))  # (b, H, n, P)
        y = heads.transpose(1, 2).reshape(b, n, s.d_inner)
        mixed = y * F.silu(z) if self.norm is None else self.norm(y, z)
        return point(rec, "out", self.out_proj(mixed))

    def weights(self, x: torch.Tensor) -> torch.Tensor:
        """The implicit attention of the input x (b, n, d): (b, H, n, n)."""
        _, _, dt, Bh, Ch = self.scan_inputs(x)
        decay = (dt * self.rate()).transpose(1, 2)
        return implicit_attention(Ch.transpose(1, 2), Bh.transpose(1, 2), decay, dt.transpose(1, 2), self.per_group)

    def weights_from(self, q: torch.Tensor, k: torch.Tensor, decay: torch.Tensor,
                     head: Optional[int] = None) -> torch.Tensor:
        """The implicit attention from what a pass recorded: q, k (H, n, N) and decay (H, n)
        (or batched, heads on axis -3 / -2) -> (H, n, n); `head`: that head's (n, n) alone,
        O(n^2 N). dt_s = decay_s / a_h (a_h < 0, never 0)."""
        a = self.rate()
        if head is not None:
            if not 0 <= head < self.spec.n_heads:
                raise ValueError(f"head {head} is out of range: this Mamba2 layer has {self.spec.n_heads} heads")
            q, k, decay, a = q[..., head, :, :], k[..., head, :, :], decay[..., head, :], a[head]
            return implicit_attention(q, k, decay, decay / a)
        return implicit_attention(q, k, decay, decay / a[:, None], self.per_group)
