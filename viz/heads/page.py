"""Heads: what each head does (head scores as layer x head heatmaps; a click opens the head in
Explore), and where a token's information comes from through the layers (rollout, flow).
Scores and maps come from core.analysis; figures from viz.heads.figures.
"""

import streamlit as st

from core import analysis
from core import trace_names as tn
from viz.heads import figures as hv
from viz.figures.model_view import view_sides
from viz.ui import charts, explore_links, models, registry, url_state, url_switches, why_panel, widgets

FLOW_MAX_TOKENS = 48  # flow runs one max-flow per input token; longer inputs show rollout only
ROLLOUT_MAX_TOKENS = 512  # rollout keeps L x n x n float64 and multiplies n x n maps: 30 x 512^2 x 8 B = 63 MB

explore_links.follow("heads")  # a head clicked on the last run opens in Explore

widgets.header("heads")
st.caption("Five standard scores for every self-attention head, read from the attention maps; then how attention "
           "mixes tokens through the layers (rollout and flow, Abnar & Zuidema 2020).")
state = url_state.PageState("heads", fields=("model", "text", "top", "token", "pa", "pa_group", "pa_on"))
TOP_DEFAULT = "induction"

model_name, model, text_col = widgets.model_header(state)
if model is None:
    st.stop()
text_key = state.seeded_key("text", model.examples[0] if model.examples else analysis.DEFAULT_SENTENCE)
with text_col:
    text = widgets.text_box("Sentence", text_key,
                            help="previous-token, first-token and self scores are read on this sentence.")

trace = models.get_trace(model_name, text)
url = dict(model=model_name, text=text)  # what the URL holds so far; the top-heads score and token join below
state.show_messages()
if trace is None:
    state.end_here(**url)
if not any(trace.attention_kinds(s) for s in trace.stacks()):  # token mixers alone: no softmax head to score
    widgets.no_softmax_info(model_name, trace, "Heads")
    state.end_here(**url)


# cache_resource: the results are shared read-only (no copy per hit, as cache_data would make)
@st.cache_resource(max_entries=16, show_spinner=False)
def _head_scores(model_name: str, text: str, _model, _trace):
    return analysis.head_scores(_model, trace=_trace)


@st.cache_resource(max_entries=8, show_spinner=False)
def _repeat_text(model_name: str, stack: str, _model):
    return analysis.repeated_text(_model, stack)


@st.cache_resource(max_entries=32, show_spinner=False)
def _rollout(model_name: str, text: str, stack: str, residual: float, _trace):
    return analysis.rollout(_trace, stack, residual=residual)


@st.cache_resource(max_entries=32, show_spinner=False)
def _flow_row(model_name: str, text: str, stack: str, residual: float, query: int, _trace):
    last = _trace.layers(stack) - 1
    return analysis.flow(_trace, stack, residual=residual, query=query, layers=[last])[last, query]


try:
    with st.spinner("Scoring every head…"):
        scores = _head_scores(model_name, text, model, trace)
except Exception as exc:  # a model the scores cannot run on must not take the page down
    st.error(f"Could not score the heads of {model_name}: {exc}")
    state.end_here(**url)

stacks = trace.stacks()
stack = stacks[0]
if len(stacks) > 1:
    state.keep("heads.stack", st.session_state.get("heads.stack") if st.session_state.get("heads.stack") in stacks
               else stacks[0])
    stack = st.radio("Stack", stacks, key="heads.stack", horizontal=True,
                     format_func=lambda s: f"{s} self-attention")


def _open(chart_key: str) -> None:
    sel = st.session_state.get(chart_key)
    pts = (sel or {}).get("selection", {}).get("points", []) if sel else []
    picked = hv.head_pick(pts[0]) if pts else None
    if picked is not None:
        explore_links.open_next_run("heads", explore_links.explore_params(model_name, text, stack, *picked))


st.subheader("Head scores")
st.caption(f"Rows are layers, columns heads. previous token, first token and self are read on your sentence; induction "
           f"and duplicate token on {analysis.REPEAT_LENGTH} random tokens repeated twice (R = "
           f"{analysis.REPEAT_LENGTH}, seeded). Click a cell to open that head in Explore on your sentence; the top induction and duplicate-token "
           "heads also link to the repeated sequence their score was read on.")
