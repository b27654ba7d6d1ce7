"""The model view (every head of every layer) as ONE heatmap: a pure, fast figure builder.

viz.figures.head_grid draws L x H maps as L x H plotly subplots: 72 heatmap traces and 144
axes for minilm. Building that figure takes ~0.4 s in Python (make_subplots) and drawing
it ~1 s in the browser, in one main-thread task, so the page cannot react meanwhile.
tiled_head_grid draws the same maps tiled into one matrix (a blank row/column between
maps) as a single heatmap trace with two axes: a few ms to build and one cheap draw.
Nothing here imports Streamlit.

Clicks: a tiled grid has one trace, so a clicked point's curve_number is always 0; use
tiled_grid_pick(point, ...) on the selection's point (its x / y, or its customdata).
"""

from __future__ import annotations

import re
from typing import Optional, Sequence, Tuple

import numpy as np
import plotly.graph_objects as go

from viz.figures import ATTN_SCALE, to_numpy

GAP = 1  # blank cells between neighbouring maps


def tile_maps(maps: Sequence, gap: int = GAP) -> np.ndarray:
    """L maps of H x n_q x n_k -> one (L (n_q + gap) - gap) x (H (n_k + gap) - gap) matrix, NaN in the gaps."""
    arrs = [to_numpy(m) for m in maps]
    n_layers, (n_heads, n_q, n_k) = len(arrs), arrs[0].shape
    z = np.full((n_layers * (n_q + gap) - gap, n_heads * (n_k + gap) - gap), np.nan, dtype=np.float32)
    for li, w in enumerate(arrs):
        r = li * (n_q + gap)
        for h in range(n_heads):
            c = h * (n_k + gap)
            z[r : r + n_q, c : c + n_k] = w[h]
    return z


