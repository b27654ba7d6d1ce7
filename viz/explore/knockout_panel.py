"""Switching heads off on the Explore page (not a page of its own): the list of heads kept in
the URL as `ablate=decoder.3.4,decoder.5.1` (and `ablation=mean` when not zeroed), the
controls, and the "what changed" panel comparing the plain and the ablated model.
"""

from __future__ import annotations

from typing import List, Tuple

import streamlit as st

from core import trace_names as tn
from viz.explore import knockout
from viz.ui import charts, models, url_state

ABLATION_LABELS = {"zero": "zeroed", "mean": "replaced by its mean over positions"}
MODES = tuple(ABLATION_LABELS)
CONTINUATION_TOKENS = 20


def seeded_keys(state: url_state.PageState, model) -> Tuple[str, str]:
    """PageState.seeded_key for the two widgets: their values from the URL (bad items: a
    warning, nothing switched off).
    Returns (key of the heads multiselect, key of the ablation mode)."""
    sizes = knockout.head_sizes(model.config)
    names = set(knockout.all_head_names(sizes))
    key = state.seeded_key("ablate", [], parse=lambda raw: [knockout.head_name(h) for h in knockout.parse_ablate(raw, sizes)],
                     why=lambda raw, exc: str(exc) or None)
    current = st.session_state[key]
    if isinstance(current, str):  # the URL form, as another page published it
        current = [h for h in current.split(",") if h]
    if not isinstance(current, list) or not set(current) <= names:  # e.g. another model's heads
        current = [h for h in current if h in names] if isinstance(current, list) else []
    if current != st.session_state[key]:
        st.session_state[key] = current
    mode_key = state.seeded_key("ablation", "zero", valid=lambda v: v in MODES, why=f"modes: {', '.join(MODES)}")
    return key, mode_key


def heads_off(key: str) -> List[knockout.Head]:
    out = []
    for name in st.session_state.get(key, []):
        s, l, h = name.split(".")
        out.append((s, int(l), int(h)))
    return sorted(out)


def toggle_head(key: str, stack: str, layer: int, head: int) -> None:
    """Switch one head off, or back on (for a click on the model view)."""
    st.session_state[key] = [knockout.head_name(h) for h in knockout.toggle(heads_off(key), (stack, layer, head))]


def controls(model, key: str, mode_key: str) -> None:
    sizes = knockout.head_sizes(model.config)
    c = st.columns([3, 1.2, 1.2])
    c[0].multiselect("Heads switched off (stack.layer.head)", knockout.all_head_names(sizes), key=key,
                     placeholder="none: turn on “Clicks switch heads off” and click maps in the model view",
                     help="Their slice of Concat(head_1..head_H) is removed before W_o; every map and prediction "
                          "below is the ablated model's.")
    c[1].selectbox("Switched-off heads are", MODES, key=mode_key, format_func=ABLATION_LABELS.get)
    c[2].toggle("Clicks switch heads off", key="explore.knockout",
                help="In the model view, a click on a map switches that head off (or back on) instead of selecting it.")


@st.cache_resource(max_entries=64, show_spinner=False)
def _continuation(model_name: str, text: str, off: tuple, mode: str, _model) -> str:
    tokens, _ = _model.generate(text, max_new_tokens=CONTINUATION_TOKENS, ablate=list(off), ablation=mode)
    return knockout.continuation(tokens)


def what_changed(model, model_name: str, text: str, ablated, off: List[knockout.Head], mode: str) -> None:
    """Before/after: decoders' next-token top-10 and greedy continuation, encoder-decoders'
    translation, encoders' per-token cosine of the last-layer vectors."""
    base = models.get_trace(model_name, text, notes=False)
    if base is None or ablated is None:
        return
    with st.expander(f"What changed with {len(off)} head{'s' if len(off) != 1 else ''} switched off "
                     f"({ABLATION_LABELS[mode]})", expanded=True):
        if model.kind == "decoder":
            c = st.columns([3, 2])
            with c[0]:
                st.caption("Next token after the prompt: top 10 before and after")
                st.dataframe(knockout.next_token_table(base.tokens("next"), base[tn.NEXT_PROBS].float().numpy(),
                                                 ablated.tokens("next"), ablated[tn.NEXT_PROBS].float().numpy()),
                             hide_index=True, key="explore-changed-next",
                             column_config={"p before": st.column_config.NumberColumn(format="%.4f"),
                                            "p after": st.column_config.NumberColumn(format="%.4f")})
            with c[1]:
                st.caption(f"Greedy continuation ({CONTINUATION_TOKENS} tokens)")
                try:
                    with st.spinner("Generating…"):
                        before = _continuation(model_name, text, (), "zero", model)
                        after = _continuation(model_name, text, tuple(off), mode, model)
                except Exception as exc:
                    st.error(f"Could not generate: {exc}")
                else:
                    st.text_area("before", before, disabled=True, key="explore-changed-before")
                    st.text_area("after", after, disabled=True, key="explore-changed-after")
        elif model.kind == "encoder-decoder":
            before, after = " ".join(base.tokens("target")[1:]), " ".join(ablated.tokens("target")[1:])
            c = st.columns(2)
            c[0].text_area("translation before", before, disabled=True, key="explore-changed-before")
            c[1].text_area("translation after", after, disabled=True, key="explore-changed-after")
            st.caption("The maps on this page are the ablated model's: pick decoder cross-attention above to see "
                       "where the new translation looks.")
        else:
            last = base.layers("encoder") - 1
            name = tn.out("encoder", last)
            cos = knockout.token_cosines(base[name].float().numpy(), ablated[name].float().numpy())
            charts.chart(knockout.cosine_figure(cos, base.tokens("source"),
                                             title=f"Each token's layer-{last} vector: cosine before vs after"),
                            key="explore-changed-cosine", width="stretch")
            st.caption(f"{model_name} has no masked-LM head here, so there are no fill-in predictions to compare.")