cols = st.columns(3)
for k, score in enumerate(analysis.SCORES):
    key = f"heads-{score}"
    with cols[k % 3]:
        charts.chart(hv.score_heatmap(scores, score, stack), key=key, on_select=lambda key=key: _open(key),
                        selection_mode="points", width="stretch")

sink_scores = hv.learned_sink_scores(trace, stack)
if sink_scores is not None:  # gpt-oss: each head's learned sink, the share of a row that no key owns
    with cols[len(analysis.SCORES) % 3]:
        charts.chart(hv.score_heatmap(sink_scores, hv.LEARNED_SINK, stack, title="learned sink (no key)"),
                     key="heads-learned-sink", on_select=lambda: _open("heads-learned-sink"), selection_mode="points",
                     width="stretch")
        st.caption("Each head's learned sink: the mean share of a row its softmax gives to a logit that no key owns "
                   "(Explore draws it as a column of its own).")

with cols[2]:
    top_key = url_switches.option(state, "top", TOP_DEFAULT, analysis.SCORES)
    score = st.selectbox("Top heads by", analysis.SCORES, key=top_key, format_func=lambda s: s.replace("_", " "))
    url["top"] = url_switches.changed(score, TOP_DEFAULT)
    top = analysis.top_heads(scores[scores["stack"] == stack], score, 5)
    rep = _repeat_text(model_name, stack, model) if score in hv.REPEAT_SCORES else None
    for row in top.itertuples():
        explore_links.link(st, f"layer {row.layer} · head {row.head}: {getattr(row, score):.3f}",
                           explore_links.explore_params(model_name, text, stack, row.layer, row.head))
        if rep is not None and rep["text"] is not None:
            explore_links.link(st, "↳ on the repeated sequence it was scored on",
                               explore_links.explore_params(model_name, rep["text"], stack, row.layer, row.head),
                         help=f"Explore this head on the {2 * rep['r']} random tokens (R = {rep['r']}, repeated "
                              "twice) its score was read on: an induction head's stripe sits one below the "
                              "diagonal of the earlier copy.")
    st.page_link(registry.page("lens").file, label="logit lens: what the heads add to the output",
                 query_params={"model": model_name, "text": text})
    if model.kind in ("decoder", "encoder-decoder"):  # a model with an output to measure
        st.page_link(registry.page("patching").file, label="activation patching: which heads the output needs",
                     query_params={"model": model_name, "text": text, "what": "head"})
    if rep is not None and rep["why"]:
        st.caption(f"The repeated sequence cannot be opened as it was scored: {rep['why']}.")
if model.kind == "decoder":
    st.info("**Induction heads** (Olsson et al. 2022) complete patterns: after [A][B] … [A], they attend from the second "
            "[A] to the token that followed the first one, [B], and help copy it. On a random sequence repeated twice "
            "the only way to predict the second copy is to look back one copy, so such a head puts most of its "
            "attention at position i − R + 1: its induction score is near 1. They need a previous-token head in an "
            "earlier layer, so look for high previous-token scores above them.")
st.subheader("What drives a head's pattern")
st.caption("A head's every score taken apart into what the stream's components wrote at the query and at the key "
           "(core.analysis.pattern_attribution), each cell's terms weighted by the attention it gets: beside an "
           "induction score, which earlier heads its keys read from (K-composition, Olsson et al. 2022). Read on your "
           "sentence; open a top head's repeated sequence above to read it there. Explore shows one cell's terms "
           "(click a cell of the map).")
