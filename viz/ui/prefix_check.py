"""Does a pass's first n decoder rows equal the decoder run on those n inputs alone? The
decoder stepper's teacher-forcing check (and its inference rows' check): the look-ahead mask
should make row i of a longer pass the same as row i of the pass that stops at i. Both sides
are real forward passes; this module only compares them, with a stated tolerance, and says
where the worst cell is. Pure functions, no Streamlit.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch

from core import trace_names as tn

def has_cross_attention(trace) -> bool:
    """Whether the trace's decoder reads an encoder (a seq2seq model) or only itself."""
    return tn.cross_attn("decoder", 0, "weights") in trace


PREFIX_TOL = 1e-4  # max |Δ| allowed between a pass's rows and the decoder run on their prefix alone


@dataclass
class PrefixCheck:
    """A pass's first n decoder rows against the decoder run on those n inputs alone."""
    n_rows: int
    diffs: Dict[str, float]  # what was compared -> max |Δ| over every layer, head, row and key
    worst: float  # the largest of them (inf for a shape mismatch or a NaN)
    where: str  # where the worst one is: which tensor, layer, head, row, key
    n_layers: int
    n_heads: int
    tol: float = PREFIX_TOL

    @property
    def ok(self) -> bool:
        return bool(self.worst <= self.tol)


def _max_diff(a, b) -> Tuple[float, Optional[tuple]]:
    """max |a - b| and its index; (inf, None) when the shapes differ, inf at a NaN."""
    a, b = torch.as_tensor(a), torch.as_tensor(b)
    if a.shape != b.shape:
        return float("inf"), None
    if a.numel() == 0:
        return 0.0, ()
    d = (a.float() - b.float()).abs()
    d = torch.where(torch.isnan(d), torch.full_like(d, float("inf")), d)
    k = int(torch.argmax(d))
    return float(d.flatten()[k]), tuple(int(i) for i in np.unravel_index(k, tuple(d.shape)))


def _where(what: str, at: Optional[tuple], axes: Sequence[str], a, b) -> str:
    if at is None:
        return f"{what}: shape {tuple(a.shape)} against {tuple(b.shape)}"
    return what + "".join(f", {ax} {i}" for ax, i in zip(axes, at))


@dataclass
class Drawn:
    """What a step view drew for one layer and head, read back from its figures, so that the check
    holds the very arrays on the page against the decoder run on the prefix alone. maps: "mask",
    "masked", "weights" (the look-ahead mask, the masked scores, the weights: N x N, or B x B
    blocks), "cross" (N x n_source), as the heatmaps hold them (a -inf cell drawn blank, NaN); rows:
    how many of the drawn rows the prefix covers (inference: all N; teacher forcing: up to the
    step's); groups: each block's positions where the maps are drawn in blocks (None: one cell a
    position); bars: the next-token bars, (token id, probability drawn), the first `top` of them
    the k likeliest tokens."""
    layer: int
    head: int
    rows: int
    maps: Dict[str, np.ndarray]
    groups: Optional[List[Sequence[int]]] = None
    bars: List[Tuple[int, float]] = field(default_factory=list)
    top: int = 0

    def digest(self) -> str:
        """A short hash of everything drawn (the checks are cached per what the page drew)."""
        h = hashlib.sha1(repr((self.layer, self.head, self.rows, self.top, self.bars,
                               None if self.groups is None else [(g[0], len(g)) for g in self.groups])).encode())
        for k in sorted(self.maps):
            a = np.ascontiguousarray(np.asarray(self.maps[k], dtype=np.float64))
            h.update(k.encode() + repr(a.shape).encode() + a.tobytes())
        return h.hexdigest()


DRAWN_LABELS = {"mask": "drawn mask", "masked": "drawn masked scores", "weights": "drawn weights",
                "cross": "drawn cross-attention", "bars": "drawn next-token bars"}


