"""The KV cache page's part for a model with token mixers: each mixer layer's fixed state size
against the KV cache a softmax layer of the same width holds at the document's length
(viz/kvcache/state_figures.py), with the sentence that says what it means."""

from __future__ import annotations

import streamlit as st

from viz.kvcache import state_figures as sf
from viz.ui import charts
from viz.ui.download_sizes import human


def show(model, n: int) -> None:
    """Nothing for a model without mixer layers."""
    kinds = model.layer_kinds("decoder")
    df = sf.state_table(kinds, n, model.config.d_model)
    if df.empty:
        return
    st.subheader("A token mixer's state against the KV cache")
    charts.chart(sf.state_figure(df, n), key="kvcache-mixer-state", name="mixer-state")
    st.dataframe(df, hide_index=True, width="stretch")
    row = df.iloc[0]
    st.caption(f"Layer {int(row['layer'])} ({row['mixer']}) keeps {int(row['state numbers']):,} numbers "
               f"({human(int(row['state bytes']))}) per sequence whatever the length, while a softmax layer of the same "
               f"width ({model.config.d_model}) caches K and V for every token: {int(row['KV cache numbers']):,} numbers "
               f"({human(int(row['KV cache bytes']))}) at this text's {n:,} tokens, {row['KV / state']:.1f}× the state, "
               "and growing by 2 d numbers with each token. Eviction has nothing to drop in these layers: the state "
               "is already the summary (float32 bytes).")
