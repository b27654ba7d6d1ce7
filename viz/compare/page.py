"""Compare: one word in two sentences (Bishop ch. 12's "bank" by the river and "bank" with cash).

What the word attends to in each sentence (one layer and head, or the mean of the heads),
and the cosine similarity (Chapter 9) of its two vectors at every depth: identical at the
input embedding -- a static embedding, one vector per token -- and drifting apart layer by
layer as attention mixes in each sentence's context. Numbers come from viz.compare.figures.

URL state: model, text (sentence A), text2 (sentence B; `target` is read as an alias when
text2 is absent), word, layer, head. The page remembers its own pair of sentences: it does
not take the single sentence or model of the other pages (its default is minilm on the two
"bank" sentences; toy-translate, with a toy pair, when minilm is not installed). That state,
and the word the two sentences share, is kept by viz/compare/state_panel.py.
"""

import streamlit as st

from viz.compare import figures as cmp
from viz.figures import model_view
from viz.figures.heatmaps import safe_label
from viz.ui import charts, models, url_state, url_switches, widgets
from viz.compare import state_panel as compare_state

widgets.header("compare")
st.caption("Bishop ch. 12: “bank” means a riverside in one sentence and a place for cash in the other. A static embedding "
           "gives the word one vector whatever the sentence; attention mixes each sentence's context into it. Below: "
           "what the word attends to in each sentence, and how similar its two vectors stay, layer by layer "
           "(cosine similarity, Chapter 9).")
state = compare_state.CompareState()

# ------------------------------------------------------------------ model
names = [n for n in models.model_names() if n != "random"]
model_key = compare_state.seeded_model(state, names)

top = st.columns([1, 3])
model_name = top[0].selectbox("Model", names, key=model_key,
                              format_func=models.model_label)
widgets.random_note(model_name)
model = models.get_model(model_name)
widgets.sidebar(model)
if model is None:
    state.show_messages()
    st.stop()

# ------------------------------------------------------------------ sentences and word
text_a_key, text_b_key, word_key = compare_state.seeded_pair(state, model_name)


def _use_pair(a: str, b: str, word: str) -> None:
    st.session_state[text_a_key], st.session_state[text_b_key], st.session_state[word_key] = a, b, word


pairs = cmp.example_pairs(model_name)
with top[1]:
    st.caption("Example pairs:")
    pair_cols = st.columns(len(pairs))
    for i, (label, (a, b, w)) in enumerate(pairs.items()):
        pair_cols[i].button(label, key=f"compare-pair-{i}", on_click=_use_pair, args=(a, b, w), width="stretch")

compare_state.offer_their_sentence(state, model_name, names, model_key, text_a_key, text_b_key)

cols = st.columns(2)
text_a = widgets.text_box("Sentence A", text_a_key, where=cols[0])
text_b = widgets.text_box("Sentence B", text_b_key, where=cols[1])


def _stop(message: str) -> None:
    st.warning(message)
    state.end_here(model=model_name, text=text_a, text2=text_b, word=st.session_state.get(word_key),
                   layer=st.session_state.get(state.key("layer")), head=st.session_state.get(state.key("head")))


for label, txt in (("A", text_a), ("B", text_b)):
    if not (txt or "").strip():
        _stop(f"Sentence {label} is empty: type a sentence to compare, or pick an example pair.")

traces, texts = {}, {"A": text_a, "B": text_b}
for label, txt in texts.items():
    traces[label] = models.get_trace(model_name, txt)
if traces["A"] is None or traces["B"] is None:
    _stop("Fix the sentence above to compare the two.")
trace_a, trace_b = traces["A"], traces["B"]

words_a = cmp.sentence_words(trace_a, texts["A"])
words_b = cmp.sentence_words(trace_b, texts["B"])
shared_words = cmp.common_words(words_a, words_b)
if not shared_words:
    _stop("The two sentences have no word in common: use the same word in both (like “bank” in the example pair).")

compare_state.settle_word(state, word_key, model_name, words_a, words_b, shared_words)

stack = cmp.stack_of(trace_a)
n_layers = trace_a.layers(stack)
n_heads = trace_a.n_heads(stack)
softmax_layers = widgets.view_layers(trace_a, stack, "self_attn")  # a token mixer's layers have no attention to read
if not softmax_layers:
    widgets.no_softmax_info(model_name, trace_a, "Compare")
    st.stop()
layer_key = url_state.int_from_url(state, "layer", softmax_layers[0], 0, n_layers - 1, of=model_name)
if st.session_state[layer_key] not in softmax_layers:
    st.session_state[layer_key] = softmax_layers[0]
head_key = url_state.int_from_url(state, "head", 0, 0, n_heads - 1, of=model_name)

