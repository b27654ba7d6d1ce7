"""One head's attention map, a tile of query rows at a time: what long inputs read.

At 8,192 tokens one head's map is 64 M cells (256 MB of float32) and a layer's nine heads
of SmolLM2 2.4 GB per map kind, so a long input is never read a layer at a time. This
module computes a self-attention map from the layer's stored input (core/trace.py) for ONE
head, TILE_ROWS query rows at a time, through the network's own functions, restricted to one
head and a tile of rows:

    q_h = head_proj(Norm(x), "q", h)   k_g = head_proj(Norm(x), "k", g)   (projection, QK-norm, RoPE)
    map = head_map(q_h[rows], k_g, M)                                    (scale, soft-cap, mask, softmax)

with g the key/value head h reads (grouped-query), Norm(x) what the layer's attention reads
(Layer.attn_input), the RoPE angles of this layer's own base and M the tile of the layer's
mask (Transformer.attn_spec: look-ahead, this layer's window or global kind, ModernBERT's
symmetric window, key padding). No formula is written here (core/net/attention.py holds it).
Nothing larger than one head's tile (rows x n_k) and the layer's O(n d) input is ever
allocated (tests/core/test_head_maps.py measures it); tests/parity/test_one_formula.py holds every family
the loaders accept to the full map.

    LayerMaps(trace, stack, i).head(h, "weights")        # one head's n_q x n_k map
    LayerMaps(trace, stack, i).pooled(h, "weights", 128) # its 128 x 128 block means
    layer_summary(trace, stack, i, size)                 # every head: block means + profile

`pooled` (the contract of docs/design.md, "Long inputs"): block means of size x size cells;
a cell masked to -inf counts as 0 in `weights` (its weight is 0) and is left out of the
means of `scores`, `scaled` and `masked` (a block with no allowed cell is -inf, as
viz.figures.reduce.block_means has it). `profile`: per head, from the same tiles, the mean attention
distance sum_j a_ij |i - j|, the mass on the first token a_i0, the mass within the last
LOCAL tokens (|i - j| < LOCAL), the mean row entropy (bits), and the mean weight on the
previous token and on itself (viz.figures.model_view, head profiles, core.analysis.head_scoring).

Tiling applies to self-attention with no relative position bias (every decoder and encoder
here but T5's); cross-attention and T5's self-attention fall back to the layer's full map
(their inputs are short: T5 and Marian read 512 tokens).
"""

from __future__ import annotations

import math
import threading
import weakref
from typing import Dict, Iterator, List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F

from . import trace_names as tn

TILE_ROWS = 128  # query rows computed at once (a tile is TILE_ROWS x n_k floats of one head)
LONG_LAYER_BYTES = 32 * 2**20  # a layer's H maps above this: views read pooled maps, not full ones
LOCAL = 64  # "local" mass: keys within this many positions of the query
MAPS = ("scores", "scaled", "capped", "masked", "weights")
UNMASKED = ("scores", "scaled", "capped")  # steps before the mask: finite in every cell
PROFILE = ("distance", "first", "local", "entropy", "previous", "self", "first_later")


def split_name(name: str) -> Tuple[str, int, str, str]:
    """'decoder.3.self_attn.weights' -> ('decoder', 3, 'self_attn', 'weights')."""
    parts = name.split(".")
    if len(parts) != 4 or parts[0] not in ("encoder", "decoder") or not parts[1].isdigit():
        raise KeyError(f"{name!r} is not an attention map name ({{stack}}.{{i}}.{{attn}}.{{map}})")
    return parts[0], int(parts[1]), parts[2], parts[3]


def long_layer(trace, stack: str, kind: str = "self_attn") -> bool:
    """Whether one layer's H maps of (stack, kind) exceed LONG_LAYER_BYTES and tile: views then
    read pooled maps, profiles and blocks (one head and tile at a time), never whole layers."""
    side = "source" if stack == "encoder" else "target"
    n = len(trace.tokens(side)) or len(trace.tokens("source"))
    return tileable(trace, stack, kind) and trace.n_heads(stack) * n * n * 4 > LONG_LAYER_BYTES


