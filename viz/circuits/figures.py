"""The Circuits page's figure (pure): a head's circuit (core.analysis.head_circuit's edges) drawn
layer by layer, heads as nodes at (head, layer), the stream's other components (embeddings, MLPs,
biases) in a column to the left, edges coloured by side, each edge's weight and share on hover at
its middle, and a path-patching result written on the edges it was run on."""

from __future__ import annotations

import re
from typing import Dict, Iterable, Optional, Sequence, Tuple

import pandas as pd
import plotly.graph_objects as go

from core.analysis.circuits import parse_head

SIDE_COLOURS = {"query": "#1f77b4", "key": "#ff7f0e", "value": "#2ca02c"}
_PART = re.compile(r"^L(\d+)\.(mlp|attn_bias|cross_attn_bias)$")
_CROSS = re.compile(r"^L(\d+)xH(\d+)$")
OTHER_X = {"mlp": -1.5, "attn_bias": -2.5, "cross_attn_bias": -2.5, "cross": -3.5}
EMBED_X = {"embed": -1.5, "positions": -2.5, "types": -3.5, "bias": -4.5}


def node_xy(name: str) -> Tuple[float, float]:
    """Where a component sits: a head at (head, layer); a layer's MLP / bias left of the heads,
    half a layer up (written after the heads); embeddings and the norms' shifts below layer 0."""
    lh = parse_head(name)
    if lh is not None:
        return float(lh[1]), float(lh[0])
    m = _PART.match(name)
    if m:
        return OTHER_X[m.group(2)], int(m.group(1)) + 0.5
    m = _CROSS.match(name)
    if m:
        return OTHER_X["cross"], int(m.group(1)) + 0.25
    return EMBED_X.get(name, -5.5), -1.0


def edge_label(row) -> str:
    unit = "of the head's output" if row.side == "value" else "of the pattern's score"
    return (f"{row.source} → {row.target} ({row.side}): weight {row.weight:+.4g}, share {row.share:+.1%} {unit}"
            f" · depth {row.depth}")


def edge_id(source: str, target: str, side: str) -> str:
    return f"{source}>{target}:{side}"


def parse_edge(raw: str) -> Optional[Tuple[str, str, str]]:
    """'L16H0>L18H6:key' -> ('L16H0', 'L18H6', 'key'); None if it is not one."""
    m = re.fullmatch(r"([^>:]+)>([^>:]+):(query|key|value)", str(raw or ""))
    return (m.group(1), m.group(2), m.group(3)) if m else None


def patch_label(attrs: dict) -> str:
    return f"patched: {attrs['clean']:.2f} → {attrs['patched']:.2f}"


def circuit_figure(edges: pd.DataFrame, root: Tuple[int, int], n_heads: int, expanded: Iterable[str] = (),
                   patches: Optional[Dict[str, dict]] = None, title: str = "") -> go.Figure:
    """The circuit as a graph. Node markers carry their name as customdata (a click expands a
    head); edge midpoints carry the edge's id (edge_id) and its hover text."""
    patches = patches or {}
    expanded = set(expanded)
    root_name = f"L{root[0]}H{root[1]}"
    fig = go.Figure()
    scale = max([abs(s) for s in edges["share"]] + [1e-9])
    mids: Dict[str, list] = {s: [[], [], [], []] for s in SIDE_COLOURS}
    for row in edges.itertuples(index=False):
        (x0, y0), (x1, y1) = node_xy(row.source), node_xy(row.target)
        width = 1 + 6 * min(1.0, abs(row.share) / scale)
        fig.add_trace(go.Scatter(x=[x0, x1], y=[y0, y1], mode="lines", hoverinfo="skip", showlegend=False,
                                 line=dict(color=SIDE_COLOURS[row.side], width=width,
                                           dash="solid" if row.weight >= 0 else "dot"),
                                 opacity=0.75))
        m = mids[row.side]
        m[0].append((x0 + x1) / 2)
        m[1].append((y0 + y1) / 2)
        m[2].append(edge_label(row))
        m[3].append(edge_id(row.source, row.target, row.side))
    for side, (xs, ys, texts, ids) in mids.items():
        fig.add_trace(go.Scatter(x=xs, y=ys, mode="markers", name=f"{side} side", customdata=ids, hovertext=texts,
                                 hoverinfo="text", marker=dict(color=SIDE_COLOURS[side], size=9, symbol="diamond")))
    names = list(dict.fromkeys([root_name] + list(edges["source"]) + list(edges["target"])))
    xy = [node_xy(n) for n in names]
    colour = ["#d62728" if n == root_name else "#444" if n in expanded else
              ("#9ecae1" if parse_head(n) is not None else "#ccc") for n in names]
    hover = [f"{n}: {'the chosen head' if n == root_name else 'expanded' if n in expanded else 'click to expand'}"
             if parse_head(n) is not None else n for n in names]
    fig.add_trace(go.Scatter(x=[p[0] for p in xy], y=[p[1] for p in xy], mode="markers+text", text=names,
                             textposition="top center", customdata=names, hovertext=hover, hoverinfo="text",
                             name="components", marker=dict(size=16, color=colour, line=dict(color="#222", width=1))))
    for eid, attrs in patches.items():
        parts = parse_edge(eid)
        if parts is None:
            continue
        (x0, y0), (x1, y1) = node_xy(parts[0]), node_xy(parts[1])
        fig.add_annotation(x=(x0 + x1) / 2, y=(y0 + y1) / 2, text=patch_label(attrs), showarrow=True, arrowhead=0,
                           ax=40, ay=-25, bgcolor="#fff8dc", bordercolor=SIDE_COLOURS[parts[2]], font=dict(size=11))
    top_layer = max([root[0]] + [int(y) for _, y in xy])
    layers = list(range(0, top_layer + 1))  # every layer up to the chosen head's, by its number; the embeddings below
    fig.update_layout(
        title=title or f"What makes {root_name} attend, and what it reads",
        height=max(360, 70 + 46 * (top_layer + 3)), margin=dict(l=40, r=20, t=60, b=40),
        xaxis=dict(title="head (left of 0: embeddings, MLPs, biases)", range=[-6, n_heads], zeroline=False,
                   tickvals=list(range(n_heads)), ticktext=[str(h) for h in range(n_heads)]),
        yaxis=dict(title="layer", range=[-1.7, top_layer + 0.9], zeroline=False, tickvals=[-1] + layers,
                   ticktext=["embed"] + [str(l) for l in layers]),
        legend=dict(orientation="h", y=1.02, x=0), clickmode="event+select", plot_bgcolor="white",
    )
    return fig


def head_options(edges: pd.DataFrame) -> Sequence[str]:
    """Edge ids whose source is a self-attention head (the edges path patching can check): the
    query- and key-side ones first (they move the pattern a score reads), heaviest share first."""
    heads = edges[edges["source"].map(parse_head).notna()]
    order = sorted(range(len(heads)), key=lambda k: (heads["side"].iloc[k] == "value", -abs(heads["share"].iloc[k])))
    return list(dict.fromkeys(edge_id(r.source, r.target, r.side) for r in heads.iloc[order].itertuples(index=False)))
