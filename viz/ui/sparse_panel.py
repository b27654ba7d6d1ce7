"""A sparse selection's layer (DeepSeek V3.2) under a head's map, on Explore and Inside: the
dense softmax it replaced beside the kept keys, each query's dense mass outside the selection,
and the check that the sparse weights are the dense ones renormalised over the kept keys
(viz/figures/sparse.py computes them)."""

from __future__ import annotations

import streamlit as st

from viz.figures.heatmaps import attention_heatmap, fix_margins
from viz.figures.sparse import add_selection_outline, outside_figure
from viz.ui import charts, widgets


def panel(sel: dict, q_toks, k_toks, layer: int, head: int, key: str) -> None:
    """The dense map beside the selection (outlined on both), the mass outside it per query and
    the check. `sel`: viz.figures.sparse.selection_of's result for this head."""
    k = sel["topk"]
    out = sel["outside"]
    st.caption(f"Layer {layer} attends over a **sparse selection**: for each query the lightning indexer keeps its "
               f"top {k} keys (outlined in red) and masks every other one, so the weights are 0 off the outline. "
               f"Right: the dense softmax of the same q, k and scale over every causal key, the map the selection "
               f"replaced. On average {out.mean():.1%} of that dense mass falls outside the kept keys "
               f"(at most {out.max():.1%}, query {int(out.argmax())}).")
    left, right = st.columns(2)
    with left:
        fig = fix_margins(attention_heatmap(sel["weights"], q_toks, k_toks,
                                            title=f"layer {layer} · head {head} · sparse (top-{k} kept)"),
                          q_toks, k_toks, min_top=90)
        charts.chart(add_selection_outline(fig, sel["selected"]), key=f"{key}-sparse-map", width="stretch")
    with right:
        fig = fix_margins(attention_heatmap(sel["dense"], q_toks, k_toks,
                                            title=f"layer {layer} · head {head} · dense softmax it replaced"),
                          q_toks, k_toks, min_top=90)
        charts.chart(add_selection_outline(fig, sel["selected"]), key=f"{key}-dense-map", width="stretch")
    charts.chart(outside_figure(out, q_toks, k), key=f"{key}-outside", width="stretch")
    widgets.show_checks([sel["check"]])
