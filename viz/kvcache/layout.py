"""The KV cache's size per token for one model's attention laid out as MHA, GQA and MLA of the same
sizes (core.net.cost.kv_cache_comparison), with the document's length: which layout this model
has, and what each would hold for the text (pure: a config and a length in, a table and a figure out)."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

from core.net.cost import kv_cache_bytes, kv_cache_comparison

OWN_COLOUR, OTHER_COLOUR = "#D55E00", "#9AA5B1"


def own_kind(cfg) -> str:
    """The layout the model has: "MLA" (latent attention), "GQA" (fewer key/value heads) or "MHA"."""
    if getattr(cfg, "mla", None) is not None:
        return "MLA"
    return "GQA" if cfg.n_kv_heads < cfg.n_heads else "MHA"


def layout_table(cfg, n_tokens: int, dtype_bytes: int = 4) -> pd.DataFrame:
    """kv_cache_comparison's rows (MHA, GQA, MLA) with `this model` (the model's own layout) and
    `document_bytes` (bytes per token times the document's n_tokens). A model without latent
    attention gets an MLA row of DeepSeek V3's proportions (r = 4 d_k, d_rope = d_k / 2)."""
    if n_tokens < 0:
        raise ValueError(f"the document's length must be 0 or more tokens, not {n_tokens}")
    if getattr(cfg, "mla", None) is None:
        table = kv_cache_comparison(cfg, rank=4 * cfg.d_head, rope_dim=max(2, cfg.d_head // 2), dtype_bytes=dtype_bytes)
        table.loc[table["kind"] == "MLA", "formula"] += f" (DeepSeek V3's proportions: r = {4 * cfg.d_head}, " \
                                                       f"d_rope = {max(2, cfg.d_head // 2)})"
    else:
        table = kv_cache_comparison(cfg, dtype_bytes=dtype_bytes)
    own = own_kind(cfg)
    table["this model"] = table["kind"] == own
    if own == "MHA":  # a model without grouping is the MHA row; GQA's row is then the same model grouped
        table.loc[table["kind"] == "GQA", "this model"] = False
    table["document_bytes"] = table["bytes_per_token"] * int(n_tokens)
    table.attrs["own_bytes_per_token"] = kv_cache_bytes(cfg, dtype_bytes)  # as the network here keeps it
    return table


def layout_figure(table: pd.DataFrame, n_tokens: int) -> go.Figure:
    """The cache for the whole document per layout, the model's own in colour."""
    colours = [OWN_COLOUR if own else OTHER_COLOUR for own in table["this model"]]
    labels = [f"{k} · {f}" for k, f in zip(table["kind"], table["formula"])]
    fig = go.Figure(go.Bar(x=table["document_bytes"] / 2**10, y=labels, orientation="h", marker_color=colours,
                           customdata=table["bytes_per_token"],
                           hovertemplate="%{y}<br>%{customdata:,} bytes a token · %{x:,.1f} KiB for the text<extra></extra>"))
    fig.update_layout(title=f"KV cache for this text ({n_tokens:,} tokens), every layer, float32",
                      xaxis_title="KiB", height=120 + 45 * len(table), margin=dict(l=10, r=10, t=40, b=10),
                      yaxis=dict(autorange="reversed"))
    return fig