def tiled_head_grid(
    maps: Sequence,
    *,
    first_layer: int = 0,
    selected: Optional[Tuple[int, int]] = None,
    q_positions: Optional[Sequence[int]] = None,
    k_positions: Optional[Sequence[int]] = None,
    title: str = "",
    gap: int = GAP,
    height: Optional[int] = None,
) -> go.Figure:
    """Model view: L x H attention maps (maps[i] is layer first_layer + i, H x n_q x n_k,
    already reduced to thumbnail size) as one heatmap.

    selected: (layer, head) in real layer numbers, outlined in red. q_positions /
    k_positions: the first token index of each thumbnail row / column (blocks of a reduced
    map; default 0, 1, ...). The axes are categories named "layer l · query q" (rows) and
    "head h · key k" (columns), so hovering a cell reads its layer, head, query, key and
    weight without any per-cell data beside the weights.
    """
    z = tile_maps(maps, gap)
    n_layers = len(maps)
    n_heads, n_q, n_k = np.shape(maps[0])
    qp = list(q_positions) if q_positions is not None else list(range(n_q))
    kp = list(k_positions) if k_positions is not None else list(range(n_k))
    ys, xs = [], []
    for li in range(n_layers):
        ys += [f"layer {li + first_layer} · query {qp[r]}" for r in range(n_q)]
        if li < n_layers - 1:
            ys += [f"\u2009" * (g + 1) + f"{li}" for g in range(gap)]  # unique, blank-looking gap rows
    for h in range(n_heads):
        xs += [f"head {h} · key {kp[c]}" for c in range(n_k)]
        if h < n_heads - 1:
            xs += [f"\u2009" * (g + 1) + f"{h}" for g in range(gap)]
    fig = go.Figure(go.Heatmap(
        z=z, x=xs, y=ys, zmin=0, zmax=1, colorscale=ATTN_SCALE, showscale=False, hoverongaps=False,
        hovertemplate="%{y}<br>%{x}<br>weight %{z:.3f}<extra></extra>"))
    fig.update_xaxes(type="category", tickvals=[xs[h * (n_k + gap) + (n_k - 1) // 2] for h in range(n_heads)],
                     ticktext=[f"H{h}" for h in range(n_heads)], side="top", showgrid=False, zeroline=False,
                     ticks="", tickangle=0)
    fig.update_yaxes(type="category", tickvals=[ys[li * (n_q + gap) + (n_q - 1) // 2] for li in range(n_layers)],
                     ticktext=[f"L{li + first_layer}" for li in range(n_layers)], autorange="reversed",
                     showgrid=False, zeroline=False, ticks="")
    if selected is not None:
        li, h = selected[0] - first_layer, selected[1]
        if 0 <= li < n_layers and 0 <= h < n_heads:
            x0, y0 = h * (n_k + gap) - 0.5, li * (n_q + gap) - 0.5  # category axes: cell i spans i +- 0.5
            fig.add_shape(type="rect", x0=x0, x1=x0 + n_k, y0=y0, y1=y0 + n_q, line=dict(color="#d62728", width=3))
    cell = 70 if n_heads > 6 else 110
    fig.update_layout(height=height or min(2600, 60 + cell * n_layers), title=dict(text=title, x=0),
                      margin=dict(l=10, r=40, t=50 if not title else 80, b=10), plot_bgcolor="white")
    return fig


_CELL = re.compile(r"(?:layer|head) (\d+) · (?:query|key) \d+")


def tiled_grid_pick(point: dict, n_q: int = 0, n_k: int = 0, n_heads: int = 0, n_layers: int = 0,
                    first_layer: int = 0, gap: int = GAP) -> Optional[Tuple[int, int]]:
    """(layer, head) of a clicked cell of a tiled_head_grid; None for a click on a gap.

    Reads the point's y / x category names ("layer l · query q", "head h · key k"), else its
    point_index [row, column] with n_q, n_k the thumbnails' sides (after reduction)."""
    my, mx = _CELL.fullmatch(str(point.get("y", ""))), _CELL.fullmatch(str(point.get("x", "")))
    if my and mx:
        return int(my.group(1)), int(mx.group(1))
    idx = point.get("point_index")
    if not (isinstance(idx, (list, tuple)) and len(idx) == 2):
        return None
    li, r = divmod(int(idx[0]), n_q + gap)
    h, c = divmod(int(idx[1]), n_k + gap)
    if r >= n_q or c >= n_k or not (0 <= li < n_layers and 0 <= h < n_heads):
        return None
    return li + first_layer, h


def _blocks(n: int, max_side: int):
    f = max(1, int(np.ceil(n / max(1, max_side))))
    return [list(range(i, min(i + f, n))) for i in range(0, n, f)]


def tiled_grid_figure(weights_by_layer: Sequence, first_layer: int, q_tokens=None, k_tokens=None, *,
                      selected: Optional[Tuple[int, int]] = None, max_side: int = 48, title: str = "") -> go.Figure:
    """Drop-in for viz.explore.grid_figure (same arguments): each H x n_q x n_k map reduced to at
    most max_side blocks per side (keys summed, queries averaged, so rows still sum to 1, as
    viz.explore.reduce_stack does), then tiled_head_grid. Hover reads each block's first token
    position. q_tokens / k_tokens are accepted for the same signature (the thumbnails carry no
    token labels)."""
    import torch

    from core.words import merge_attention

    maps, qpos, kpos = [], None, None
    for w in weights_by_layer:
        w = torch.as_tensor(w)
        n_q, n_k = w.shape[-2], w.shape[-1]
        if max(n_q, n_k) > max_side:
            qg, kg = _blocks(n_q, max_side), _blocks(n_k, max_side)
            w = merge_attention(w, qg, kg)
            qpos, kpos = [g[0] for g in qg], [g[0] for g in kg]
        maps.append(w)
    return tiled_head_grid(maps, first_layer=first_layer, selected=selected, q_positions=qpos, k_positions=kpos,
                           title=title)