def _alone_rows(alone, layer: int, head: int, what: str) -> Callable[[int, int], np.ndarray]:
    """rows(r0, r1): rows r0:r1 of the prefix run's map `what` ("mask", "masked", "weights") for one
    head, in float64 over its own n keys (a masked cell -inf in the mask and the masked scores, 0 in
    the weights). A long prefix is read one head and a tile of rows at a time (core.head_maps), so no
    n x n map is held; a short one (or a map that does not tile) from the trace's own layer."""
    from core import head_maps as hm

    if hm.long_layer(alone, "decoder"):
        maps = hm.LayerMaps(alone, "decoder", layer)

        def tiled(r0: int, r1: int) -> np.ndarray:
            if what == "mask":
                off = maps.mask_rows(r0, r1)
                shape = (r1 - r0, maps.n)
                return np.zeros(shape) if off is None else np.where(off.cpu().numpy(), -np.inf, 0.0)
            return maps.tile(head, r0, r1, what)[0].double().cpu().numpy()

        return tiled
    t = alone[tn.self_attn("decoder", layer, what)]
    full = (t if t.dim() == 2 else t[head]).double().cpu().numpy()
    return lambda r0, r1: full[r0:r1]


def reference_blocks(rows: Callable[[int, int], np.ndarray], n: int, n_keys: int, groups: List[Sequence[int]],
                     what: str) -> np.ndarray:
    """The drawn grid of a map known for its rows 0..n-1 (rows(r0, r1), n keys each; the keys n..n_keys-1
    after them are masked: weight 0, -inf), reduced as the step view's blocks are drawn and written here
    again, a block at a time, so that the drawing's own reduction is not its reference: weights summed
    over each block's keys and averaged over its queries; the mask and the masked scores the mean of a
    block's finite cells (-inf where none is). A block row reaching past row n-1 is NaN (not compared)."""
    out = np.full((len(groups), len(groups)), np.nan)
    for bi, g in enumerate(groups):
        r0, r1 = int(g[0]), int(g[-1]) + 1
        if r1 > n:
            break
        m = np.asarray(rows(r0, r1), dtype=np.float64)
        if n_keys > m.shape[1]:
            m = np.concatenate([m, np.full((m.shape[0], n_keys - m.shape[1]), 0.0 if what == "weights" else -np.inf)],
                               axis=1)
        for bj, h in enumerate(groups):
            cell = m[:, int(h[0]):int(h[-1]) + 1]
            if what == "weights":
                out[bi, bj] = cell.sum() / cell.shape[0]
            else:
                fin = cell[np.isfinite(cell)]
                out[bi, bj] = fin.mean() if fin.size else -np.inf
    return out


def _drawn_map_difference(got, ref) -> Tuple[float, Optional[tuple]]:
    """max |Δ| between a drawn map (-inf drawn as NaN) and its reference (-inf; NaN: not compared), and
    where; a cell blank on one side and not on the other is inf."""
    got, ref = np.asarray(got, dtype=np.float64), np.asarray(ref, dtype=np.float64)
    if got.shape != ref.shape:
        return float("inf"), None
    known = ~np.isnan(ref)
    blank_ref, blank_got = np.isneginf(ref), np.isnan(got) | np.isneginf(got)
    d = np.where(blank_ref | blank_got, np.where(blank_ref == blank_got, 0.0, np.inf),
                 np.abs(np.nan_to_num(got, nan=0.0, neginf=0.0) - np.nan_to_num(ref, nan=0.0, neginf=0.0)))
    d = np.where(known, d, 0.0)
    if d.size == 0:
        return 0.0, ()
    k = int(np.argmax(d))
    return float(d.flat[k]), tuple(int(i) for i in np.unravel_index(k, d.shape))