c = st.columns([1.4, 1.4, 1.4, 0.8, 0.8, 1.4], vertical_alignment="bottom")
word = c[0].selectbox("Word in both sentences", shared_words, key=word_key)
word_md = cmp.md_escape(word)
occ_a, occ_b = cmp.occurrences(words_a, word), cmp.occurrences(words_b, word)
picked = {}
for col, label, occ, wlist in ((c[1], "A", occ_a, words_a), (c[2], "B", occ_b, words_b)):
    key = f"compare.occ_{label.lower()}"
    if st.session_state.get(key, 0) not in range(len(occ)):
        st.session_state[key] = 0
    if len(occ) > 1:
        i = col.selectbox(f"Which “{word_md}” in {label}", list(range(len(occ))), key=key,
                          format_func=lambda k, occ=occ, wlist=wlist: cmp.context_label(wlist, occ[k]))
    else:
        i = 0
        col.caption(f"In {label}: {cmp.md_escape(cmp.context_label(wlist, occ[0]))}")
    picked[label] = occ[i]
layer = c[3].selectbox("Layer", softmax_layers, key=layer_key,
                      help="The layers with softmax attention (a token mixer's layers have none to read).")
head = c[4].selectbox("Head", list(range(n_heads)), key=head_key)
with c[5]:
    mean_heads = st.toggle("Average over heads", key=url_switches.flag(state, "mean"))
    in_words = False
    if not model_view.reads_pieces(model):
        state.ignored_if_given("words", f"{model_name}'s tokens are whole words: there are no pieces to merge")
    if model_view.reads_pieces(model):
        in_words = st.toggle("Read in words", key=url_switches.flag(state, "words", default=True),
                             help="Merge word pieces into typed words: the weights on a word's pieces are summed.")
state.show_messages()
state.publish(model=model_name, text=text_a, text2=text_b, word=word, layer=layer, head=head,
              mean=url_switches.flag_url(mean_heads), words=url_switches.flag_url(in_words, default=model_view.reads_pieces(model)))
word_a, word_b = picked["A"], picked["B"]
head_used = None if mean_heads else head

# ------------------------------------------------------------------ attention from the word
head_text = "mean of the heads" if head_used is None else f"head {head}"
st.subheader(f"What “{word_md}” attends to · layer {layer}, {head_text}")
wa, la, ha = cmp.attention_from(trace_a, word_a, layer, head_used, words_a if in_words else None)
wb, lb, hb = cmp.attention_from(trace_b, word_b, layer, head_used, words_b if in_words else None)
y_max = max(float(wa.max()), float(wb.max())) * 1.1
cols = st.columns(2)
for col, label, (w, lab, hi), chart_key in ((cols[0], "A", (wa, la, ha), "compare-attn-a"),
                                            (cols[1], "B", (wb, lb, hb), "compare-attn-b")):
    with col:
        fig = cmp.attention_bar(w, lab, hi, title=f"Sentence {label}: attention from “{safe_label(word)}” (red)",
                                y_max=y_max)
        charts.chart(fig, key=chart_key, width="stretch")
        top3 = cmp.top_attended(w, lab, skip=hi)
        st.caption("Most attended besides itself: " + ", ".join(f"“{cmp.md_escape(t)}” {v:.2f}" for t, v in top3))
unit = "word m of its own sentence (the weights on a word's pieces summed)" if in_words else \
    "token m of its own sentence"
pieces = "" if len(word_a.positions) == 1 and len(word_b.positions) == 1 else \
    " A word of several pieces attends with the mean of its pieces' rows."
st.caption(f"One row of the attention matrix: the weights a_nm ≥ 0 with Σ_m a_nm = 1 that “{word_md}” (query n) gives to "
           f"every {unit} (Bishop ch. 12).{pieces} "
           + ("A decoder-only model's query sees only the tokens before it (causal mask)." if stack == "decoder" else ""))

# ------------------------------------------------------------------ cosine layer by layer
st.subheader(f"Is “{word_md}” the same vector in both sentences?")
table = cmp.cosine_table(trace_a, word_a, trace_b, word_b, words_b)
word_plot = safe_label(word)
fig = cmp.cosine_figure(table, word, mark_layer=layer,
                        title=f"cos(“{word_plot}” in A, “{word_plot}” in B) at every depth of the {stack}")
charts.chart(fig, key="compare-cosine", width="stretch")
s = cmp.summary(table)
st.markdown(cmp.input_note(trace_a, word_a, trace_b, word_b, s["input"]))
start = "started as the same static vector" if s["input"] > 1 - 1e-6 else "started from almost the same input vector"
st.markdown(f"After the last layer the cosine is **{s['last']:.3f}** (lowest: {s['min']:.3f}, at {s['min_at']}): "
            f"the two occurrences {start} and became different contextual vectors, each shaped by the words its "
            f"sentence attended to. The dashed line is the mean cosine between “{word_md}” in A and the *other* words "
            "of B, for scale.")
pieces_note = "" if len(word_a.positions) == 1 and len(word_b.positions) == 1 else \
    " A word of several pieces is the mean of its pieces' vectors."
st.caption("cos(u, v) = uᵀv / (|u| |v|): 1 for the same direction, 0 for perpendicular vectors (Chapter 9, eq. 9.1). "
           f"Vectors are rows of the trace tensors named in the table (depth 0 = `embed.{stack}.sum`, the input of "
           f"layer 0; then `{stack}.i.out`, the output of layer i).{pieces_note}")
with st.popover("The numbers, depth by depth", icon=":material/table:", key="compare-numbers"):  # mounted when opened
    st.table(cmp.table_for_display(table))  # a few rows of numbers: a static table, not a data grid to mount
