"""Explore on a layer whose token mixer is not softmax attention (core/net/mixer.py): its exact
implicit attention A on a signed scale centred on zero, or, for a short convolution, its filter
with the reason it has no head map; above either, the strip of each layer's kind."""

from __future__ import annotations

import numpy as np
import streamlit as st

from core import trace_names as tn
from viz.figures import mixer as mixer_figures
from viz.figures import model_view as mv
from viz.figures.select import axis_tokens
from viz.ui import charts, downloads

WHY_SIGNED = ("**A token mixer's map is signed.** Its output is exactly o_i = Σ_j A_ij v_j, but A is no softmax: "
              "rows need not sum to 1 and weights can be negative (the delta rule subtracts what the state held "
              "for a key before writing the new value). White is zero, red adds a key's value, blue subtracts it; "
              "nothing lies above the diagonal (causal).")
WHY_NO_MAP = ("**A short convolution has no head map.** Each channel mixes only the last few tokens with fixed "
              "weights (its filter, below), the same for every sentence: no query compares itself with keys, so "
              "there is no attention to draw; the gates around it depend on the token, the filter does not.")


def kinds_strip(model, stack: str) -> None:
    """Each layer's token mixer in one strip."""
    charts.chart(mixer_figures.layer_kinds_figure(mixer_figures.kind_labels(model.layer_kinds(stack))),
                 key="explore-kinds", name="layer-kinds")


def show(model, trace, stack: str, layer: int, head: int, kind: str, model_name: str) -> None:
    """The mixer view of `layer` (`kind`: the mixer's kind, "gated_delta", "kimi_delta", "mamba2", "short_conv"),
    with the downloads of Explore's other maps: this map as CSV, the layer's tensors, the trace."""
    kinds_strip(model, stack)
    q_toks, k_toks = axis_tokens(trace, stack, "self_attn")
    label = mixer_figures.KIND_NAME.get(kind, kind)
    if kind == "short_conv":
        st.info(WHY_NO_MAP)
        w = trace[tn.mixer(stack, layer, "filter")].float().numpy()
        charts.chart(mixer_figures.filter_figure(w, f"layer {layer} · short convolution filter · "
                                                    f"{w.shape[0]} channels x {w.shape[1]} taps"),
                     key="explore-filter", name=f"filter-L{layer}")
        return
    st.caption(WHY_SIGNED)
    a = trace[tn.mixer(stack, layer, "weights")][head].float().numpy()
    z, zq, zk, fq, fk = mv.reduce_map(a, q_toks, k_toks)  # a long input in blocks, as Explore's other maps
    title = f"layer {layer} · head {head} · {label} · implicit attention (signed)"
    if fq > 1 or fk > 1:
        title += f" · blocks of {max(fq, fk)}"
        st.info(f"Long input ({a.shape[0]} × {a.shape[1]} tokens): drawn as blocks of up to {max(fq, fk)} neighbouring "
                "tokens so the page stays responsive: within a block the keys' weights are summed and the queries' "
                "rows averaged. The CSV download has every token.")
    charts.chart(mixer_figures.signed_map(np.asarray(z), zq, zk, title), key="explore-mixer-map",
                 name=f"mixer-L{layer}-H{head}")
    st.caption(f"Weights from {a.min():+.4f} to {a.max():+.4f}; {int((a < 0).sum())} of "
               f"{int(a.size - a.shape[0] * (a.shape[0] - 1) // 2)} cells on or below the diagonal are negative.")
    downloads.offer(trace, a, q_toks, k_toks, model=model_name, stack=stack, kind=tn.MIXER, layer=layer, head=head,
                    key="explore-mixer-dl")


def model_view(model, trace, stack: str, layer: int, head: int) -> None:
    """The model view of a model with token mixers: every layer marked by its kind, softmax maps
    0 to 1 and a mixer's implicit attention on the signed scale; a layer with a mixer beside its
    attention (Falcon-H1) has a row for each."""
    layer_kinds = model.layer_kinds(stack)
    rows = []  # (layer, kind, label, the trace name of its maps or None)
    for i, (k, label) in enumerate(zip(layer_kinds, mixer_figures.kind_labels(layer_kinds))):
        kind, beside = k.get("mixer", "softmax"), (k.get("beside") or {}).get("mixer")
        if kind == "softmax":
            rows.append((i, kind, "softmax" if beside else label, tn.attn(stack, i, "self_attn", "weights")))
            if beside:
                rows.append((i, beside, f"{mixer_figures.KIND_NAME.get(beside, beside)} beside",
                             tn.mixer(stack, i, "weights")))
        else:
            rows.append((i, kind, label, None if kind == "short_conv" else tn.mixer(stack, i, "weights")))
    maps = [None if name is None else [x.float().numpy() for x in mv.reduce_stack([trace[name]])[0]]  # thumbnails
            for _, _, _, name in rows]
    selected = next(r for r, row in enumerate(rows) if row[0] == layer)
    st.caption("Every head of every layer, each row named by its token mixer. Softmax maps share one scale from 0 to "
               "1; a token mixer's implicit attention is signed (red adds, blue subtracts, white is zero).")
    charts.chart(mixer_figures.mixed_model_view(maps, [r[1] for r in rows], selected=(selected, head),
                                                labels=[r[2] for r in rows], layers=[r[0] for r in rows]),
                 key="explore-mixed-grid", name="model-view")
