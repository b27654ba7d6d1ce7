"""Figures for the heads page: head scores as layer x head heatmaps, rollout layer by layer,
and raw attention / rollout / flow side by side for one token. Pure functions (pandas,
numpy, plotly; no Streamlit), over what core.analysis returns.

Clicks: plotly heatmaps cannot be selected (see viz.figures.grid), so score_heatmap lays one
invisible square marker over each cell; head_pick reads (layer, head) from a clicked one.
"""

from __future__ import annotations

from typing import Optional, Sequence, Tuple

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from core import trace_names as tn
from viz.figures.heatmaps import ATTN_SCALE, CHAR_PX, safe_labels

SCORE_LABELS = {
    "previous_token": "previous token: mean A[i, i-1]",
    "first_token": "first token: mean A[i, 0] (i ≥ 1)",
    "self": "self: mean A[i, i]",
    "induction": "induction: mean A[i, i-R+1] on a repeat",
    "duplicate_token": "duplicate token: mean A[i, i-R] on a repeat",
}


HEAD_AXIS_PX = 160  # the narrowest a score map's head axis is drawn (one of three columns, less its colour bar)
REPEAT_SCORES = ("induction", "duplicate_token")  # read on the seeded random repeat, not the user's text


def score_matrix(scores: pd.DataFrame, score: str, stack: str) -> np.ndarray:
    """L x H matrix of one score for one stack (NaN where a head has no row)."""
    rows = scores[scores["stack"] == stack]
    n_layers, n_heads = int(rows["layer"].max()) + 1, int(rows["head"].max()) + 1
    z = np.full((n_layers, n_heads), np.nan)
    z[rows["layer"].to_numpy(), rows["head"].to_numpy()] = rows[score].to_numpy()
    return z


def score_heatmap(scores: pd.DataFrame, score: str, stack: str, title: Optional[str] = None,
                  selected: Optional[Tuple[int, int]] = None) -> go.Figure:
    """One score as a layer (rows, top to bottom) x head (columns) heatmap on a 0-1 scale,
    with a click target per cell (customdata [layer, head, score]); selected is outlined."""
    z = score_matrix(scores, score, stack)
    n_layers, n_heads = z.shape
    heat = go.Heatmap(z=z, x=list(range(n_heads)), y=list(range(n_layers)), zmin=0, zmax=1, colorscale=ATTN_SCALE,
                      colorbar=dict(thickness=10, len=0.8), hoverongaps=False,
                      hovertemplate="layer %{y} · head %{x}<br>" + score + " %{z:.3f}<extra></extra>")
    layer_idx, head_idx = np.meshgrid(np.arange(n_layers), np.arange(n_heads), indexing="ij")
    # plain lists (not base64 arrays), so the browser's click handler reads [layer, head] as numbers
    custom = np.stack([layer_idx.ravel(), head_idx.ravel(), np.nan_to_num(z.ravel(), nan=-1.0)], axis=1)
    cell = 22 if n_layers > 12 else 36
    targets = go.Scatter(
        x=head_idx.ravel().tolist(), y=layer_idx.ravel().tolist(), mode="markers", customdata=custom.tolist(),
        showlegend=False, name="heads",
        marker=dict(symbol="square", size=cell - 4, opacity=0, color="#000000"),
        selected=dict(marker=dict(opacity=0)), unselected=dict(marker=dict(opacity=0)),
        hovertemplate="layer %{customdata[0]} · head %{customdata[1]}<br>" + score
                      + " %{customdata[2]:.3f}<br>click to open this head in Explore<extra></extra>")
    fig = go.Figure([heat, targets])
    # head labels stay level (plotly turns crowded ones upright, into the title above): every k-th
    # head, as many as fit the narrowest plot (a third of a page, less the colour bar)
    label_px = CHAR_PX * len(f"H{n_heads - 1}") + 4  # CHAR_PX is an upper bound; 4 px apart
    every = max(1, int(np.ceil(n_heads * label_px / HEAD_AXIS_PX)))
    fig.update_xaxes(tickvals=list(range(0, n_heads, every)), ticktext=[f"H{h}" for h in range(0, n_heads, every)],
                     side="top", tickangle=0, showgrid=False, zeroline=False)
    rows = list(range(0, n_layers, 1 if n_layers <= 12 else 2))
    rows += [n_layers - 1] if rows[-1] != n_layers - 1 else []  # the last layer always named
    fig.update_yaxes(tickvals=rows, ticktext=[f"L{l}" for l in rows],
                     autorange="reversed", showgrid=False, zeroline=False)
    if selected is not None:
        li, h = selected
        fig.add_shape(type="rect", x0=h - 0.5, x1=h + 0.5, y0=li - 0.5, y1=li + 0.5, line=dict(color="#d62728", width=3))
    fig.update_layout(title=dict(text=title or SCORE_LABELS.get(score, score), x=0), height=90 + cell * n_layers,
                      margin=dict(l=10, r=10, t=80, b=10), plot_bgcolor="white", hovermode="closest", dragmode=False)
    return fig


