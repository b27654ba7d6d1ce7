"""The picture of one `Step` (viz/inside/step_model.py): a heatmap in either notation, with long token
axes drawn as blocks (viz/figures/reduce.py) and long feature axes cut, so a page never draws more
than about MAX_CELLS_DRAWN cells."""

from __future__ import annotations

import html
from typing import List, Optional, Tuple

import numpy as np
import plotly.graph_objects as go

from viz.figures.heatmaps import ATTN_SCALE, DIVERGING, add_sink_column, attention_heatmap, fixed_margins_layout, matrix_heatmap, safe_label
from viz.figures.reduce import block_means, block_size, blocks, tick_indices
from viz.inside.step_model import COLS, ROWS, Step

MAX_TOKENS_DRAWN = 128  # token axes longer than this are drawn as block means
MAX_CELLS_DRAWN = 16_384  # feature axes are cut so a drawn matrix stays within about this many cells
MIN_FEATURES_DRAWN = 64  # ... but never to fewer features than this
SHOW_VALUES_UP_TO = 12  # n x n maps this small print their numbers, like the notes' tables
TOKEN_AXES = ("token", "query", "key", "position")


def _fit_axis(n: int, labels: List[str], is_token: bool, max_tokens: int, max_features: int):
    """(factor, keep, labels, note) for one axis: token axes are block-averaged, feature
    axes are cut to their first max_features entries."""
    if is_token and n > max_tokens:
        f = block_size(n, max_tokens)
        lab = [f"{g[0]}–{g[-1]} {labels[g[0]]}…" for g in blocks(n, max_tokens)]
        return f, n, lab, f"{n} tokens drawn as {len(lab)} blocks of {f} (block means)"
    if not is_token and n > max_features:
        return 1, max_features, labels[:max_features], f"features 0–{max_features - 1} of {n} shown"
    return 1, n, list(labels), ""


