"""Explore: type a sentence, see every head of every layer.

Heatmap of one (stack, attention, layer, head); model view (layer x head grid, click a map
to enlarge it); head view (lines from queries to keys, one colour per head).
"""

import streamlit as st

from viz.figures import attention_heatmap, head_grid, head_view
from viz.pages import common
from viz.select import View, attention_matrix, attention_views, layer_stack

KIND_LABEL = {("encoder", "self_attn"): "encoder self-attention", ("decoder", "self_attn"): "decoder self-attention (masked)",
              ("decoder", "cross_attn"): "decoder cross-attention"}

st.title("Explore attention")
state = common.PageState("explore")

top = st.columns([1, 3])
with top[0]:
    model_name = common.model_picker(state)
model = common.get_model(model_name)
common.sidebar(model)
if model is None:
    st.stop()

examples = dict(common.NOTES_EXAMPLES)
for ex in model.examples[:6]:
    examples.setdefault(ex, ex)
text_key = state.seed("text", model.examples[0] if model.examples else common.NOTES_EXAMPLES["bank (river)"])


def _use_example(sentence: str) -> None:
    st.session_state[text_key] = sentence


with top[1]:
    text = st.text_input("Sentence (press Enter)", key=text_key, help="Type any sentence and press Enter.")
st.caption("Examples from the lecture notes and for this model:")
ex_cols = st.columns(min(len(examples), 5))
for i, (label, sentence) in enumerate(examples.items()):
    ex_cols[i % len(ex_cols)].button(label, key=f"explore-ex-{i}", on_click=_use_example, args=(sentence,),
                                     width="stretch")

trace = common.get_trace(model_name, text)
if trace is None:
    state.publish(model=model_name, text=text)
    state.show_messages()
    st.stop()

common.token_chips(trace.tokens("source"), title=f"{len(trace.tokens('source'))} source tokens")
if trace.tokens("target"):
    common.token_chips(trace.tokens("target"), title=f"decoder input ({trace.meta.get('mode', '')}), "
                       f"then predicts: {' '.join(trace.tokens('next')[:1])}")

views = attention_views(trace)
view_names = [f"{s}.{k}" for s, k in views]
attn_key = state.seed("attn", view_names[0], valid=lambda v: v in view_names)
if st.session_state[attn_key] not in view_names:
    st.session_state[attn_key] = view_names[0]

c = st.columns([2, 1, 1, 1.3])
attn = c[0].selectbox("Attention", view_names, key=attn_key,
                      format_func=lambda v: KIND_LABEL.get(tuple(v.split(".")), v))
stack, kind = attn.split(".")
n_layers, n_heads = trace.layers(stack), trace[f"{stack}.0.{kind}.weights"].shape[0]
layer_key = common.int_from_url(state, "layer", 0, 0, n_layers - 1)
head_key = common.int_from_url(state, "head", 0, 0, n_heads - 1)
layer = c[1].selectbox("Layer", list(range(n_layers)), key=layer_key)
head = c[2].selectbox("Head", list(range(n_heads)), key=head_key)
with c[3]:
    mean_heads = st.toggle("Average over heads", key="explore.mean")
    per_map = st.toggle("Scale colours per map", key="explore.permap")
    hide_special = st.toggle("Hide special tokens", key="explore.hide")
state.show_messages()
state.publish(model=model_name, text=text, attn=attn, layer=layer, head=head)

view = View(stack, kind, layer, None if mean_heads else head)
matrix, q_toks, k_toks = attention_matrix(trace, view, hide_special=hide_special)

tab_map, tab_model, tab_heads = st.tabs(["Heatmap", "Model view (all layers × heads)", "Head view"])
with tab_map:
    fig = attention_heatmap(matrix, q_toks, k_toks, title=view.label(), fixed_scale=not per_map)
    st.plotly_chart(fig, key="explore-heatmap", width="stretch")
    st.caption("Each row is a query token and sums to 1: the weights a_nm of y_n = Σ_m a_nm v_m. "
               "Hover a cell for the exact weight.")
    common.downloads(trace, matrix, q_toks, k_toks, name=f"{model_name}-{stack}-{kind}-L{layer}-H{view.head}",
                     key="explore-dl")


def _pick_from_grid() -> None:
    sel = st.session_state.get("explore-grid")
    pts = (sel or {}).get("selection", {}).get("points", []) if sel else []
    if pts:
        idx = pts[0].get("curve_number", 0)
        st.session_state[layer_key], st.session_state[head_key] = divmod(int(idx), n_heads)
        st.session_state["explore.mean"] = False


with tab_model:
    st.caption("Every head of every layer. Click a map to make it the selected one (outlined in red); "
               "the enlarged map is on the Heatmap tab and below.")
    grid = head_grid(layer_stack(trace, stack, kind), q_toks, k_toks, selected=(layer, head),
                     title=f"{KIND_LABEL.get((stack, kind), attn)}: {n_layers} layers × {n_heads} heads")
    st.plotly_chart(grid, key="explore-grid", on_select=_pick_from_grid, selection_mode="points",
                    width="stretch")
    small = attention_heatmap(matrix, q_toks, k_toks, title="selected: " + view.label(), fixed_scale=not per_map,
                              height=420)
    st.plotly_chart(small, key="explore-enlarged", width="stretch")

with tab_heads:
    chosen = st.multiselect("Heads shown", list(range(n_heads)), default=list(range(min(n_heads, 4))),
                            key="explore.heads", format_func=lambda h: f"head {h}")
    w_all = trace[view.name]
    qv, kv = q_toks, k_toks
    if hide_special:
        w_all = None
    if w_all is None:
        st.info("The head view shows all tokens; turn off “Hide special tokens” to see it.")
    else:
        st.plotly_chart(head_view(w_all, qv, kv, heads=chosen, title=f"layer {layer}: queries (left) → keys (right)"),
                        key="explore-headview", width="stretch")
