"""Figures and words for "Why here?": one score of a head taken apart into query-side x
key-side terms (core.analysis.score_attribution), and a head's whole pattern taken apart the
same way (core.analysis.pattern_attribution). Pure: DataFrames in, Plotly figures and strings
out; the panel that shows them is viz/ui/why_panel.py.
"""

from __future__ import annotations

import re
from typing import List, Optional, Sequence

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from viz.figures.heatmaps import DIVERGING, safe_label

_HEAD = re.compile(r"^(enc\.)?L(\d+)(x?)H(\d+)$")
_PART = re.compile(r"^(enc\.)?L(\d+)\.(attn|cross_attn|attn_bias|cross_attn_bias|mlp)$")
MAX_AXIS = 64  # components drawn on a heatmap axis: the largest in size, the rest summed into "other"


def _order_key(name: str):
    """Components in the stream's order: embeddings, then layer by layer, biases last."""
    pre = 1 if name.startswith("enc.") else 0
    base = name[4:] if pre else name
    first = {"embed": 0, "positions": 1, "types": 2}
    if base in first:
        return (pre, -1, first[base], 0)
    m = _HEAD.match(name)
    if m:
        return (pre, int(m.group(2)), 1 if not m.group(3) else 3, int(m.group(4)))
    m = _PART.match(name)
    if m:
        return (pre, int(m.group(2)), {"attn": 1, "attn_bias": 2, "cross_attn": 3, "cross_attn_bias": 4,
                                        "mlp": 5}[m.group(3)], 0)
    return (pre, 10**6, 0, 0)  # bias, other


def ordered(names: Sequence[str]) -> List[str]:
    return sorted(set(names), key=_order_key)


def describe(name: str, token: Optional[str] = None) -> str:
    """A component in words, at a token: "L3H2's write at 'Mary'", "the token embedding of 'John'"."""
    at = f" at '{token.strip() or token}'" if token is not None else ""
    of = f" of '{token.strip() or token}'" if token is not None else ""
    enc = "the encoder's " if name.startswith("enc.") else ""
    base = name[4:] if name.startswith("enc.") else name
    if base == "embed":
        return f"{enc}token embedding{of}"
    if base == "positions":
        return f"{enc}position vector{of}"
    if base == "types":
        return f"{enc}token-type vector{of}"
    if base == "bias":
        return f"{enc}biases (norms' shifts and the projection's bias){at}"
    if base == "other":
        return f"the other components{at}"
    m = _HEAD.match(name)
    if m:
        label = f"L{m.group(2)}{'x' if m.group(3) else ''}H{m.group(4)}"
        what = "cross-attention head" if m.group(3) else "head"
        return f"{enc}{label}'s write ({what}){at}" if enc else f"{label}'s write{at}"
    m = _PART.match(name)
    if m:
        layer, part = m.group(2), m.group(3)
        words = {"attn": f"layer {layer}'s attention", "cross_attn": f"layer {layer}'s cross-attention",
                 "attn_bias": f"layer {layer}'s attention output bias",
                 "cross_attn_bias": f"layer {layer}'s cross-attention output bias", "mlp": f"layer {layer}'s MLP"}
        return f"{enc}{words[part]}{at}"
    return f"{enc}{base}{at}"


def top_terms(df: pd.DataFrame, k: int = 5) -> pd.DataFrame:
    """The k terms largest in size, largest first (query_component, key_component, term)."""
    order = df["term"].abs().sort_values(ascending=False, kind="stable").index[:k]
    return df.loc[order].reset_index(drop=True)


def term_sentences(df: pd.DataFrame, query_token: Optional[str], key_token: Optional[str], k: int = 5,
                   versus_token: Optional[str] = None) -> List[str]:
    """The top k terms in words: "L3H2's write at 'Mary' (query) × the token embedding of 'John' (key): +2.10"."""
    key_words = key_token if versus_token is None else None
    out = []
    for row in top_terms(df, k).itertuples(index=False):
        kdesc = describe(row.key_component, key_words)
        if versus_token is not None:
            kdesc += f" at '{(key_token or '').strip()}' less at '{versus_token.strip()}'"
        out.append(f"{describe(row.query_component, query_token)} (query) × {kdesc} (key): {row.term:+.3f}")
    return out


def term_matrix(df: pd.DataFrame, max_axis: int = MAX_AXIS):
    """(query labels, key labels, matrix) of the terms, each axis in the stream's order; past
    max_axis components an axis keeps its largest (by the marginal's size) and sums the rest
    into "other"."""
    def keep(side: str) -> List[str]:
        marg = df.groupby(side)["term"].apply(lambda t: t.abs().sum())
        names = ordered(marg.index)
        if len(names) <= max_axis:
            return names
        big = set(marg.sort_values(ascending=False).index[: max_axis - 1])
        return [n for n in names if n in big] + ["other"]

    qs, ks = keep("query_component"), keep("key_component")
    q = df["query_component"].where(df["query_component"].isin(qs), "other")
    k = df["key_component"].where(df["key_component"].isin(ks), "other")
    m = pd.DataFrame({"q": q, "k": k, "t": df["term"]}).pivot_table(index="q", columns="k", values="t", aggfunc="sum",
                                                                    fill_value=0.0)
    m = m.reindex(index=qs, columns=ks, fill_value=0.0)
    return qs, ks, m.to_numpy(dtype=float)