def drawn_difference(drawn: Drawn, alone) -> Tuple[Dict[str, float], float, str]:
    """The arrays a step view drew (Drawn) against the decoder run on the prefix alone: for the layer and
    head drawn, the mask, masked scores and weights (reduced to the drawn blocks by reference_blocks where
    the maps are drawn in blocks), the cross-attention, and the next-token bars (each bar's probability
    against the prefix run's last row; the first `top` bars must be its k likeliest tokens: none left
    out is likelier than the least of them, beyond the tolerance). Returns (diffs, worst, where)."""
    n = len(alone.tokens("target"))
    diffs: Dict[str, float] = {}
    worst, where = -1.0, ""
    if drawn.rows != n:
        return {"drawn rows": float("inf")}, float("inf"), f"the drawn view covers {drawn.rows} rows, the prefix {n}"
    for what in ("mask", "masked", "weights"):
        got = drawn.maps.get(what)
        if got is None:
            continue
        got = np.asarray(got, dtype=np.float64)
        groups = drawn.groups or [[i] for i in range(got.shape[1])]
        ref = reference_blocks(_alone_rows(alone, drawn.layer, drawn.head, what), n, sum(len(g) for g in groups),
                               groups, what)
        d, at = _drawn_map_difference(got, ref)
        diffs[DRAWN_LABELS[what]] = d
        if d > worst:
            axes = ("block row", "block column") if drawn.groups else ("row", "key")
            worst, where = d, (f"{DRAWN_LABELS[what]} (layer {drawn.layer}, head {drawn.head})" +
                               ("".join(f", {ax} {i}" for ax, i in zip(axes, at)) if at is not None
                                else f": drawn {got.shape}, reference {ref.shape}"))
    if drawn.maps.get("cross") is not None and has_cross_attention(alone):
        got = np.asarray(drawn.maps["cross"], dtype=np.float64)[:n]
        ref = alone[tn.cross_attn("decoder", drawn.layer, "weights")][drawn.head].double().cpu().numpy()
        d, at = _drawn_map_difference(got, ref)
        diffs[DRAWN_LABELS["cross"]] = d
        if d > worst:
            worst, where = d, f"{DRAWN_LABELS['cross']} (layer {drawn.layer}, head {drawn.head})" + (
                "".join(f", {ax} {i}" for ax, i in zip(("row", "source key"), at)) if at is not None else "")
    if drawn.bars and tn.LAST_PROBS in alone:
        last = alone[tn.LAST_PROBS].double().cpu().numpy().ravel()
        d, at_bar = 0.0, None
        for i, (tid, p) in enumerate(drawn.bars):
            e = abs(float(p) - float(last[int(tid)])) if 0 <= int(tid) < last.size else float("inf")
            if e > d:
                d, at_bar = e, f"bar {i} (token id {int(tid)})"
        if drawn.top:
            top_ids = {int(t) for t, _ in drawn.bars[:drawn.top]}
            rest = np.delete(last, [t for t in top_ids if 0 <= t < last.size])
            least = min(float(last[t]) if 0 <= t < last.size else -np.inf for t in top_ids)
            missed = float(rest.max()) - least if rest.size else 0.0
            if missed > d:
                d, at_bar = missed, f"a token left out of the top {drawn.top} is likelier than bar {drawn.top - 1}"
        diffs[DRAWN_LABELS["bars"]] = d
        if d > worst:
            worst, where = d, f"{DRAWN_LABELS['bars']}, {at_bar}"
    return diffs, worst, where


def tiles_layers(rows, alone) -> bool:
    """Whether the check reads the self-attention weights one head and a tile of rows at a time
    (core.head_maps.LayerMaps): where a layer's maps of the pass behind `rows` (a step view reads its
    whole pass's layer) are long (core.head_maps.long_layer), so that the check never holds a layer's
    H x n x n maps; else layer by layer, as the trace computes them."""
    from core import head_maps as hm

    base = getattr(rows, "_base", None) or rows  # a step view (Trace.prefix) computes its base pass's layers
    return hm.long_layer(base, "decoder") or hm.long_layer(alone, "decoder")


CHECK_TILE_BYTES = 32 * 2**20  # a tile of the check's comparison: this many bytes of one head's rows (float32)


