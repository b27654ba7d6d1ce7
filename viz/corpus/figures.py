"""Queries and keys of a whole corpus in one scatter per head (AttentionViz's joint view).

    rows, q, k = core.cli.corpus_job.head_vectors(table, layer, head)
    xy = core.analysis.joint.joint_embedding(q, k, "pca")          # (2N, 2): queries, then keys
    fig = joint_scatter(xy, rows, color_by="type")         # plotly WebGL scatter

Every point carries customdata [sentence_id, position, is_key] (clicks open that sentence);
its hover shows the token inside its sentence, the token marked. The per-point text is only
that window of the sentence (hovertext, one list for both traces); "query/key · sentence s ·
position p" comes from each trace's hovertemplate and the customdata, so no point's text is
sent twice (what it saves: docs/decisions.md, "Measurements moved from the code"). head_multiples draws every head of a layer as small multiples; a
click there carries the head (customdata [head]).
"""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from viz.figures.text import html_text

QUERY_COLOUR, KEY_COLOUR = "#1b9e77", "#e7298a"  # AttentionViz: queries green, keys pink
COLOR_BY = {"type": "query / key", "position": "position", "token": "token (most frequent)"}
N_TOKEN_COLOURS = 10
TOKEN_PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#bcbd22",
                 "#17becf", "#7f7f7f"]
OTHER_COLOUR = "#d0d0d0"
HOVER_WINDOW = 8  # tokens either side of the marked one


def sentence_tokens(rows: pd.DataFrame) -> Dict[int, List[str]]:
    """sentence_id -> its tokens in order, from one head's rows (every token is a row)."""
    out: Dict[int, List[str]] = {}
    for sid, pos, tok in zip(rows.sentence_id.to_numpy(), rows.position.to_numpy(), rows.token.to_numpy()):
        toks = out.setdefault(int(sid), [])
        if pos == len(toks):
            toks.append(tok)
    return out


def token_in_sentence(tokens: Sequence[str], position: int, window: int = HOVER_WINDOW) -> str:
    """The sentence as hover HTML with the token at `position` marked: … a b <b>[c]</b> d …"""
    return _marked([html_text(t) for t in tokens], position, window)


def _marked(escaped: Sequence[str], position: int, window: int) -> str:
    lo, hi = max(0, position - window), min(len(escaped), position + window + 1)
    parts = list(escaped[lo:position]) + [f"<b>[{escaped[position]}]</b>"] + list(escaped[position + 1:hi])
    return ("… " if lo > 0 else "") + " ".join(parts) + (" …" if hi < len(escaped) else "")


def hover_windows(rows: pd.DataFrame, window: int = HOVER_WINDOW) -> List[str]:
    """Per row, token_in_sentence of its sentence at its position (each sentence escaped once)."""
    escaped = {sid: [html_text(t) for t in toks] for sid, toks in sentence_tokens(rows).items()}
    return [_marked(escaped[int(sid)], int(pos), window)
            for sid, pos in zip(rows.sentence_id.to_numpy(), rows.position.to_numpy())]


def _token_colours(tok: np.ndarray):
    """Per token a colour code (0..len(top)-1: the most frequent tokens, len(top): any other), and
    a discrete colorscale that maps the codes onto TOKEN_PALETTE and OTHER_COLOUR. Codes, not
    20,000 colour strings: plotly checks every string, which took ~1 s."""
    counts = pd.Series(tok).value_counts()
    top = list(counts.index[:N_TOKEN_COLOURS])
    codes = pd.Categorical(tok, categories=top).codes.astype(np.int32)  # -1: not among them
    codes[codes < 0] = len(top)
    palette = TOKEN_PALETTE[: len(top)] + [OTHER_COLOUR]
    scale = [[(i + j) / len(palette), c] for i, c in enumerate(palette) for j in (0, 1)]
    return dict(color=codes, colorscale=scale, cmin=-0.5, cmax=len(palette) - 0.5, showscale=False), top


SVG_MAX_POINTS = 4_000  # the joint scatter draws as SVG up to this many points, as WebGL above