def tileable(trace, stack: str, kind: str) -> bool:
    """Whether maps of (stack, kind) are computed here one head and tile at a time (else the
    layer's full map is read and sliced)."""
    model = trace.model
    return kind == "self_attn" and model is not None and model.net.cfg.positional != "relative"


def block_sums(v: torch.Tensor, size: int) -> torch.Tensor:
    """Sums of consecutive blocks of `size` along the last axis (the last block may be short)."""
    n = v.shape[-1]
    pad = -n % size
    if pad:
        v = F.pad(v, (0, pad))
    return v.reshape(*v.shape[:-1], -1, size).sum(-1)


class LayerMaps:
    """The self-attention maps of layer i of a trace's stack, one head and a tile at a time.

    Holds what the layer's attention reads of its input (n x d) and one head's q / each kv
    head's k (n x d_k) once computed; no n x n tensor. Every rule comes from the network:
    the layer's AttnSpec (mask, window, RoPE base: Transformer.attn_spec), its input norm
    (Layer.attn_input), a head's q and k (MultiHeadAttention.head_proj: projection, QK-norm,
    RoPE) and the map itself (MultiHeadAttention.head_map: scale, soft-cap, mask, softmax)."""

    def __init__(self, trace, stack: str, i: int):
        runner, model = trace.runner, trace.model
        if model is None:
            raise KeyError(f"{stack}.{i} has no model to recompute it")
        self.net = model.net
        self.dev = model.device
        self.stack, self.i = stack, i
        layer = self.net.layers(stack)[i]
        self.attn = layer.self_attn
        self.spec = self.net.attn_spec(stack, i)
        with torch.inference_mode():
            x = trace.layer_input(stack, i).to(self.dev)  # a step view: its first rows
            self.y = layer.attn_input(x)  # (n, d)
            n = self.y.shape[0]
            self.n = n
            self.angles = self.net._angles(n, device=self.dev, layer=i)
        self.causal = self.spec.causal
        self.window = self.spec.window
        pad = runner.src_pad if stack == "encoder" else None
        self.pad = None if pad is None else pad.reshape(-1)[:n].to(self.dev)  # True at padding keys
        self._q: Dict[int, torch.Tensor] = {}
        self._k: Dict[int, torch.Tensor] = {}

    @property
    def n_heads(self) -> int:
        return self.attn.h

    @torch.inference_mode()
    def q(self, h: int) -> torch.Tensor:
        if h not in self._q:
            self._q = {h: self.attn.head_proj(self.y, "q", h, self.angles)}  # one head's q at a time
        return self._q[h]

    @torch.inference_mode()
    def k(self, h: int) -> torch.Tensor:
        g = self.attn.kv_head(h)
        if g not in self._k:
            self._k[g] = self.attn.head_proj(self.y, "k", g, self.angles)
        return self._k[g]

    def mask_rows(self, r0: int, r1: int, c0: int = 0, c1: Optional[int] = None) -> Optional[torch.Tensor]:
        """True where query r (r0 <= r < r1) may NOT look at key j (c0 <= j < c1): the tile of
        the layer's mask (AttnSpec.forbidden)."""
        c1 = self.n if c1 is None else c1
        pad = None if self.pad is None else self.pad[c0:c1]
        return self.spec.forbidden(torch.arange(r0, r1, device=self.dev), torch.arange(c0, c1, device=self.dev), pad)

    def key_range(self, r0: int, r1: int) -> Tuple[int, int]:
        """The keys any of the queries r0..r1-1 may see (AttnSpec.key_range): the other cells
        are masked, weight 0."""
        return self.spec.key_range(r0, r1, self.n)

    @torch.inference_mode()
    def narrow(self, h: int, r0: int, r1: int, what: str = "weights"):
        """(rows r0:r1 of head h's map `what` over the keys c0:c1 of key_range, their mask of
        forbidden cells or None, c0, c1): the cells outside are all masked."""
        if what not in MAPS:
            raise KeyError(f"{what!r} is not one of {MAPS}")
        c0, c1 = self.key_range(r0, r1)
        off = self.mask_rows(r0, r1, c0, c1)
        t = self.attn.head_map(self.q(h)[r0:r1], self.k(h)[c0:c1], off, what, head=h, row0=r0)
        return t, off, c0, c1

    @torch.inference_mode()
    def tile(self, h: int, r0: int, r1: int, what: str = "weights"):
        """(rows r0:r1 of head h's map `what` over every key, the tile's mask of forbidden cells or None)."""
        if what in UNMASKED:  # finite everywhere, as the explicit path has them
            return self.attn.head_map(self.q(h)[r0:r1], self.k(h), None, what, head=h, row0=r0), self.mask_rows(r0, r1)
        t, _, c0, c1 = self.narrow(h, r0, r1, what)
        if (c0, c1) != (0, self.n):
            full = torch.full((r1 - r0, self.n), float("-inf") if what == "masked" else 0.0, dtype=t.dtype)
            full[:, c0:c1] = t
            t = full
        return t, self.mask_rows(r0, r1)

    def tiles(self, h: int, what: str = "weights", rows: int = TILE_ROWS) -> Iterator[Tuple[int, int, torch.Tensor, Optional[torch.Tensor]]]:
        for r0 in range(0, self.n, rows):
            r1 = min(self.n, r0 + rows)
            t, off = self.tile(h, r0, r1, what)
            yield r0, r1, t, off

    def head(self, h: int, what: str = "weights") -> torch.Tensor:
        """Head h's whole n_q x n_k map (one head only), on the CPU."""
        out = torch.empty(self.n, self.n)
        for r0, r1, t, _ in self.tiles(h, what):
            out[r0:r1] = t
        return out

    def pooled(self, h: int, what: str = "weights", size: int = 128, profile: Optional[dict] = None) -> torch.Tensor:
        """ceil(n/size) x ceil(n/size) block means of head h's map (see the module docstring).
        profile: a dict that receives this head's PROFILE figures (weights only). Each tile
        covers only the keys its rows may see (key_range): the rest are masked."""
        n, size = self.n, max(1, int(size))
        nb = -(-n // size)
        rows = size * max(1, TILE_ROWS // size)  # whole blocks of rows per tile
        sums = torch.zeros(nb, nb, dtype=torch.float64)
        counts = torch.zeros(nb, nb, dtype=torch.float64) if what != "weights" else None
        acc = dict.fromkeys(PROFILE, 0.0) if profile is not None else None
        with torch.inference_mode():
            for r0 in range(0, n, rows):
                r1 = min(n, r0 + rows)
                t, off, c0, c1 = self.narrow(h, r0, r1, what)
                b0 = c0 // size  # c0 is 0, or not a block boundary: pad the tile back to one
                if c0 % size:
                    t = F.pad(t, (c0 % size, 0))
                    off = None if off is None else F.pad(off, (c0 % size, 0), value=True)
                rb = slice(r0 // size, -(-r1 // size))
                if what != "weights":
                    allowed = torch.ones_like(t, dtype=torch.bool) if off is None else ~off
                    t = t.masked_fill(~allowed, 0.0)
                    c = block_sums(allowed.to(torch.float32), size)  # (rows, key blocks): allowed cells
                    counts[rb, b0:b0 + c.shape[1]] += block_sums(c.T, size).T.double()
                s = block_sums(t, size)  # (rows, key blocks)
                sums[rb, b0:b0 + s.shape[1]] += block_sums(s.T, size).T.double()
                if acc is not None and what == "weights":
                    _profile_tile(acc, t, r0, r1, b0 * size, self.causal)
        if what == "weights":
            rq = torch.full((nb,), float(size), dtype=torch.float64)
            rq[-1] = n - size * (nb - 1)
            out = sums / (rq[:, None] * rq[None, :])
        else:
            out = torch.where(counts > 0, sums / counts.clamp_min(1), torch.tensor(float("-inf"), dtype=torch.float64))
        if acc is not None:
            profile.update({k: v / max(1, n) for k, v in acc.items()})
            for k in ("previous", "first_later"):
                profile[k] = acc[k] / max(1, n - 1) if n > 1 else float("nan")
        return out.float()


def _profile_tile(acc: dict, w: torch.Tensor, r0: int, r1: int, c0: int = 0, causal: bool = False) -> None:
    """Add one weights tile's row sums of the PROFILE figures to acc: w holds rows r0:r1 over
    keys c0:c0 + w.shape[1] (every other key has weight 0). causal: no weight after the query."""
    n_k = w.shape[-1]
    qp = torch.arange(r0, r1, dtype=w.dtype)[:, None]
    kp = torch.arange(c0, c0 + n_k, dtype=w.dtype)
    if causal:  # every weight at j <= i: sum_j w_ij (i - j) = i sum_j w_ij - sum_j w_ij j
        acc["distance"] += float((qp[:, 0] * w.sum(1) - w @ kp).sum())
    else:
        acc["distance"] += float((w * (qp - kp[None, :]).abs_()).sum())
    lo, hi = max(c0, r0 - LOCAL + 1), min(c0 + n_k, r1 + (0 if causal else LOCAL - 1))  # the band |i - j| < LOCAL
    band = w[:, lo - c0:hi - c0]
    near = (qp - kp[None, lo - c0:hi - c0]).abs_() < LOCAL
    acc["local"] += float(band.masked_fill(~near, 0.0).sum())
    if c0 == 0:
        acc["first"] += float(w[:, 0].sum())
        acc["first_later"] += float(w[max(0, 1 - r0):, 0].sum())  # queries i >= 1 only
    acc["entropy"] += float(-torch.special.xlogy(w, w).sum() / math.log(2))
    rows = torch.arange(r0, r1)
    inside = (rows >= c0) & (rows < c0 + n_k)
    acc["self"] += float(w[(rows - r0)[inside], (rows - c0)[inside]].sum())
    prev = (rows >= 1) & (rows - 1 >= c0) & (rows - 1 < c0 + n_k)
    if prev.any():
        acc["previous"] += float(w[(rows - r0)[prev], (rows - 1 - c0)[prev]].sum())


# ------------------------------------------------------------------ through a trace
_DERIVED: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
_DERIVED_LOCK = threading.Lock()


def derived(trace) -> dict:
    """The one per-trace memo: results computed from a trace (head profiles, pooled tiles,
    surprisal, and the viewers' pooled maps, checks and lens tables), kept while the trace object
    lives and dropped with it; keyed by the object (each decoder step view has its own); not part
    of the trace's pickle. Values must not hold the trace itself (it would never be freed)."""
    with _DERIVED_LOCK:
        got = _DERIVED.get(trace)
        if got is None:
            got = _DERIVED[trace] = {}
        return got


def _memo(trace) -> dict:
    base = getattr(trace, "_base", None) or trace
    key = ("head_maps", getattr(trace, "_rows", None))
    return derived(base).setdefault(key, {})


def layer_maps(trace, stack: str, i: int) -> LayerMaps:
    """The LayerMaps of one layer, kept for the last layer asked (its q and k are O(n d))."""
    memo = _memo(trace)
    got = memo.get("layer")
    if got is None or (got.stack, got.i) != (stack, i):
        got = LayerMaps(trace, stack, i)
        memo["layer"] = got
    return got


def head_map(trace, name: str, h: int) -> torch.Tensor:
    """One head's n_q x n_k map `name` (scores / scaled / masked / weights), computing that
    head alone; from the stored or cached layer when it is there."""
    stack, i, kind, what = split_name(name)
    if trace.is_stored(name) or not tileable(trace, stack, kind) or what not in MAPS or _cached(trace, name):
        return trace[name][h]
    return layer_maps(trace, stack, i).head(h, what)


def _cached(trace, name: str) -> bool:
    base = getattr(trace, "_base", None) or trace
    with base._lock:
        return any(name in v for v in base._cache.values())


def pooled(trace, name: str, size: int = 128, heads: Optional[Sequence[int]] = None) -> torch.Tensor:
    """len(heads) x ceil(n_q/size) x ceil(n_k/size) block means of the map `name`, one head and
    a tile of query rows at a time (the contract of docs/design.md, "Long inputs"). Kept in
    the trace's memo per (name, size, head)."""
    stack, i, kind, what = split_name(name)
    n_heads = trace.n_heads(stack)
    heads = list(range(n_heads)) if heads is None else [int(h) for h in heads]
    bad = [h for h in heads if not 0 <= h < n_heads]
    if bad:
        raise IndexError(f"heads {bad} out of range: {name} has heads 0-{n_heads - 1}")
    memo = _memo(trace)
    out = []
    for h in heads:
        key = ("pooled", name, int(size), h)
        if key not in memo:
            if tileable(trace, stack, kind) and what in MAPS and not trace.is_stored(name):
                memo[key] = layer_maps(trace, stack, i).pooled(h, what, size)
            else:  # short-context cases (cross-attention, T5, stored traces, other map names)
                memo[key] = pool_full(trace[name][h], size, what)
        out.append(memo[key])
    return torch.stack(out)


def pool_full(m: torch.Tensor, size: int, what: str = "weights") -> torch.Tensor:
    """Block means of one full n_q x n_k map with pooled's rules (the reference at short lengths)."""
    m = torch.as_tensor(m, dtype=torch.float64)
    if what == "weights":
        s = block_sums(block_sums(m, size).T, size).T
        nq, nk = m.shape
        rq = torch.tensor([min(size, nq - b * size) for b in range(-(-nq // size))], dtype=torch.float64)
        rk = torch.tensor([min(size, nk - b * size) for b in range(-(-nk // size))], dtype=torch.float64)
        return (s / (rq[:, None] * rk[None, :])).float()
    ok = torch.isfinite(m)
    s = block_sums(block_sums(m.masked_fill(~ok, 0.0), size).T, size).T
    c = block_sums(block_sums(ok.double(), size).T, size).T
    return torch.where(c > 0, s / c.clamp_min(1), torch.tensor(float("-inf"), dtype=torch.float64)).float()


def layer_summary(trace, stack: str, i: int, size: int) -> Tuple[torch.Tensor, Dict[str, List[float]]]:
    """Every head of one layer's self-attention weights: (H x nb x nb block means, {figure:
    [per head]} of PROFILE), one head and a tile at a time; kept in the trace's memo."""
    memo = _memo(trace)
    key = ("summary", stack, i, int(size))
    if key not in memo:
        name = tn.self_attn(stack, i, "weights")
        n_heads = trace.n_heads(stack)
        maps, prof = [], {k: [] for k in PROFILE}
        lm = layer_maps(trace, stack, i) if tileable(trace, stack, "self_attn") and not trace.is_stored(name) else None
        for h in range(n_heads):
            p: dict = {}
            if lm is not None:
                m = lm.pooled(h, "weights", size, profile=p)
            else:
                full = trace[name][h]
                m = pool_full(full, size)
                acc = dict.fromkeys(PROFILE, 0.0)
                _profile_tile(acc, full.float(), 0, full.shape[0])
                nq = full.shape[0]
                p = {k: v / max(1, nq) for k, v in acc.items()}
                for k in ("previous", "first_later"):
                    p[k] = acc[k] / max(1, nq - 1) if nq > 1 else float("nan")
            memo[("pooled", name, int(size), h)] = m
            maps.append(m)
            for k in PROFILE:
                prof[k].append(p[k])
        memo[key] = (torch.stack(maps), prof)
    return memo[key]


def profiles(trace, stack: str, size: int = 128, layers: Optional[Sequence[int]] = None) -> Dict[str, torch.Tensor]:
    """{figure: L x H} for every layer x head of a stack (PROFILE figures), layer by layer."""
    layers = range(trace.layers(stack)) if layers is None else layers
    nan = {k: [float("nan")] * trace.n_heads(stack) for k in PROFILE}  # a token mixer's layer: no softmax heads
    rows = [layer_summary(trace, stack, i, size)[1] if tn.self_attn(stack, i, "weights") in trace else nan
            for i in layers]
    return {k: torch.tensor([r[k] for r in rows], dtype=torch.float64) for k in PROFILE}
