"""Inside a head's figures of a token mixer's recurrence (viz/inside/recurrence.py): the gates
over the steps, the state at one step, a step's vectors, and the mixer's implicit attention
beside the softmax it replaces. Pure: arrays in, plotly Figures out."""

from __future__ import annotations

import math
from typing import Dict, Optional, Sequence

import numpy as np
import plotly.graph_objects as go

from viz.figures.mixer import MAX_MAP_PX, MAX_TICKS, SIGNED_SCALE, signed_limit


def gates_figure(series: Dict[str, np.ndarray], tokens: Sequence[str], t: int, title: str) -> go.Figure:
    """Each gate (name -> one value per step) as a line over the tokens, step t marked."""
    x = list(range(len(tokens)))
    fig = go.Figure()
    for name, y in series.items():
        fig.add_trace(go.Scatter(x=x, y=np.asarray(y, dtype=float), mode="lines+markers", name=name,
                                 customdata=list(tokens), hovertemplate=f"t=%{{x}} (%{{customdata}})<br>{name} = "
                                                                        "%{y:.4f}<extra></extra>"))
    fig.add_vline(x=t, line=dict(color="red", dash="dot"))
    fig.update_layout(title=title, height=300, xaxis=dict(title="step t", tickvals=x, ticktext=list(tokens)),
                      yaxis_title="value", margin=dict(t=50, b=40))
    return fig


def state_figure(S: np.ndarray, title: str, rows: str, cols: str) -> go.Figure:
    """A state matrix at one step, signed, centred on zero."""
    S = np.asarray(S, dtype=float)
    lim = signed_limit(S)
    fig = go.Figure(go.Heatmap(z=S, colorscale=SIGNED_SCALE, zmid=0.0, zmin=-lim, zmax=lim,
                               colorbar=dict(title="S"), hovertemplate=f"{rows} %{{y}}, {cols} %{{x}}<br>%{{z:.5f}}"
                                                                       "<extra></extra>"))
    fig.update_layout(title=title, height=380, xaxis_title=cols, yaxis=dict(title=rows, autorange="reversed"))
    return fig


def vectors_figure(vectors: Dict[str, np.ndarray], title: str, x_title: str) -> go.Figure:
    """A step's vectors (name -> values) as grouped bars over their features."""
    fig = go.Figure()
    for name, y in vectors.items():
        y = np.asarray(y, dtype=float)
        fig.add_trace(go.Bar(x=list(range(len(y))), y=y, name=name,
                             hovertemplate=f"{name}[%{{x}}] = %{{y:.5f}}<extra></extra>"))
    fig.update_layout(title=title, barmode="group", height=300, xaxis_title=x_title, margin=dict(t=50, b=40))
    return fig


def beside_figure(a: np.ndarray, soft: np.ndarray, tokens: Sequence[str], label: str,
                  t: Optional[int] = None) -> go.Figure:
    """The mixer's implicit attention A (signed scale) beside softmax(q kᵀ/√d_k + M) of the same
    q and k (0 to 1), query rows, key columns."""
    from plotly.subplots import make_subplots

    a, soft = np.asarray(a, dtype=float), np.asarray(soft, dtype=float)
    lim = signed_limit(a)
    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.12,
                        subplot_titles=(f"{label}: implicit A (signed)", "softmax(q kᵀ/√d_k + M), same q and k"))
    step = max(1, math.ceil(len(tokens) / MAX_TICKS))  # a label per row up to MAX_TICKS, then every k-th
    ticks = dict(tickvals=list(range(0, len(tokens), step)), ticktext=list(tokens)[::step])
    fig.add_trace(go.Heatmap(z=a, colorscale=SIGNED_SCALE, zmid=0.0, zmin=-lim, zmax=lim, name="A",
                             colorbar=dict(title="A", x=0.44, len=0.9),
                             hovertemplate="query %{y} → key %{x}<br>A = %{z:.4f} (signed)<extra></extra>"),
                  row=1, col=1)
    fig.add_trace(go.Heatmap(z=soft, colorscale="Blues", zmin=0, zmax=1, name="softmax",
                             colorbar=dict(title="softmax", x=1.0, len=0.9),
                             hovertemplate="query %{y} → key %{x}<br>weight %{z:.4f}<extra></extra>"), row=1, col=2)
    for c in (1, 2):
        fig.update_xaxes(title="key", **ticks, row=1, col=c)
        fig.update_yaxes(title="query", autorange="reversed", **ticks, row=1, col=c)
        if t is not None:
            fig.add_hline(y=t, line=dict(color="red", dash="dot"), row=1, col=c)
    fig.update_layout(height=max(360, min(26 * len(tokens), MAX_MAP_PX) + 160))
    return fig