def joint_scatter(xy: np.ndarray, rows: pd.DataFrame, color_by: str = "type", title: str = "",
                  height: int = 640, marker_size: int = 5) -> go.Figure:
    """Queries (first N rows of xy) and keys (last N) of one head as a scatter: SVG up to
    SVG_MAX_POINTS points, WebGL above (WebGL's fixed start-up, ~0.4 s under software
    rendering, costs more than SVG's per-point drawing on a few thousand points)."""
    n = len(rows)
    xy = np.asarray(xy, dtype=np.float64)
    assert xy.shape == (2 * n, 2), (xy.shape, n)
    hover = hover_windows(rows)  # one list for both traces; the rest of the label is each trace's template
    sid = rows.sentence_id.to_numpy()
    pos = rows.position.to_numpy()
    tok = rows.token.to_numpy()
    fig = go.Figure()
    top: List[str] = []
    if color_by == "token":
        token_marker, top = _token_colours(tok)
    for side, (lo, hi), symbol in (("query", (0, n), "circle"), ("key", (n, 2 * n), "diamond")):
        marker = dict(size=marker_size, symbol=symbol, opacity=0.75)
        if color_by == "position":
            marker.update(color=pos, colorscale="Viridis", cmin=0, cmax=max(int(pos.max()) if n else 1, 1),
                          showscale=side == "query", colorbar=dict(title="position"))
        elif color_by == "token":
            marker.update(token_marker)
        else:
            marker.update(color=QUERY_COLOUR if side == "query" else KEY_COLOUR)
        fig.add_trace((go.Scatter if 2 * n <= SVG_MAX_POINTS else go.Scattergl)(
            x=xy[lo:hi, 0], y=xy[lo:hi, 1], mode="markers", name="queries" if side == "query" else "keys", marker=marker,
            customdata=np.stack([sid, pos, np.full(n, int(side == "key"))], axis=1), hovertext=hover,
            hovertemplate=f"<b>{side}</b> · sentence %{{customdata[0]}} · position %{{customdata[1]}}<br>"
                          "%{hovertext}<extra></extra>"))
    if color_by == "token" and top:
        legend = ", ".join(f"<span style='color:{TOKEN_PALETTE[i]}'>■</span> {html_text(t)}" for i, t in enumerate(top))
        fig.add_annotation(text=legend + f" · <span style='color:{OTHER_COLOUR}'>■</span> other", showarrow=False,
                           xref="paper", yref="paper", x=0, y=-0.08, xanchor="left", align="left")
    fig.update_layout(title=title or None, height=height, margin=dict(l=20, r=20, t=50 if title else 20, b=50),
                      legend=dict(orientation="h", y=1.02, x=1, xanchor="right", yanchor="bottom",
                                  itemsizing="constant"),
                      xaxis=dict(showticklabels=False, zeroline=False, title=None),
                      yaxis=dict(showticklabels=False, zeroline=False, title=None, scaleanchor="x"),
                      hoverlabel=dict(align="left"), dragmode="pan")
    return fig


def head_multiples(xys: Sequence[np.ndarray], n_points: int, n_cols: int = 4, title: str = "",
                   panel_height: int = 230) -> go.Figure:
    """Every head of a layer: one small joint scatter per head (queries green, keys pink).
    xys[h] is head h's (2N, 2) joint embedding; a point's customdata is [head]."""
    n_heads = len(xys)
    n_rows = -(-n_heads // n_cols)
    fig = make_subplots(rows=n_rows, cols=n_cols, subplot_titles=[f"head {h}" for h in range(n_heads)],
                        horizontal_spacing=0.02, vertical_spacing=0.06)
    for h, xy in enumerate(xys):
        r, c = h // n_cols + 1, h % n_cols + 1
        for side, lo, hi, colour in (("queries", 0, n_points, QUERY_COLOUR), ("keys", n_points, 2 * n_points, KEY_COLOUR)):
            fig.add_trace(go.Scattergl(x=xy[lo:hi, 0], y=xy[lo:hi, 1], mode="markers", name=side,
                                       marker=dict(size=3, color=colour, opacity=0.6), showlegend=h == 0,
                                       legendgroup=side, customdata=np.full((hi - lo, 1), h),
                                       hovertemplate=f"head {h} · {side}<extra></extra>"), row=r, col=c)
    fig.update_xaxes(showticklabels=False, zeroline=False, showgrid=False)
    fig.update_yaxes(showticklabels=False, zeroline=False, showgrid=False)
    fig.update_layout(title=title or None, height=panel_height * n_rows + 60,
                      margin=dict(l=10, r=10, t=60 if title else 30, b=10),
                      legend=dict(orientation="h", y=1.0, x=1, xanchor="right", yanchor="bottom"))
    return fig


def _as_list(cd) -> Optional[list]:
    """A selection point's customdata as a list: the browser sends a list, or (from a typed
    array) an object {"0": .., "1": ..}."""
    if isinstance(cd, (list, tuple)):
        return list(cd)
    if isinstance(cd, dict):
        try:
            return [cd[k] for k in sorted(cd, key=int)]
        except (TypeError, ValueError):
            return None
    return None


def picked_point(points, rows: Optional[pd.DataFrame] = None) -> Optional[dict]:
    """The first clicked point of a joint scatter selection -> {sentence_id, position, is_key}:
    from its customdata, else (given the drawn rows) from its curve and point index."""
    for p in points or []:
        cd = _as_list(p.get("customdata"))
        try:
            if cd is not None and len(cd) >= 2:
                return {"sentence_id": int(cd[0]), "position": int(cd[1]), "is_key": bool(cd[2]) if len(cd) > 2 else False}
            i = p.get("point_index", p.get("pointIndex"))
            if rows is not None and i is not None and 0 <= int(i) < len(rows):
                r = rows.iloc[int(i)]
                return {"sentence_id": int(r.sentence_id), "position": int(r.position),
                        "is_key": p.get("curve_number", p.get("curveNumber")) == 1}
        except (TypeError, ValueError):
            continue
    return None


def picked_head(points) -> Optional[int]:
    for p in points or []:
        cd = _as_list(p.get("customdata"))
        if cd:
            try:
                return int(cd[0])
            except (TypeError, ValueError):
                continue
    return None
