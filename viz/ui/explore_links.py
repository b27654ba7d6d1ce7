"""Opening a head in Explore, from any page (one helper: its URL, a link to it, and a click on a
figure that opens it on the next run); and parts of the Explore page: links from the selected
head to the analyses that say what it does (Patching, Lens), the value-norms switch (Kobayashi
et al. 2020) that redraws the same maps from ||a_ij v_j W_o^h||, and the head view's window on
a long input."""

import streamlit as st

from viz.figures import model_view
from viz.ui import registry, url_switches

EXPLORE = registry.page("explore").file
CIRCUITS = registry.page("circuits").file


def explore_params(model: str, text: str, stack: str, layer: int, head: int,
                   attn: str = "self_attn") -> dict:
    """The Explore page's URL for one head (head 0 where a cell names a layer only: head -1)."""
    return {"model": model, "text": text, "attn": f"{stack}.{attn}", "layer": str(int(layer)),
            "head": str(max(0, int(head)))}


def circuit_params(model: str, text: str, stack: str, layer: int, head: int, on: str = "text") -> dict:
    """The Circuits page's URL for one self-attention head (on: "repeat" reads it on the
    repeated random sequence)."""
    params = {"model": model, "text": text, "stack": stack, "layer": str(int(layer)), "head": str(max(0, int(head)))}
    if on != "text":
        params["on"] = on
    return params


def circuit_link(container, model: str, text: str, stack: str, layer: int, head: int, label: str = "",
                 on: str = "text", **kw) -> None:
    """A link that opens the Circuits page on one self-attention head."""
    container.page_link(CIRCUITS, label=label or f"Circuit of layer {layer} · head {head}: which heads make it attend",
                        query_params=circuit_params(model, text, stack, layer, head, on),
                        icon=":material/account_tree:", **kw)


def link(container, label: str, params: dict, **kw) -> None:
    """A link that opens Explore on `params` (explore_params)."""
    container.page_link(EXPLORE, label=label, query_params=params, **kw)


def _open_key(page: str) -> str:
    return f"{page}._open"


def open_next_run(page: str, params: dict) -> None:
    """A click on `page`'s figure picked a head: Explore opens on it on the next run (follow)."""
    st.session_state[_open_key(page)] = params


def follow(page: str) -> None:
    """At the top of `page`: if the last run picked a head, go to Explore on it now."""
    pending = st.session_state.pop(_open_key(page), None)
    if pending:
        st.switch_page(EXPLORE, query_params=pending)


def head_links(col, model, model_name: str, text: str, stack: str, kind: str, layer: int, head: int) -> None:
    """A link to patch the selected head (where the model has an output to measure), to its
    circuit (self-attention) and to the logit lens of the sentence."""
    if kind == "self_attn" and stack == {"decoder": "decoder", "encoder-decoder": "encoder"}.get(model.kind):
        st.page_link(registry.page("patching").file, label=f"Patch this head (layer {layer}, head {head}): does the output "
                     "need it?", query_params={"model": model_name, "text": text, "what": "head",
                                               "layer": str(int(layer)), "head": str(int(head))},
                     icon=":material/healing:")
    if kind == "self_attn":
        circuit_link(st, model_name, text, stack, layer, head)
    col.page_link(registry.page("lens").file, label="logit lens", query_params={"model": model_name, "text": text})


def norms_toggle(state) -> bool:
    """The switch from the weights to what is added (value norms); its state is in the URL (norms)."""
    return st.toggle("Weights → what is added (norms)", key=url_switches.flag(state, "norms"),
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


def map_caption(norms: bool) -> None:
    """What the heatmap's cells are: weights that sum to 1 per row, or value norms that do not."""
    if norms:
        st.caption("Each cell is ||a_nm v_m W_o^h||: how much key m adds to query n's output through this head. "
                   "Rows do not sum to 1. Hover a cell for the exact norm.")
    else:
        st.caption("Each row is a query and sums to 1: the weights a_nm of y_n = Σ_m a_nm v_m. "
                   "Hover a cell for the exact weight.")


def head_view_window(n_q: int, n_k: int, unit: str):
    """(query slice, key slice, title suffix) of the head view: everything up to
    viz.figures.model_view.HEAD_VIEW_MAX positions, else a window the user moves along the input."""
    qs = ks = slice(None)
    where = ""
    if max(n_q, n_k) > model_view.HEAD_VIEW_MAX:  # a window of the input the user moves along it
        last = max(n_q, n_k) - model_view.HEAD_VIEW_MAX
        if not 0 <= st.session_state.get("explore.hv_start", 0) <= last:
            st.session_state["explore.hv_start"] = 0
        start = st.slider(f"Window of {model_view.HEAD_VIEW_MAX} {unit}: first position", 0, last, key="explore.hv_start",
                          help=f"A line per pair of {max(n_q, n_k)} {unit} would be unreadable: the head view "
                               f"draws {model_view.HEAD_VIEW_MAX} at a time. Move the window along the input.")
        qs, ks = model_view.head_view_window(n_q, n_k, start)
        where = f" · {unit} {qs.start}–{qs.stop - 1}"
        st.caption(f"Lines among {unit} {qs.start}–{qs.stop - 1} (queries) and {ks.start}–{ks.stop - 1} (keys) "
                   f"of {max(n_q, n_k)} only, drawn with each head's **real weights, not renormalised**: a "
                   "query's weight to keys outside the window is not drawn, so its lines can add up to less "
                   "than 1 (in a long prompt most of it often goes to the first token).")
    return qs, ks, where
