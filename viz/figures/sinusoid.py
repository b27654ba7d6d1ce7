"""The sinusoidal positional encoding computed, and a positions x dimensions matrix drawn: what
the Positions page (viz/positions/) and the home path (viz/home/) both show.

Transformers handout (eq. 2-3), in radians as in Vaswani et al. (2017):
    PE[i, 2j]   = sin(i / 10000^(2j/d))
    PE[i, 2j+1] = cos(i / 10000^(2j/d))
No Streamlit here.
"""

from __future__ import annotations

from typing import Optional, Sequence

import numpy as np
import plotly.graph_objects as go

from viz.figures.heatmaps import DIVERGING, fixed_margins_layout, matrix_heatmap, to_numpy
from viz.figures.reduce import tick_indices


def pe_matrix(n: int, d: int, layout: str = "interleaved", base: float = 10000.0) -> np.ndarray:
    """P (n x d) in float64 numpy, written out from the formula (Vaswani et al. 2017, radians):
    PE[i, 2j] = sin(i / base^(2j/d)), PE[i, 2j+1] = cos(i / base^(2j/d)); layout "half" puts the
    sines in the first d/2 features and the cosines in the rest (Marian's layout). Written here
    again, not taken from core.sinusoidal_encoding, so the page's check of the model's P holds
    two independent computations against each other."""
    i = np.arange(n, dtype=np.float64)[:, None]
    angle = i / base ** (np.arange(0, d, 2, dtype=np.float64)[None, :] / d)  # n x ceil(d/2)
    pe = np.zeros((n, d))
    if layout == "half":
        h = d // 2
        pe[:, :h] = np.sin(angle[:, :h])
        pe[:, h:2 * h] = np.cos(angle[:, :h])
    elif layout == "interleaved":
        pe[:, 0::2] = np.sin(angle)
        pe[:, 1::2] = np.cos(angle[:, : d // 2])
    else:
        raise ValueError(f"unknown sinusoid layout {layout!r}")
    return pe


def positional_heatmap(P, rows: Optional[Sequence[int]] = None, cols: Optional[Sequence[int]] = None,
                       *, title: str = "", y_title: str = "position i", height: Optional[int] = None,
                       y_labels: Optional[Sequence[str]] = None) -> go.Figure:
    """Heatmap of a positions x dimensions matrix on a fixed -1..1 diverging scale.

    rows / cols are the original indices of the shown rows / columns (after striding)."""
    z = to_numpy(P)
    rows = list(range(z.shape[0])) if rows is None else list(rows)
    cols = list(range(z.shape[1])) if cols is None else list(cols)
    lim = max(1.0, float(np.nanmax(np.abs(z))) if z.size else 1.0)
    x_labels = [str(c) for c in cols]
    ticks = {"xaxis": axis_ticks(x_labels, 16)}
    if y_labels is None:
        ticks["yaxis"] = axis_ticks([str(r) for r in rows], 16)
    return matrix_heatmap(
        z,
        y_labels if y_labels is not None else [str(r) for r in rows],
        x_labels,
        title=title,
        zmin=-lim,
        zmax=lim,
        colorscale=DIVERGING,
        x_title="dimension",
        y_title=y_title,
        value_name="PE",
        height=height or int(min(720, max(360, 160 + 4 * len(rows)))),
        hover_from_axes=True,  # the hover reads a cell's indices from the axes: no two labels per cell to send
        layout=fixed_layout(ticks, y_labels, title),
    )


def axis_ticks(labels: Sequence[str], max_ticks: int) -> dict:
    """At most max_ticks evenly spaced, unrotated tick labels on a numeric axis (an axis's layout)."""
    idx = tick_indices(len(labels), max_ticks)
    return dict(tickvals=idx, ticktext=[labels[i] for i in idx], tickangle=0)


def fixed_layout(ticks: dict, y_labels: Optional[Sequence[str]], title: str) -> dict:
    """The heatmap's ticks, and margins that fit their labels instead of plotly's automargin, which
    measures every tick label in the browser and draws the figure again when the margins move
    (most of the Positions page's drawing time)."""
    ys = ticks["yaxis"]["ticktext"] if "yaxis" in ticks else list(y_labels or [])
    layout = fixed_margins_layout(ys, ticks["xaxis"]["ticktext"], bool(title))
    for ax, upd in ticks.items():
        layout[ax].update(upd)
    return layout
