"""The model view (every head of every layer) as ONE heatmap: a pure, fast figure builder.

Drawn as L x H plotly subplots, minilm's model view is 72 heatmap traces and 144 axes:
~0.4 s to build in Python (make_subplots) and ~1 s to draw in the browser, in one
main-thread task, so the page cannot react meanwhile. tiled_head_grid draws the same maps
tiled into one matrix (a blank row/column between maps) as a single heatmap trace with two
axes: a few ms to build and one cheap draw. Nothing here imports Streamlit.

Clicks: plotly heatmaps cannot be selected (Streamlit's on_select returns no points for
them), so a second trace holds one invisible square marker per map, at its centre: a click
anywhere on a map selects that marker, and tiled_grid_pick reads (layer, head) from it.
Hovering a map names it and its mean attention entropy.
"""

from __future__ import annotations

import math
import re
from typing import Optional, Sequence, Tuple

import numpy as np
import plotly.graph_objects as go
import torch

from viz.figures.heatmaps import ATTN_SCALE, to_numpy

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
    entropy: Optional[Sequence] = None,
    notes: Optional[Sequence[str]] = None,
    sinks: Optional[Sequence] = None,
) -> go.Figure:
    """Model view: L x H attention maps (maps[i] is layer first_layer + i, H x n_q x n_k,
    already reduced to thumbnail size) as one heatmap.

    selected: (layer, head) in real layer numbers, outlined in red. q_positions /
    k_positions: the first token index of each thumbnail row / column (blocks of a reduced
    map; default 0, 1, ...). The axes are categories named "layer l · query q" (rows) and
    "head h · key k" (columns), so hovering a cell reads its layer, head, query, key and
    weight without any per-cell data beside the weights. entropy: each map's mean row
    entropy in bits (L x H), for the hover; give it from the unreduced maps (map_entropy),
    since blocks of a reduced map have less entropy than its tokens. Default: from `maps`.
    notes: each layer's kind ("sliding 4 · RoPE"), written beside its row label. sinks: each
    layer's learned sink (H x n_q), drawn right of each map's keys as a column named
    "head h · sink", after a blank column and a red line.
    """
    entropy = entropy if entropy is not None else [map_entropy(m) for m in maps]
    n_keys = np.shape(maps[0])[-1]
    if sinks is not None:  # keys, a blank column, the sink
        maps = [np.concatenate([to_numpy(m), np.full(np.shape(m)[:2] + (1,), np.nan, dtype=np.float32),
                                to_numpy(s)[..., None]], -1) for m, s in zip(maps, sinks)]
    z = tile_maps(maps, gap)
    n_layers = len(maps)
    n_heads, n_q, n_k = np.shape(maps[0])
    qp = list(q_positions) if q_positions is not None else list(range(n_q))
    kp = list(k_positions) if k_positions is not None else list(range(n_keys))
    ys, xs = [], []
    for li in range(n_layers):
        ys += [f"layer {li + first_layer} · query {qp[r]}" for r in range(n_q)]
        if li < n_layers - 1:
            ys += ["\u2009" * (g + 1) + f"{li}" for g in range(gap)]  # unique, blank-looking gap rows
    for h in range(n_heads):
        xs += [f"head {h} · key {kp[c]}" for c in range(n_keys)]
        if sinks is not None:
            xs += ["\u2009" * (gap + 1) + f"{h}", f"head {h} · sink"]
        if h < n_heads - 1:
            xs += ["\u2009" * (g + 1) + f"{h}" for g in range(gap)]
    heat = go.Heatmap(z=z, x=xs, y=ys, zmin=0, zmax=1, colorscale=ATTN_SCALE, showscale=False, hoverongaps=False,
                      hovertemplate="%{y}<br>%{x}<br>weight %{z:.3f}<extra></extra>")
    # one click target per map: an invisible square marker at its centre (see the module docstring)
    cx = [xs[h * (n_k + gap) + (n_k - 1) // 2] for h in range(n_heads)]
    cy = [ys[li * (n_q + gap) + (n_q - 1) // 2] for li in range(n_layers)]
    cell = 70 if n_heads > 6 else 150  # pixels per layer row
    px, py, custom = [], [], []
    for li in range(n_layers):
        ent = entropy[li] if entropy is not None else map_entropy(maps[li])
        for h in range(n_heads):
            px.append(cx[h])
            py.append(cy[li])
            custom.append([li + first_layer, h, float(ent[h])])
    targets = go.Scatter(
        x=px, y=py, mode="markers", customdata=custom, showlegend=False, name="maps",
        marker=dict(symbol="square", size=int(cell * 0.8), opacity=0, color="#000000"),
        selected=dict(marker=dict(opacity=0)), unselected=dict(marker=dict(opacity=0)),
        hovertemplate=("layer %{customdata[0]} · head %{customdata[1]}<br>mean entropy of a row: "
                       "%{customdata[2]:.2f} bits<br>click to select this map<extra></extra>"))
    fig = go.Figure([heat, targets])
    fig.update_xaxes(type="category", constrain="domain", tickvals=cx,
                     ticktext=[f"H{h}" for h in range(n_heads)], side="top", showgrid=False, zeroline=False,
                     ticks="", tickangle=0)
    rows = [f"L{li + first_layer}" + (f" · {notes[li]}" if notes and notes[li] else "") for li in range(n_layers)]
    fig.update_yaxes(type="category", tickvals=cy, ticktext=rows, autorange="reversed",
                     showgrid=False, zeroline=False, ticks="", scaleanchor="x", constrain="domain")
    if selected is not None:
        li, h = selected[0] - first_layer, selected[1]
        if 0 <= li < n_layers and 0 <= h < n_heads:
            x0, y0 = h * (n_k + gap) - 0.5, li * (n_q + gap) - 0.5  # category axes: cell i spans i +- 0.5
            fig.add_shape(type="rect", x0=x0, x1=x0 + n_k, y0=y0, y1=y0 + n_q, line=dict(color="#d62728", width=3))
    if sinks is not None:
        for h in range(n_heads):  # a red line between each map's keys and its sink
            edge = h * (n_k + gap) + n_keys  # the blank column's centre, from the first map's top to the last's foot
            fig.add_shape(type="line", x0=edge, x1=edge, y0=-0.5, y1=len(ys) - 0.5, line=dict(color="#d62728", width=1))
    fig.update_layout(height=height or min(2600, 60 + cell * n_layers), title=dict(text=title, x=0),
                      margin=dict(l=10 + (int(7 * max(map(len, rows))) if notes and any(notes) else 0), r=40, t=50 if not title else 80, b=10), plot_bgcolor="white",
                      hovermode="closest", dragmode=False)
    return fig


def map_entropy(w) -> np.ndarray:
    """Mean Shannon entropy (bits) of the rows of each head's map (H x n_q x n_k -> H): low
    for a head that looks at one token, high for one that spreads its attention."""
    t = torch.as_tensor(w, dtype=torch.float32)
    return (-torch.special.xlogy(t, t).sum(-1).mean(-1) / math.log(2)).numpy()


_CELL = re.compile(r"(?:layer|head) (\d+) · (?:query|key) \d+")


def tiled_grid_pick(point: dict) -> Optional[Tuple[int, int]]:
    """(layer, head) of a clicked map of a tiled_head_grid; None for a click on a gap.

    Reads the click target's customdata [layer, head, ...], else the point's y / x category
    names ("layer l · query q", "head h · key k")."""
    cd = point.get("customdata")
    if isinstance(cd, (list, tuple)) and len(cd) >= 2:
        try:
            return int(cd[0]), int(cd[1])
        except (TypeError, ValueError):
            pass
    my, mx = _CELL.fullmatch(str(point.get("y", ""))), _CELL.fullmatch(str(point.get("x", "")))
    if my and mx:
        return int(my.group(1)), int(mx.group(1))
    return None
