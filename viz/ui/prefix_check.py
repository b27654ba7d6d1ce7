"""Does a pass's first n decoder rows equal the decoder run on those n inputs alone? The
decoder stepper's teacher-forcing check (and its inference rows' check): the look-ahead mask
should make row i of a longer pass the same as row i of the pass that stops at i. Both sides
are real forward passes; this module only compares them, with a stated tolerance, and says
where the worst cell is. Pure functions, no Streamlit.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Optional, Sequence, Tuple

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


def prefix_difference(rows, alone, tol: float = PREFIX_TOL) -> PrefixCheck:
    """Teacher forcing = inference on the same prefix, checked: the first n decoder rows of
    `rows` (a teacher-forced trace, or a step view) against `alone`, the decoder run on those n
    inputs in a forward pass of its own (model.trace_decoder_input). Compared: the
    self-attention weights (and an encoder-decoder's cross-attention weights) of every decoder
    layer and head, read layer by layer (trace.each_layer), the top-k next-token probabilities
    of every row and the whole next-token distribution of the last. Raises ValueError when the
    two decoder inputs differ (then no difference is expected to be small)."""
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
    for i, (got, ref) in enumerate(zip(view.each_layer("decoder", names), alone.each_layer("decoder", names))):
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
