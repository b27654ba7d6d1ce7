"""The KV cache page's comparison for a model with token mixers (core/net/mixer.py): each mixer
layer's fixed state per sequence (from layer_info's state shapes) against the KV cache a
softmax layer of the same width would hold at the document's length. Pure: layer kinds in,
a DataFrame and a plotly Figure out."""

from __future__ import annotations

import math
from typing import List

import pandas as pd
import plotly.graph_objects as go

STATE_BYTES = 4  # the mixers keep their states in float32


def state_table(kinds: List[dict], n: int, d_model: int, bytes_per: int = STATE_BYTES) -> pd.DataFrame:
    """One row per mixer layer: its state's parts and shapes, numbers and bytes per sequence
    (whatever the length), and a softmax layer's K and V cache at n tokens of width d_model
    (2 n d numbers) in the same bytes per number."""
    rows = []
    for i, k in enumerate(kinds):
        k = k.get("beside") or k  # a mixer beside softmax attention (Falcon-H1): its state, beside the layer's cache
        if k.get("mixer", "softmax") == "softmax" or not k.get("state"):
            continue
        shapes = k["state"]
        numbers = sum(math.prod(s) for s in shapes.values())
        kv = 2 * n * d_model
        rows.append({"layer": i, "mixer": k["mixer"],
                     "state": " + ".join(f"{p} {' × '.join(map(str, s))}" for p, s in shapes.items()),
                     "state numbers": numbers, "state bytes": numbers * bytes_per,
                     "KV cache numbers": kv, "KV cache bytes": kv * bytes_per,
                     "KV / state": kv / numbers if numbers else float("inf")})
    return pd.DataFrame(rows)


def state_figure(df: pd.DataFrame, n: int) -> go.Figure:
    """Bytes per sequence, per mixer layer: its fixed state beside the KV cache of a softmax layer
    of the same width at n tokens (log scale)."""
    x = [f"L{r}" for r in df["layer"]]
    fig = go.Figure([
        go.Bar(x=x, y=df["state bytes"], name="mixer state (fixed)",
               hovertemplate="%{x}: %{y:,} bytes, the same at any length<extra></extra>"),
        go.Bar(x=x, y=df["KV cache bytes"], name=f"KV cache of a softmax layer at {n:,} tokens",
               hovertemplate="%{x}: %{y:,} bytes, growing with the length<extra></extra>")])
    fig.update_layout(barmode="group", yaxis=dict(type="log", title="bytes per sequence"), height=340,
                      title=f"What one sequence keeps per layer: a fixed state against a cache of {n:,} tokens")
    return fig
