"""The Inside page's parts for the attentions that are more than softmax(QK^T)V: multi-head latent
attention's compression step by step (DeepSeek V3, viz/inside/latent.py), with each step's check;
a sparse selection's kept keys beside the dense map (V3.2, viz/ui/sparse_panel.py); an output
gate per head and position (Qwen3.5, Qwen3-Next)."""

from __future__ import annotations

import streamlit as st

from core import trace_names as tn
from viz.figures.reference import NoReference
from viz.figures.sparse import selection_of
from viz.inside.latent import gate_figure, latent_figure, latent_steps, layer_rotates
from viz.ui import charts, sparse_panel, widgets


def latent_section(trace, stack: str, layer: int, head: int, tokens) -> None:
    """MLA's steps X -> c_KV -> K_nope, V (+ k_rope, q) of one head, each checked; a st.info
    saying why where they cannot be recomputed."""
    try:
        steps = latent_steps(trace, stack, layer, head)
    except NoReference as exc:
        st.info(f"The latent attention's steps are not recomputed here: {exc}.")
        return
    failed = [c for s in steps for c in s.checks if not c.ok]
    if failed:
        st.error(f"{len(failed)} check{'s' if len(failed) != 1 else ''} of the latent attention failed: the recorded "
                 "tensors differ from the numpy recomputation (marked ✗ below).")
    with st.expander(f"Multi-head latent attention (layer {layer}, head {head}): X → latent → K, V, step by step",
                     expanded=True):
        st.caption("DeepSeek V3 compresses every position to a small latent c_KV; each head rebuilds its keys and "
                   "values from it, and a small rotated key k_rope, shared by the heads, carries the positions. The "
                   "KV cache keeps only c_KV and k_rope. Each step is recomputed in float64 numpy (viz/inside/latent.py) "
                   "and compared with the recorded tensor within 10⁻⁴ × max(1, largest |value|)."
                   + ("" if layer_rotates(trace, stack, layer) else
                      " This layer has no positions (Kimi Linear): its k_rope is a shared key part, never rotated."))
        for i, step in enumerate(steps, start=1):
            left, right = st.columns([5, 6])
            with left:
                st.markdown(f"**{i}. {step.title}**")
                st.latex(step.latex)
                shape = f"shape {step.matrix.shape[0]} × {step.matrix.shape[1]}"
                st.caption(step.explain + f"  \n{shape}" + (f" · trace name `{step.name}`" if step.name else ""))
                widgets.show_checks(step.checks)
            with right:
                charts.chart(latent_figure(step, tokens), key=f"inside-latent-{step.key}-fig", width="stretch")


def selection_section(trace, stack: str, layer: int, head: int, q_toks, k_toks) -> None:
    """A sparse layer's selection of this head against the dense map it replaced; nothing for another layer."""
    sel = selection_of(trace, stack, layer, head)
    if sel is not None:
        sparse_panel.panel(sel, q_toks, k_toks, layer, head, key="inside")


def gate_section(trace, stack: str, layer: int, tokens) -> None:
    """An output gate's sigmoid per head and position (mean over features); nothing without one."""
    name = tn.attn(stack, layer, tn.SELF, "gate")
    if name not in trace:
        return
    g = trace[name]
    st.caption(f"Layer {layer} gates its heads' outputs (Qwen3.5, Qwen3-Next): each head's output is multiplied, "
               "feature by feature, by sigmoid(x W_g) of the query's own input before W_o. Near 0 a head is silenced "
               "at that position, near 1 it passes.")
    charts.chart(gate_figure(g.numpy() if hasattr(g, "numpy") else g, tokens, layer), key="inside-gate-fig",
                 width="stretch")


def shared_kv_section(model, stack: str, layer: int) -> None:
    """Which layer's keys and values a layer reads (Gemma 4), and whether its values are its keys (K = V)."""
    try:
        info = model.layer_kinds(stack)[layer]
    except (AttributeError, ValueError, IndexError):
        return
    j, kv = info.get("shared_kv"), str(info.get("kv", ""))
    if j is not None:
        st.caption(f"Layer {layer} computes no keys or values of its own: it reads **keys and values from layer {j}** "
                   f"(after layer {j}'s norm and RoPE; Gemma 4's shared KV), so its K and V below are layer {j}'s and "
                   f"the cache holds them once." + (" Layer {j}'s values are its keys (K = V)." .format(j=j)
                                                    if "k = v" in kv else ""))
    elif "k = v" in kv:
        st.caption(f"Layer {layer} has no W_v: its values are its key projection X W_k before the key's norm and RoPE "
                   "(**K = V**, Gemma 4's global layers).")
