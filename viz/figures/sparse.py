"""A sparse selection's layer (DeepSeek V3.2: the lightning indexer keeps the top-k keys of each
query, attention runs over those alone) drawn against the dense attention it replaced: the kept
keys outlined on a map, the dense softmax of the same q, k and scale over every causal key
(computed here in numpy from the recorded q and k), and each query's dense mass that falls
outside the selection. Shared by Explore and Inside."""

from __future__ import annotations

from typing import Optional, Sequence

import numpy as np
import plotly.graph_objects as go

from core import trace_names as tn
from viz.figures.checks import Check, max_abs_diff
from viz.figures.heatmaps import to_numpy

OUTLINE = "#E4002B"
SELECTED = "selected"


def dense_softmax(q, k, scale: float, causal: bool = True) -> np.ndarray:
    """softmax(q k^T scale + M) in float64 over every key (q: n_q x d, k: n_k x d; the queries the
    last n_q of the n_k positions; M: -inf after the query where causal)."""
    q, k = to_numpy(q).astype(np.float64), to_numpy(k).astype(np.float64)
    if q.ndim != 2 or k.ndim != 2 or q.shape[1] != k.shape[1]:
        raise ValueError(f"q and k must be n x d with the same d, not {q.shape} and {k.shape}")
    s = q @ k.T * float(scale)
    n_q, n_k = s.shape
    if causal:
        s = np.where(np.arange(n_k)[None, :] > np.arange(n_k - n_q, n_k)[:, None], -np.inf, s)
    s = s - s.max(-1, keepdims=True)
    e = np.exp(s)
    return e / e.sum(-1, keepdims=True)


def selection_of(trace, stack: str, layer: int, head: int) -> Optional[dict]:
    """A sparse layer's view of one head: selected (n_q x n_k bool), weights (the recorded sparse
    map), dense (dense_softmax of the recorded q and k at the layer's scale), outside (n_q: the
    dense mass off the selection) and `check` (the recorded weights equal the dense map
    renormalised over the selection). None for a layer without a selection, or a trace without
    its model (the scale is the module's)."""
    sel_name = tn.attn(stack, layer, tn.SELF, "selected")
    model = getattr(getattr(trace, "runner", None), "model", None)
    if sel_name not in trace or model is None:
        return None
    scale = float(model.net.layers(stack)[layer].self_attn.scale)
    sel = to_numpy(trace[sel_name]).astype(bool)
    q, k = (to_numpy(trace[tn.attn(stack, layer, tn.SELF, p)])[head] for p in ("q", "k"))
    weights = to_numpy(trace[tn.attn(stack, layer, tn.SELF, "weights")])[head].astype(np.float64)
    dense = dense_softmax(q, k, scale)
    kept = np.where(sel, dense, 0.0)
    renorm = kept / kept.sum(-1, keepdims=True)
    chk = Check("the recorded sparse weights equal the dense softmax (float64 numpy, from the recorded q and k) "
                "renormalised over the kept keys", max_abs_diff(weights, renorm), 1e-4)
    return {"selected": sel, "weights": weights, "dense": dense, "outside": (dense * ~sel).sum(-1), "check": chk,
            "topk": int(sel.sum(-1).max())}


def add_selection_outline(fig: go.Figure, selected, transposed: bool = False) -> go.Figure:
    """Outline each kept cell (selected True) of an attention heatmap: one trace named "selected",
    on numeric axes a closed square around each cell (5 corners then a gap, so its x and y are
    each cell's outline; `customdata` the cell's [query, key]), on category axes an open square
    marker at the cell. transposed: the map has keys as rows (Lecture 10's columns notation)."""
    sel = to_numpy(selected).astype(bool)
    if transposed:
        sel = sel.T
    heat = fig.data[0]
    if sel.shape != (len(heat.y), len(heat.x)):
        raise ValueError(f"the selection is {sel.shape[0]} x {sel.shape[1]}, the map {len(heat.y)} x {len(heat.x)}")
    rows, cols = np.nonzero(sel)
    qk = np.stack([cols, rows], 1) if transposed else np.stack([rows, cols], 1)  # each cell's (query, key)
    xs, ys = list(heat.x), list(heat.y)
    hover = "query %{customdata[0]} · key %{customdata[1]}: kept by the indexer<extra></extra>"
    if fig.layout.xaxis.type == "category" or not all(isinstance(v, (int, float, np.number)) for v in xs + ys):
        fig.add_trace(go.Scatter(x=[xs[c] for c in cols], y=[ys[r] for r in rows], mode="markers", name=SELECTED,
                                 marker=dict(symbol="square-open", size=10, color=OUTLINE, line=dict(width=2)),
                                 customdata=qk, hovertemplate=hover, showlegend=False))
        return fig
    h = 0.42
    x, y, cells = [], [], []
    for r, c, cell in zip(rows, cols, qk.tolist()):
        cx, cy = float(xs[c]), float(ys[r])
        x += [cx - h, cx + h, cx + h, cx - h, cx - h, None]
        y += [cy - h, cy - h, cy + h, cy + h, cy - h, None]
        cells += [cell] * 6
    fig.add_trace(go.Scatter(x=x, y=y, mode="lines", name=SELECTED, line=dict(color=OUTLINE, width=2),
                             customdata=cells, hovertemplate=hover, showlegend=False))
    return fig


def outside_figure(outside, tokens: Sequence[str], topk: int) -> go.Figure:
    """Each query's dense attention mass on the keys the selection dropped (a bar per query)."""
    o = to_numpy(outside).astype(np.float64).reshape(-1)
    if len(o) != len(tokens):
        raise ValueError(f"{len(o)} values for {len(tokens)} queries")
    fig = go.Figure(go.Bar(x=[f"{i}:{t}" for i, t in enumerate(tokens)], y=o, name="outside", marker_color=OUTLINE,
                           hovertemplate="query %{x}: %{y:.3f} of the dense mass off the selection<extra></extra>"))
    fig.update_layout(title=f"Dense attention mass outside the top-{topk} keys, per query", yaxis=dict(range=[0, 1],
                      title="mass"), height=260, margin=dict(l=10, r=10, t=40, b=10))
    return fig