def head_pick(point: dict) -> Optional[Tuple[int, int]]:
    """(layer, head) of a clicked point of score_heatmap, or None."""
    cd = point.get("customdata")
    if isinstance(cd, (list, tuple)) and len(cd) >= 2:
        try:
            return int(cd[0]), int(cd[1])
        except (TypeError, ValueError):
            return None
    try:
        return int(point["y"]), int(point["x"])
    except (KeyError, TypeError, ValueError):
        return None


def _token_axis(tokens: Sequence[str]):
    """Positions with the tokens as tick labels, markup escaped (repeated tokens stay separate rows)."""
    return list(range(len(tokens))), safe_labels([str(t) for t in tokens])


def rollout_heatmap(rollout: np.ndarray, tokens: Sequence[str], query: int, title: str = "") -> go.Figure:
    """Rollout layer by layer for one token: row l is R[l, query, :], how much of the token
    after layer l comes from each input token (each row sums to 1)."""
    z = np.asarray(rollout)[:, query, :]
    pos, labels = _token_axis(tokens)
    n_layers = z.shape[0]
    fig = go.Figure(go.Heatmap(
        z=z, x=pos, y=list(range(n_layers)), zmin=0, zmax=float(max(z.max(), 1e-9)), colorscale=ATTN_SCALE,
        customdata=np.broadcast_to(np.array(labels, dtype=str), z.shape),
        hovertemplate="after layer %{y}<br>from input %{customdata} (%{x})<br>share %{z:.3f}<extra></extra>"))
    fig.update_xaxes(tickvals=pos, ticktext=labels, side="top", tickangle=-60, title="input token")
    rows = list(range(0, n_layers, 1 if n_layers <= 12 else 2))
    rows += [n_layers - 1] if rows[-1] != n_layers - 1 else []
    fig.update_yaxes(title="after layer", autorange="reversed", tickvals=rows, ticktext=[str(l) for l in rows])
    fig.update_layout(title=dict(text=title or f"Rollout of token {query} ({labels[query]}) through the layers", x=0),
                      height=150 + max(28 * n_layers, 140), margin=dict(l=10, r=10, t=140, b=10),
                      plot_bgcolor="white")
    return fig


def side_by_side(raw: np.ndarray, rolled: np.ndarray, flowed: Optional[np.ndarray], tokens: Sequence[str],
                 query: int, title: str = "") -> go.Figure:
    """Three bar charts for one token: the last layer's raw attention row (heads averaged),
    its rollout row and its flow row (flow None: a note instead), one bar per input token."""
    pos, labels = _token_axis(tokens)
    panels = [("last layer's attention", raw), ("rollout", rolled), ("flow", flowed)]
    fig = make_subplots(rows=1, cols=3, shared_yaxes=True, horizontal_spacing=0.04,
                        subplot_titles=[p[0] if p[1] is not None else "flow (not computed)" for p in panels])
    for c, (name, values) in enumerate(panels, start=1):
        if values is None:
            continue
        values = np.asarray(values, dtype=float)
        fig.add_trace(go.Bar(x=values, y=pos, orientation="h", name=name, showlegend=False, customdata=labels,
                             marker=dict(color=values, colorscale=ATTN_SCALE, cmin=0, cmax=float(max(values.max(), 1e-9))),
                             hovertemplate=name + "<br>%{customdata} (%{y}): %{x:.3f}<extra></extra>"), row=1, col=c)
    fig.update_yaxes(tickvals=pos, ticktext=labels, autorange="reversed", row=1, col=1)
    fig.update_layout(title=dict(text=title or f"Where token {query} ({labels[query]}) gets its information", x=0),
                      height=140 + 18 * len(pos), margin=dict(l=10, r=10, t=90, b=10), plot_bgcolor="white",
                      bargap=0.15)
    return fig


LEARNED_SINK = "learned_sink"


def learned_sink_scores(trace, stack: str) -> Optional[pd.DataFrame]:
    """A model with learned sinks (gpt-oss): each self-attention head's sink share (its `.sink`,
    the softmax's part that no key owns), mean over the queries, as rows (stack, layer, head,
    learned_sink) that score_heatmap draws; None without learned sinks."""
    rows = []
    for i in range(trace.layers(stack)):
        name = tn.attn(stack, i, tn.SELF, "sink")
        if name not in trace:
            return None
        for h, v in enumerate(trace[name].double().mean(-1).tolist()):
            rows.append({"stack": stack, "layer": i, "head": h, LEARNED_SINK: v})
    return pd.DataFrame(rows) if rows else None
