"""Explore's ways out of a head and its "what is added" switch: links from the selected head to
the analyses that say what it does (Patching, Lens), and the value-norms view (Kobayashi et al.
2020) that redraws the same maps from ||a_ij v_j W_o^h||."""

import streamlit as st

from viz.ui import urlflags


def head_links(col, model, model_name: str, text: str, stack: str, kind: str, layer: int, head: int) -> None:
    """A link to patch the selected head (where the model has an output to measure) and to the
    logit lens of the sentence."""
    if kind == "self_attn" and stack == {"decoder": "decoder", "encoder-decoder": "encoder"}.get(model.kind):
        st.page_link("viz/pages/patching.py", label=f"Patch this head (layer {layer}, head {head}): does the output "
                     "need it?", query_params={"model": model_name, "text": text, "what": "head"},
                     icon=":material/healing:")
    col.page_link("viz/pages/lens.py", label="logit lens", query_params={"model": model_name, "text": text})


def norms_toggle(state) -> bool:
    """The switch from the weights to what is added (value norms); its state is in the URL (norms)."""
    return st.toggle("Weights → what is added (norms)", key=urlflags.flag(state, "norms"),
                     help="Off: the attention weights a_ij. On: ||a_ij v_j W_o^h||, the size of what key j adds to "
                          "query i through the head (Kobayashi et al. 2020): a large weight on a key whose value is "
                          "small adds little.")


def norms_scale(norms: bool, per_map: bool) -> bool:
    """Whether each map gets its own colour scale: always for norms (they are not in 0..1), with
    a caption saying what is drawn."""
    if not norms:
        return per_map
    st.caption("Showing **what is added**: ||a_ij v_j W_o^h||, not the weights. Rows no longer sum to 1; the heatmap is "
               "drawn on its own scale, the model view and head view divide each layer by its largest norm.")
    return True
