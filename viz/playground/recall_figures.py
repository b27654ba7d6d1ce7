"""The Playground's recall tab, as figures: one recall model's map on a multi-query associative
recall sequence (core/toy/recall_task.py) with the key that holds the answer outlined (the
models' accuracy curves are viz/figures/recall.py's). Pure functions of arrays; no Streamlit.

A map's figure has one heatmap per head (trace name "head h", the full n x n map of one layer:
a softmax head's weights on 0..1, a token mixer's exact implicit attention on a signed scale
symmetric about 0) and, in every head's panel, two rectangles on the chosen query's row: the
answer's key (shape name "answer key", solid) and the value that follows it ("answer value",
dashed). A cell i of either axis is centred on i (the axes are numeric positions, the tokens
their tick labels), so a rectangle from i - 0.5 to i + 0.5 is that cell."""

from __future__ import annotations

from typing import Sequence, Tuple

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from viz.figures.heatmaps import ATTN_SCALE, DIVERGING

KEY_SHAPE, VALUE_SHAPE = "answer key", "answer value"
MAP_HEIGHT = 420


def signed_range(maps: np.ndarray) -> float:
    """The half-width of a signed map's colour scale: its largest magnitude (1e-9 for an all-zero map)."""
    return max(float(np.nanmax(np.abs(maps))) if maps.size else 0.0, 1e-9)


def recall_map_figure(maps, tokens: Sequence[str], query: int, key: int, *, signed: bool,
                      title: str = "") -> go.Figure:
    """maps (H, n, n): one layer's map per head. query: the query's row; key: the answer key's
    column (its value is the next column). signed: a token mixer's implicit attention (a
    diverging scale about 0); else a softmax head's weights (0..1)."""
    maps = np.asarray(maps, dtype=float)
    if maps.ndim != 3 or maps.shape[1] != maps.shape[2]:
        raise ValueError(f"maps must be (heads, n, n), not {maps.shape}")
    n_heads, n, _ = maps.shape
    if len(tokens) != n:
        raise ValueError(f"{len(tokens)} tokens for a map of {n} positions")
    if not (0 <= key < query < n):
        raise ValueError(f"the answer key ({key}) must come before the query ({query}), both within {n} positions")
    fig = make_subplots(rows=1, cols=n_heads, shared_yaxes=True, horizontal_spacing=0.04,
                        subplot_titles=[f"head {h}" for h in range(n_heads)])
    half = signed_range(maps) if signed else 1.0
    scale = dict(colorscale=DIVERGING, zmin=-half, zmax=half, zmid=0.0) if signed else dict(
        colorscale=ATTN_SCALE, zmin=0.0, zmax=1.0)
    what = "A (signed)" if signed else "weight"
    ticks = dict(tickmode="array", tickvals=list(range(n)), ticktext=list(tokens), tickfont=dict(size=9))
    pos = list(range(n))
    for h in range(n_heads):
        z = np.where(np.tril(np.ones((n, n), dtype=bool)), maps[h], np.nan)  # causal: nothing above the diagonal
        fig.add_trace(go.Heatmap(z=z, x=pos, y=pos, name=f"head {h}", showscale=h == n_heads - 1,
                                 colorbar=dict(thickness=12, title=dict(text=what, side="right")),
                                 hovertemplate="query %{y} · key %{x}: %{z:.4f}<extra>head " + str(h) + "</extra>",
                                 **scale), row=1, col=h + 1)
        ax = "" if h == 0 else str(h + 1)
        for name, col, dash in ((KEY_SHAPE, key, "solid"), (VALUE_SHAPE, key + 1, "dot")):
            fig.add_shape(type="rect", name=name, xref=f"x{ax}", yref=f"y{ax}", x0=col - 0.5, x1=col + 0.5,
                          y0=query - 0.5, y1=query + 0.5, line=dict(color="#e4572e" if name == KEY_SHAPE else "#222",
                                                                       width=3 if name == KEY_SHAPE else 2, dash=dash),
                          fillcolor="rgba(0,0,0,0)")
        fig.update_xaxes(title="key", **ticks, row=1, col=h + 1)
    fig.update_yaxes(autorange="reversed", title="query", **ticks, row=1, col=1)
    fig.update_layout(title=title, height=MAP_HEIGHT, margin=dict(t=70, b=40, l=40, r=20))
    return fig


def shape_cell(fig: go.Figure, name: str, head: int = 0) -> Tuple[int, int]:
    """(row, column) of the cell the shape `name` outlines in head `head`'s panel."""
    ax = "" if head == 0 else str(head + 1)
    for s in fig.layout.shapes:
        if s.name == name and s.xref == f"x{ax}":
            return int(round((s.y0 + s.y1) / 2)), int(round((s.x0 + s.x1) / 2))
    raise KeyError(f"no shape {name!r} in head {head}'s panel")
