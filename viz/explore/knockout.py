"""Head ablation in the app: the URL form of a list of heads, the marks on the model view, and
what changed between the plain and the ablated pass. Pure functions (numpy, pandas, plotly;
no Streamlit).

A head is (stack, layer, head); the URL keeps a list as `ablate=decoder.3.4,decoder.5.1`.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from viz.figures.heatmaps import safe_labels
from viz.figures.text import token_text

Head = Tuple[str, int, int]
STACKS = ("encoder", "decoder")


def head_sizes(config) -> Dict[str, Tuple[int, int]]:
    """{stack: (layers, heads)} of a ModelConfig."""
    sizes = {}
    if config.has_encoder:
        sizes["encoder"] = (config.n_layers, config.n_heads)
    if config.has_decoder:
        n_dec = config.n_decoder_layers if config.kind == "encoder-decoder" else config.n_layers
        sizes["decoder"] = (n_dec, config.n_heads)
    return sizes


def all_head_names(sizes: Dict[str, Tuple[int, int]]) -> List[str]:
    return [f"{s}.{l}.{h}" for s, (n_l, n_h) in sizes.items() for l in range(n_l) for h in range(n_h)]


def head_name(head: Head) -> str:
    return f"{head[0]}.{int(head[1])}.{int(head[2])}"


def format_ablate(heads: Sequence[Head]) -> str:
    """The URL value of a list of heads, sorted, without repeats."""
    return ",".join(head_name(h) for h in sorted(set((s, int(l), int(h)) for s, l, h in heads)))


def parse_ablate(raw: str, sizes: Dict[str, Tuple[int, int]]) -> List[Head]:
    """Heads from the URL value ("decoder.3.4,decoder.5.1"), checked against sizes
    {stack: (layers, heads)}. Raises ValueError naming the first item that is not a head
    of this model. Repeats are dropped; the order is sorted."""
    out = set()
    for item in str(raw).split(","):
        item = item.strip()
        if not item:
            continue
        parts = item.split(".")
        if len(parts) != 3 or parts[0] not in sizes or not parts[1].isdigit() or not parts[2].isdigit():
            raise ValueError(f"{item!r} is not stack.layer.head")
        stack, layer, head = parts[0], int(parts[1]), int(parts[2])
        n_layers, n_heads = sizes[stack]
        if layer >= n_layers or head >= n_heads:
            raise ValueError(f"{item!r}: this model's {stack} has {n_layers} layers of {n_heads} heads")
        out.add((stack, layer, head))
    return sorted(out)


def toggle(heads: Sequence[Head], head: Head) -> List[Head]:
    """The list with `head` removed if present, else added (sorted)."""
    head = (head[0], int(head[1]), int(head[2]))
    rest = [tuple(h) for h in heads if tuple(h) != head]
    return sorted(rest) if len(rest) < len(heads) else sorted(rest + [head])


def mark_grid(fig: go.Figure, heads: Sequence[Head], stack: str) -> go.Figure:
    """Cross out the ablated heads of `stack` on a model view (viz.figures.grid.tiled_head_grid):
    a grey x over each one's click target (trace 1 of that figure), with the same
    customdata, so a click on the mark still picks that head."""
    targets = fig.data[1]
    custom = np.asarray(targets.customdata)
    off = {(int(l), int(h)) for s, l, h in heads if s == stack}
    keep = [k for k, row in enumerate(custom) if (int(row[0]), int(row[1])) in off]
    if keep:
        fig.add_trace(go.Scatter(
            x=[targets.x[k] for k in keep], y=[targets.y[k] for k in keep], customdata=custom[keep].tolist(), mode="markers",
            name="switched off", showlegend=False,
            marker=dict(symbol="x-thin", size=28, line=dict(width=4, color="#7f7f7f"), color="#7f7f7f"),
            selected=dict(marker=dict(opacity=1)), unselected=dict(marker=dict(opacity=1)),
            hovertemplate="layer %{customdata[0]} · head %{customdata[1]}: switched off<br>click to switch it back on"
                          "<extra></extra>"))
    return fig


# ------------------------------------------------------------------ what changed
def next_token_table(before_tokens: Sequence[str], before_probs, after_tokens: Sequence[str], after_probs,
                     k: int = 10) -> pd.DataFrame:
    """Top-k next tokens side by side: rank, token and probability before and after."""
    bp, ap = np.asarray(before_probs, dtype=float), np.asarray(after_probs, dtype=float)
    k = min(k, len(before_tokens), len(after_tokens))
    return pd.DataFrame({
        "rank": np.arange(1, k + 1),
        "before": [token_text(t) for t in before_tokens[:k]], "p before": bp[:k],
        "after": [token_text(t) for t in after_tokens[:k]], "p after": ap[:k],
    })


def token_cosines(before, after) -> np.ndarray:
    """Cosine similarity of each token's vector before and after (n x d, n x d -> n)."""
    a, b = np.asarray(before, dtype=np.float64), np.asarray(after, dtype=np.float64)
    na, nb = np.linalg.norm(a, axis=-1), np.linalg.norm(b, axis=-1)
    return (a * b).sum(-1) / np.maximum(na * nb, 1e-30)


def cosine_figure(cos: np.ndarray, tokens: Sequence[str], title: str = "") -> go.Figure:
    """One bar per token: the cosine between its last-layer vectors before and after."""
    pos = list(range(len(tokens)))
    labels = safe_labels([str(t) for t in tokens])
    fig = go.Figure(go.Bar(x=pos, y=np.asarray(cos, dtype=float), customdata=labels,
                           hovertemplate="%{customdata} (%{x}): cosine %{y:.4f}<extra></extra>"))
    fig.update_xaxes(tickvals=pos, ticktext=labels, tickangle=-60)
    low = float(min(np.min(cos), 0.9)) if len(cos) else 0.9
    fig.update_yaxes(range=[max(-1.0, low - 0.05), 1.0], title="cosine")
    fig.update_layout(title=dict(text=title or "Each token's last-layer vector: cosine before vs after", x=0),
                      height=320, margin=dict(l=10, r=10, t=60, b=10))
    return fig


def continuation(tokens: Optional[Sequence[str]]) -> str:
    """Generated tokens as one readable string."""
    return "".join(tokens or [])