def check_tile_rows(n: int) -> int:
    """Rows of one head's map the check compares at once: CHECK_TILE_BYTES of them (a whole head up to
    about 2,900 positions), at least core.head_maps.TILE_ROWS; fewer, larger tiles than the views read,
    since each tile costs a call per side (at 1,024 tokens of smollm2, 128-row tiles took 5 times as long
    as the layer-by-layer comparison)."""
    from core import head_maps as hm

    return max(hm.TILE_ROWS, CHECK_TILE_BYTES // (4 * max(1, int(n))))


def _tiled_difference(view, alone, i: int) -> Tuple[float, Optional[tuple], int]:
    """max |Δ| of layer i's self-attention weights, view against alone, one head and check_tile_rows rows
    at a time; (max, (head, row, key), heads)."""
    from core import head_maps as hm

    a, b = hm.LayerMaps(view, "decoder", i), hm.LayerMaps(alone, "decoder", i)
    if a.n != b.n:
        return float("inf"), None, b.n_heads
    worst, where = 0.0, None
    rows = check_tile_rows(b.n)
    for h in range(b.n_heads):
        for r0 in range(0, b.n, rows):
            r1 = min(b.n, r0 + rows)
            d, at = _max_diff(a.tile(h, r0, r1)[0], b.tile(h, r0, r1)[0])
            if d > worst or where is None:
                worst, where = d, (h, r0 + at[0], at[1]) if at else (h, r0, 0)
    return worst, where, b.n_heads


def prefix_difference(rows, alone, tol: float = PREFIX_TOL, drawn: Optional[Drawn] = None) -> PrefixCheck:
    """Teacher forcing = inference on the same prefix, checked: the first n decoder rows of
    `rows` (a teacher-forced trace, or a step view) against `alone`, the decoder run on those n
    inputs in a forward pass of its own (model.trace_decoder_input). Compared: the
    self-attention weights (and an encoder-decoder's cross-attention weights) of every decoder
    layer and head, read layer by layer (trace.each_layer), the top-k next-token probabilities
    of every row and the whole next-token distribution of the last; and, given `drawn`, the arrays
    the page drew from `rows` (drawn_difference), so that a view that draws something other than
    its trace fails too. Raises ValueError when the two decoder inputs differ (then no difference
    is expected to be small)."""
    n = len(alone.tokens("target"))
    ids_rows, ids_alone = rows.meta.get("target_ids"), alone.meta.get("target_ids")
    if ids_rows is not None and ids_alone is not None and list(ids_rows[:n]) != list(ids_alone):
        raise ValueError("the two decoder inputs differ: the rows are different computations")
    view = rows.prefix(n)
    names = [tn.local(k, "weights") for k in (tn.ATTNS if has_cross_attention(alone) else (tn.SELF,))]
    labels = {tn.local(tn.SELF, "weights"): "self-attention weights", tn.local(tn.CROSS, "weights"): "cross-attention weights"}
    diffs: Dict[str, float] = {}
    worst, where = -1.0, ""
    n_layers, n_heads = alone.layers("decoder"), 0
    if view.layers("decoder") != n_layers:
        return PrefixCheck(n, {"layers": float("inf")}, float("inf"),
                           f"{view.layers('decoder')} decoder layers against {n_layers}", n_layers, 0, tol)
    self_w = tn.local(tn.SELF, "weights")
    # the layers with softmax attention: a token mixer's layer has no self-attention weights (its
    # output is held to the prefix's through the next-token probabilities below)
    softmax = [i for i in range(n_layers) if tn.self_attn("decoder", i, "weights") in alone]
    tiled = tiles_layers(rows, alone)
    if tiled:  # a long prefix: the self-attention weights one head and a tile of rows at a time, never a layer
        names = [s for s in names if s != self_w]
        for i in softmax:
            d, at, n_heads = _tiled_difference(view, alone, i)
            diffs[labels[self_w]] = max(diffs.get(labels[self_w], 0.0), d)
            if d > worst:
                worst, where = d, f"{labels[self_w]}, layer {i}" + "".join(
                    f", {ax} {j}" for ax, j in zip(("head", "row", "key"), at or ()))
    layers = zip(view.each_layer("decoder", names, softmax), alone.each_layer("decoder", names, softmax)) if names else ()
    for i, (got, ref) in zip(softmax, layers):
        for s in names:
            n_heads = max(n_heads, int(ref[s].shape[0]))
            d, at = _max_diff(got[s], ref[s])
            diffs[labels[s]] = max(diffs.get(labels[s], 0.0), d)
            if d > worst:
                worst, where = d, _where(f"{labels[s]}, layer {i}", at, ("head", "row", "key"), got[s], ref[s])
    for label, name, axes in (("top-k next-token probabilities", tn.TOPK_PROBS, ("row", "rank")),
                              ("next-token distribution", tn.LAST_PROBS, ("token id",))):
        if name in view and name in alone:
            d, at = _max_diff(view[name], alone[name])
            diffs[label] = d
            if d > worst:
                worst, where = d, _where(label + (f", row {n - 1}" if name == tn.LAST_PROBS else ""), at, axes,
                                         view[name], alone[name])
    if drawn is not None:
        got, d, at = drawn_difference(drawn, alone)
        diffs.update(got)
        if d > worst:
            worst, where = d, at
    return PrefixCheck(n, diffs, max(worst, 0.0), where, n_layers, n_heads, tol)


# ------------------------------------------------------------------ generation: KV cache vs no cache
GENERATION_TOL = 1e-4  # max |Δ| allowed between the next-token logits with and without the KV cache


@dataclass
class GenerationCheck:
    """Greedy generation through the KV cache (what the steps show) against the decoder run on
    the whole prefix at every step (no cache)."""
    n_steps: int  # steps compared
    shown_ids: list  # the tokens the steps show (generated through the cache)
    uncached_ids: list  # the tokens the uncached run generates
    worst: float  # max |Δ| of the next-token logits over the steps both runs share a prefix in
    where: str
    tol: float = GENERATION_TOL

    @property
    def first_difference(self) -> Optional[int]:
        """The first step (1-based) whose token differs, or None."""
        for t, (a, b) in enumerate(zip(self.shown_ids, self.uncached_ids), start=1):
            if a != b:
                return t
        return None if len(self.shown_ids) == len(self.uncached_ids) else min(len(self.shown_ids),
                                                                              len(self.uncached_ids)) + 1

    @property
    def ok(self) -> bool:
        return self.first_difference is None and bool(self.worst <= self.tol)


def generation_difference(model, text: str, shown_ids: Sequence[int], tol: float = GENERATION_TOL) -> GenerationCheck:
    """The KV cache checked: `shown_ids`, the tokens model.steps generated (through the cache),
    against greedy decoding with no cache (the decoder run on the whole prefix, its own forward
    passes), and the next-token logits of a cached run against the uncached ones, step by step
    while the two prefixes agree. The uncached logits come from one pass over the prompt and the
    cached tokens (model.forced_logits: row P + k - 1 of it is the uncached step k's last row);
    where its greedy choice departs from the cached tokens, the uncached run is decoded step by
    step (model.greedy_run(use_cache=False)) to say what it generates from there. A 1,024-token
    prompt's 64 steps cost one pass instead of 64."""
    shown = [int(i) for i in shown_ids]
    n = len(shown)
    cached_ids, _, cached = model.greedy_run(text, n, use_cache=True)
    plain = model.forced_logits(text, cached_ids)
    plain_ids = [int(i) for i in plain.argmax(-1)] if plain.numel() else []
    if plain_ids != [int(i) for i in cached_ids]:  # the runs part: the uncached run's own tokens from there
        plain_ids, _, plain = model.greedy_run(text, n, use_cache=False)
    same = 0  # steps whose prefix is the same in both runs (their logits are comparable)
    while same < min(len(cached_ids), len(plain_ids)) and (same == 0 or cached_ids[same - 1] == plain_ids[same - 1]):
        same += 1
    worst, where = 0.0, ""
    if same:
        d, at = _max_diff(cached[:same], plain[:same])
        worst, where = d, _where("next-token logits", at, ("step", "token id"), cached[:same], plain[:same])
        if at is not None:
            where = f"next-token logits, step {at[0] + 1}, token id {at[1]}"
    return GenerationCheck(n, shown, [int(i) for i in plain_ids], worst, where, tol)