top_row = top.iloc[0] if len(top) else None
PA_ON = {"text": "your sentence", "repeat": "the repeated random sequence (where induction is scored)"}
pa_on_key = url_switches.option(state, "pa_on", "text", list(PA_ON))
pa_on = st.radio("Read the pattern on", list(PA_ON), key=pa_on_key, horizontal=True, format_func=PA_ON.get)
url["pa_on"] = url_switches.changed(pa_on, "text")
pa_trace = trace
if pa_on == "repeat":
    rep_pa = _repeat_text(model_name, stack, model)
    if rep_pa["text"] is None or not rep_pa["same_ids"]:
        st.info(f"The repeated sequence cannot be read here: {rep_pa['why']}. Reading your sentence instead.")
    else:
        pa_trace = models.get_trace(model_name, rep_pa["text"])
        st.caption(f"On the {2 * rep_pa['r']} random tokens (R = {rep_pa['r']}, repeated twice) the induction score "
                   "was read on.")
if pa_trace is not None:
    url.update(why_panel.pattern_section(state, pa_trace, model_name, stack,
                                         (int(top_row["layer"]), int(top_row["head"])) if top_row is not None
                                         else (0, 0), text=text, on="repeat" if pa_trace is not trace else "text"))
# a closed expander still mounts its children: the data grid is drawn only once it is opened
table_box = st.expander("Every score (table)", key="heads.table", on_change="rerun")
if table_box.open:
    table_box.dataframe(scores[scores["stack"] == stack], hide_index=True, width="stretch")

# ------------------------------------------------------------------ rollout and flow
st.subheader("Attention through the layers")
tokens = trace.tokens(view_sides(stack, "self_attn")[0])
n = len(tokens)
if n > ROLLOUT_MAX_TOKENS:
    st.info(f"Rollout multiplies the layers' {n} × {n} maps and keeps one per layer; it is drawn up to "
            f"{ROLLOUT_MAX_TOKENS} tokens. Shorten the text to see it.")
    state.ignored_if_given("token", f"rollout is drawn up to {ROLLOUT_MAX_TOKENS} tokens; this text has {n}")
    state.end_here(**url)
c = st.columns([2, 1])
default_query = n - 1 if model.kind == "decoder" or stack == "decoder" else min(1, n - 1)
# the token is a number kept across sentences and models: clamped to this sentence's tokens, with a note
token_key = url_state.int_from_url(state, "token", default_query, 0, n - 1, of=f"this sentence's {n} tokens")
query = c[0].selectbox("Token", list(range(n)), key=token_key, format_func=lambda i: f"{i}: {tokens[i]!r}")
url["token"] = url_switches.changed(query, default_query)
state.publish(**url)
state.show_messages()
residual = c[1].slider("Residual weight", 0.0, 1.0, 0.5, 0.05, key="heads.residual",
                       help="A~ = r·I + (1 − r)·A: how much of each layer's input the residual connection carries.")
if trace.mixer_layers(stack):  # rollout multiplies softmax maps; a token mixer's implicit attention is signed
    st.info("**Rollout and flow read softmax attention in every layer**, and layers "
            f"{', '.join(map(str, trace.mixer_layers(stack)))} of {model_name} mix tokens otherwise "
            f"({widgets.MIXER_LABEL.get(widgets.mixer_kind(trace), 'a token mixer')}): their implicit attention is "
            "signed and its rows do not sum to 1, so the product would not be a flow of attention. Explore shows "
            "those layers' maps.")
    st.stop()
st.caption("Rollout multiplies the layers' head-averaged maps A~ (the residual connection mixed in); flow treats them "
           "as a graph with capacities A~ and takes the maximum flow from each input token (Abnar & Zuidema 2020).")
rolled = _rollout(model_name, text, stack, residual, trace)
last = trace.layers(stack) - 1
raw = trace[tn.self_attn(stack, last, "weights")].float().mean(0)[query].numpy()
flowed = None
if n <= FLOW_MAX_TOKENS:
    with st.spinner("Computing attention flow…"):
        flowed = _flow_row(model_name, text, stack, residual, query, trace)
else:
    st.info(f"Flow runs one maximum-flow problem per input token; with {n} tokens it is drawn up to "
            f"{FLOW_MAX_TOKENS} tokens. Rollout is shown for every length.")
charts.chart(hv.side_by_side(raw, rolled[last, query], flowed, tokens, query), key="heads-compare",
                width="stretch")
charts.chart(hv.rollout_heatmap(rolled, tokens, query), key="heads-rollout", width="stretch")