def _feature_budget(m_shape, axes, max_tokens: int, max_features: Optional[int]) -> int:
    if max_features is not None:
        return max_features
    drawn_tokens = 1
    for n, a in zip(m_shape, axes):
        if a in TOKEN_AXES:
            drawn_tokens *= min(n, max_tokens)
    return max(MIN_FEATURES_DRAWN, MAX_CELLS_DRAWN // max(1, drawn_tokens))


def drawn_matrix(step: Step, notation: str = ROWS, max_tokens: int = MAX_TOKENS_DRAWN,
                 max_features: Optional[int] = None):
    """What is drawn for a step: (z, row_labels, col_labels, row_axis, col_axis, note).

    Row form unless notation == COLS, which transposes the picture (and its labels).
    Token axes longer than max_tokens become block means; feature axes are cut to their
    first max_features entries (default: as many as keep the picture within
    MAX_CELLS_DRAWN cells, at least MIN_FEATURES_DRAWN). `note` says what was reduced
    ('' when nothing was)."""
    m = np.asarray(step.matrix)
    (ar, ac), (lr, lc) = step.axes, (step.row_labels or [str(i) for i in range(m.shape[0])],
                                     step.col_labels or [str(j) for j in range(m.shape[1])])
    max_features = _feature_budget(m.shape, step.axes, max_tokens, max_features)
    fr, kr, lr, nr = _fit_axis(m.shape[0], lr, ar in TOKEN_AXES, max_tokens, max_features)
    fc, kc, lc, nc = _fit_axis(m.shape[1], lc, ac in TOKEN_AXES, max_tokens, max_features)
    z = m[:kr, :kc]
    weights = step.style == "attention" and fc > 1
    if fr > 1 or fc > 1:
        z = block_means(z, fr, fc, sum_columns=weights).astype(m.dtype)
    if fr > 1 and fc > 1:  # an n x n map reduced on both axes: one note
        nr, nc = (f"{m.shape[0]} × {m.shape[1]} drawn as {z.shape[0]} × {z.shape[1]} blocks of {fr} × {fc} tokens "
                  + ("(mean over a block of queries of the weight on a block of keys: rows still sum to 1)" if weights
                     else "(block means)")), ""
    elif weights:
        nc = nc.replace("(block means)", "(weights summed over each block of keys, so rows still sum to 1)")
    note = "; ".join(x for x in (nr, nc) if x)
    if notation == COLS:
        return z.T, lc, lr, ac, ar, note
    return z, lr, lc, ar, ac, note


FEATURE_TICKS = 16  # feature axes carry at most about this many tick labels
TOKEN_TICKS = 32  # long (block-averaged) token axes carry at most about this many
OUTLIER_RATIO = 4.0  # a colour scale is clipped when max |z| exceeds this times its 99th percentile


def colour_limit(z) -> Tuple[float, bool]:
    """Symmetric colour limit for a signed matrix, and whether it clips outliers.

    Residual streams of trained models carry a few huge features (hundreds, against a
    typical ±1); scaling colours to them would wash out everything else, so the limit is
    the 99th percentile of |z| when the maximum exceeds it OUTLIER_RATIO-fold. Hover
    still reads the exact values."""
    z = np.asarray(z, dtype=np.float64)
    fin = np.abs(z[np.isfinite(z)])
    if not fin.size or fin.max() == 0:
        return 1.0, False
    top, p99 = float(fin.max()), float(np.percentile(fin, 99))
    if p99 > 0 and top > OUTLIER_RATIO * p99:
        return p99, True
    return top, False


def step_figure(step: Step, notation: str = ROWS, *, max_tokens: int = MAX_TOKENS_DRAWN,
                max_features: Optional[int] = None, height: Optional[int] = None,
                title: Optional[str] = None) -> go.Figure:
    """The heatmap of one step in the chosen notation (column notation = the transpose).

    title=None: the step's title, its shape and what was reduced; pass "" for none."""
    if step.style == "softcap":
        return softcap_figure(step, title=step.title if title is None else title, height=height)
    z, rl, cl, ra, ca, note = drawn_matrix(step, notation, max_tokens, max_features)
    n_r, n_c = z.shape
    if title is None:
        r, c = step.shape(notation)
        title = f"{step.title} · {r} × {c}" + (f" (drawn: {note})" if note else "")
    small = step.axes == ("query", "key") and max(n_r, n_c) <= SHOW_VALUES_UP_TO
    if height is None:
        if ra in TOKEN_AXES:
            height = int(min(620, max(240, 120 + 22 * n_r)))
        else:  # features down the side (column notation): moderate, whatever d is
            height = int(min(460, max(300, 120 + 3 * n_r)))
    # Margins fitted to the labels drawn instead of plotly's automargin, which measures every
    # tick label in the browser and draws the figure again when the margins move (on a page of
    # eight step pictures, most of its drawing time); passed with the ticks to the constructor.
    ticks = _sparse_ticks(ra, ca, rl, cl, pooled=bool(note) and "blocks" in note)
    drawn_labels = {ax: [html.unescape(t) for t in ticks[ax]["ticktext"]] if ax in ticks else [str(t) for t in lab]
                    for ax, lab in (("xaxis", cl), ("yaxis", rl))}
    layout = fixed_margins_layout(drawn_labels["yaxis"], drawn_labels["xaxis"], bool(title))
    for ax, upd in ticks.items():
        layout[ax].update(upd)
    kw = dict(title=title, x_title=ca, y_title=ra, value_name=step.value_name, height=height, show_values=small,
              layout=layout)
    if step.style == "attention" and notation == ROWS:
        fig = attention_heatmap(z, rl, cl, title=title, show_values=small, height=height, layout=layout)
        if step.extra.get("sink") is not None and not note:  # learned sinks: a column of their own (cell for cell only)
            add_sink_column(fig, step.extra["sink"])
    elif step.style == "attention":
        fig = matrix_heatmap(z, rl, cl, zmin=0.0, zmax=1.0, colorscale=ATTN_SCALE, **kw)
    elif step.style == "mask":
        fig = matrix_heatmap(z, rl, cl, zmin=-1.0, zmax=1.0, colorscale=DIVERGING, **kw)
    elif step.style == "angle":
        fig = matrix_heatmap(z, rl, cl, zmin=0.0, colorscale="Viridis", **kw)
    else:
        a, clipped = colour_limit(z)
        fig = matrix_heatmap(z, rl, cl, zmin=-a, zmax=a, colorscale=DIVERGING, **kw)
        if clipped:
            fig.update_traces(colorbar=dict(thickness=12, title=dict(text=f"clipped<br>at ±{a:.3g}", side="top")))
    return fig


def softcap_figure(step: Step, title: str = "", height: Optional[int] = None, max_points: int = 4000) -> go.Figure:
    """Soft-capping as the curve it applies: y = c tanh(x / c) over the range of this head's
    scaled scores, the line y = x it bends away from, and each (query, key) score of the
    sentence as a point (x = scaled, y = capped; masked pairs left out), from step.matrix
    (capped) and step.extra["scaled"], ["cap"], ["mask"]."""
    c = float(step.extra["cap"])
    x = np.asarray(step.extra["scaled"], dtype=np.float64)
    y = np.asarray(step.matrix, dtype=np.float64)
    mask = step.extra.get("mask")
    keep = np.ones(x.shape, dtype=bool) if mask is None else ~np.isneginf(np.asarray(mask, dtype=np.float64))
    qi, kj = np.nonzero(keep)
    if qi.size > max_points:  # a long input: an even sample of the pairs
        pick = np.linspace(0, qi.size - 1, max_points).astype(int)
        qi, kj = qi[pick], kj[pick]
    rl, cl = step.row_labels, step.col_labels
    top = max(2.0 * c, float(np.abs(x[keep]).max()) if keep.any() else c) * 1.05
    grid = np.linspace(-top, top, 400)
    fig = go.Figure()
    fig.add_trace(go.Scatter(x=grid, y=grid, mode="lines", name="y = x (no cap)",
                             line=dict(color="#bbbbbb", dash="dot")))
    fig.add_trace(go.Scatter(x=grid, y=c * np.tanh(grid / c), mode="lines", name=f"y = {c:g}·tanh(x / {c:g})",
                             line=dict(color="#1f77b4")))
    text = [f"{safe_label(rl[a]) if a < len(rl) else a} → {safe_label(cl[b]) if b < len(cl) else b}"
            for a, b in zip(qi, kj)]
    fig.add_trace(go.Scatter(x=x[qi, kj], y=y[qi, kj], mode="markers", name="this head's scores",
                             marker=dict(size=6, color="#d62728", opacity=0.7), text=text,
                             hovertemplate="%{text}<br>scaled %{x:.3f} → capped %{y:.3f}<extra></extra>"))
    for yy in (c, -c):
        fig.add_hline(y=yy, line=dict(color="#888888", width=1, dash="dash"))
    fig.update_layout(title=title or None, height=height or 380, xaxis_title="scaled score",
                      yaxis_title="capped score", legend=dict(orientation="h", y=-0.2),
                      margin=dict(l=50, r=20, t=40 if title else 20, b=40))
    return fig


def _sparse_ticks(row_axis: str, col_axis: str, rl, cl, pooled: bool = False) -> dict:
    """Feature axes: a tick every k features (k = 1, 2, 4, 8, ...), upright. Token axes
    keep every label up to TOKEN_TICKS (the hover names every cell anyway); block-averaged
    token axes along the top name only the blocks' positions, so labels do not overlap.
    Returns the layout update ({"xaxis": {...}, "yaxis": {...}}, an axis left out when unchanged)."""
    out = {}
    for axis, labels, name, vertical in ((col_axis, cl, "xaxis", False), (row_axis, rl, "yaxis", True)):
        token = axis in TOKEN_AXES
        if token and pooled and not vertical:
            labels = [lab.split(" ")[0] for lab in labels]  # "12–15 dog…" -> "12–15"
        most = (TOKEN_TICKS if vertical else TOKEN_TICKS // 2) if token else (FEATURE_TICKS // 2 if vertical
                                                                              else FEATURE_TICKS)
        n = len(labels)
        if token and n <= most:
            continue
        idx = tick_indices(n, most, doubling=True)
        out[name] = dict(tickvals=idx, ticktext=[safe_label(labels[i]) if token else labels[i] for i in idx])
        if not token:
            out[name]["tickangle"] = 0
    return out