def terms_heatmap(df: pd.DataFrame, title: str = "", height: Optional[int] = None) -> go.Figure:
    """Query-side components (rows) x key-side components (columns), each cell a term, blue < 0 < red."""
    qs, ks, z = term_matrix(df)
    span = float(np.abs(z).max()) or 1.0
    fig = go.Figure(go.Heatmap(
        z=z, x=ks, y=qs, zmin=-span, zmax=span, colorscale=DIVERGING, xgap=1, ygap=1,
        colorbar=dict(thickness=10, title=dict(text="term", side="right")),
        hovertemplate="query side: %{y}<br>key side: %{x}<br>term: %{z:+.4f}<extra></extra>"))
    h = height or int(min(900, max(300, 16 * len(qs) + 200)))
    fig.update_layout(title=dict(text=title, x=0, font=dict(size=14)), height=h,
                      margin=dict(l=10, r=10, t=50, b=10),
                      xaxis=dict(title="key side", side="bottom", tickangle=-60, type="category"),
                      yaxis=dict(title="query side", autorange="reversed", type="category"))
    return fig


def marginals(df: pd.DataFrame):
    """(query-side sums over the key side, key-side sums over the query side), each in the stream's order."""
    q = df.groupby("query_component")["term"].sum()
    k = df.groupby("key_component")["term"].sum()
    return q.reindex(ordered(q.index)), k.reindex(ordered(k.index))


def marginal_bars(df: pd.DataFrame, title: str = "") -> go.Figure:
    """The two marginals side by side as bars: what each component adds through the query side
    (summed over every key-side component), and through the key side."""
    q, k = marginals(df)
    fig = make_subplots(rows=1, cols=2, subplot_titles=("query side (summed over the key side)",
                                                        "key side (summed over the query side)"))
    for col, s in ((1, q), (2, k)):
        fig.add_trace(go.Bar(x=list(s.index), y=s.to_numpy(), marker_color=np.where(s.to_numpy() >= 0, "#b2182b",
                                                                                      "#2166ac"),
                             hovertemplate="%{x}: %{y:+.4f}<extra></extra>", showlegend=False), row=1, col=col)
        fig.update_xaxes(type="category", tickangle=-60, row=1, col=col)
    fig.update_layout(title=dict(text=title, x=0, font=dict(size=14)), height=360, margin=dict(l=10, r=10, t=60, b=10))
    return fig


def row_figure(scaled: Sequence[float], weights: Sequence[float], tokens: Sequence[str], key: int,
               versus: Optional[int] = None, title: str = "") -> go.Figure:
    """The query's row: every key's score (bars; masked keys left out) and the softmax's weights
    that turn them into attention (line), the clicked key in red and the "versus" key in blue."""
    s = np.asarray(scaled, dtype=float)
    w = np.asarray(weights, dtype=float)
    labels = [f"{j}: {safe_label(t)}" for j, t in enumerate(tokens)]
    colours = ["#b2182b" if j == key else "#2166ac" if j == versus else "#bbbbbb" for j in range(len(s))]
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.08,
                        subplot_titles=("score s_ij (scaled, before the mask)", "weight a_ij = softmax(masked row)"))
    fig.add_trace(go.Bar(x=labels, y=np.where(np.isfinite(s), s, np.nan), marker_color=colours, showlegend=False,
                         hovertemplate="%{x}<br>score %{y:.4f}<extra></extra>"), row=1, col=1)
    fig.add_trace(go.Bar(x=labels, y=w, marker_color=colours, showlegend=False,
                         hovertemplate="%{x}<br>weight %{y:.4f}<extra></extra>"), row=2, col=1)
    fig.update_xaxes(type="category", tickangle=-60)
    fig.update_layout(title=dict(text=title, x=0, font=dict(size=14)), height=420, margin=dict(l=10, r=10, t=60, b=10))
    return fig


MAX_CLICK_CELLS = 64 * 64  # maps with more cells get no click targets (Explore draws blocks past its own limit)


def add_cell_targets(fig: go.Figure, transposed: bool = False) -> bool:
    """Make every cell of the figure's first heatmap clickable: plotly heatmaps cannot be
    selected (Streamlit's on_select returns no points for them; viz/figures/grid.py), so one invisible
    square marker per cell, at the cell's centre, carries customdata [query, key]. transposed:
    the heatmap's rows are keys and its columns queries (the notes' column notation). Returns
    False (and adds nothing) past MAX_CLICK_CELLS cells."""
    heat = next((t for t in fig.data if t.type == "heatmap"), None)
    if heat is None or heat.z is None:
        return False
    z = np.asarray(heat.z)
    n_y, n_x = z.shape[0], z.shape[1]
    if n_x * n_y > MAX_CLICK_CELLS:
        return False
    xs = list(heat.x) if heat.x is not None else list(range(n_x))
    ys = list(heat.y) if heat.y is not None else list(range(n_y))
    px, py, custom = [], [], []
    for r in range(n_y):
        for c in range(n_x):
            px.append(xs[c])
            py.append(ys[r])
            custom.append([c, r] if transposed else [r, c])
    # small markers: plotly picks the marker nearest the pointer (its distance less the marker's
    # radius), so markers wider than a cell would tie with their neighbours'
    size = 6
    fig.add_trace(go.Scatter(
        x=px, y=py, mode="markers", customdata=custom, showlegend=False, name="cells",
        xaxis=heat.xaxis or "x", yaxis=heat.yaxis or "y",
        marker=dict(symbol="square", size=size, opacity=0, color="#000000"),
        selected=dict(marker=dict(opacity=0)), unselected=dict(marker=dict(opacity=0)),
        hovertemplate="query %{customdata[0]} → key %{customdata[1]}<br>click: why here?<extra></extra>"))
    return True
